"""The root helper as a real process on a fake amdgpu tree, asked by real clients under real uids (issue 22)."""

from __future__ import annotations

import grp
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from tests.cli_helpers import REPO
from tests.helper.conftest import HELLO, HelperProcess, as_user, client, needs_root, open_connection, wait_until
from tuner.backends.simulated import SimulatedBackend

pytestmark = needs_root
CARD = "0000:10:00.0"  # the fake RDNA4 card: OD_RANGE -200..0 mV in 5 mV steps


def reply(line: str) -> dict:
    return json.loads(line)


def set_request(value: int, **extra) -> dict:
    return {"op": "set", "card": CARD, "value": value, **extra}


def test_socket_is_0660_root_group_and_outsiders_cannot_ask(accounts, helpers):
    group = accounts.group()
    helper = helpers(group)
    st = os.stat(helper.socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
    assert (st.st_uid, st.st_gid) == (0, grp.getgrnam(group).gr_gid)
    # a user outside the group cannot even connect (the socket's mode)
    assert client(None, helper.socket, HELLO) == ["REFUSED EACCES"]
    # and were the socket opened to everyone, the helper's own check (SO_PEERCRED) refuses with one line
    os.chmod(helper.socket, 0o666)
    [line] = client(None, helper.socket, HELLO)
    refused = reply(line)
    assert refused["code"] == "not-allowed" and "uid 65534" in refused["error"] and group in refused["remedy"]
    assert helper.knob(CARD)["current"] == 0


def test_a_member_sets_within_od_range_and_is_refused_outside_it_or_with_a_path(accounts, helpers):
    group = accounts.group()
    member = accounts.user(group)
    helper = helpers(group)
    out = client(member, helper.socket, HELLO, set_request(-50, lease_s=60), set_request(-500),
                 {**set_request(-40), "path": "/sys/class/drm/card0/device/pp_od_clk_voltage"},
                 {"op": "confirm", "card": CARD})
    hello, accepted, outside, with_path, confirmed = (reply(line) for line in out)
    assert hello["result"]["uid"] == member.uid
    assert accepted["ok"] and accepted["result"]["current"] == -50
    assert outside["code"] == "out-of-range" and "-200..+0 mV" in outside["error"]
    assert with_path["code"] == "bad-request" and "path" in with_path["error"]
    assert confirmed["ok"]
    assert helper.knob(CARD)["current"] == -50  # confirmed: kept after the client left
    log = [json.loads(line) for line in (helper.state_dir / "log.jsonl").read_text().splitlines()]
    assert (log[0]["event"], log[0]["value"], log[0]["uid"]) == ("set", -50, member.uid)


def test_kill_9_before_confirm_puts_the_previous_value_back_and_a_second_client_is_busy(accounts, helpers):
    group = accounts.group()
    first, second = accounts.user(group), accounts.user(group)
    helper = helpers(group)
    helper.ask(set_request(-20, lease_s=60), {"op": "confirm", "card": CARD})  # the previous value: -20
    holder = as_user(first, "tests.helper.client", str(helper.socket), json.dumps(HELLO),
                     json.dumps(set_request(-50, lease_s=600)), "@hold")
    assert holder.stdout is not None
    assert json.loads(holder.stdout.readline())["ok"] and json.loads(holder.stdout.readline())["ok"]
    assert holder.stdout.readline().strip() == "HOLDING"
    assert helper.knob(CARD)["current"] == -50
    # a second client while the first holds its lease: busy, naming the holder's uid and pid
    [_, busy] = (reply(line) for line in client(second, helper.socket, HELLO, set_request(-30)))
    assert busy["code"] == "busy" and busy["holder"]["uid"] == first.uid
    assert busy["holder"]["pid"] == holder.pid
    assert f"uid {first.uid} pid {holder.pid}" in busy["error"]
    # kill -9 before confirm: the lease is 600 s, so only the closed connection can bring -20 back
    killed_at = time.monotonic()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    wait_until(lambda: helper.knob(CARD)["current"] == -20, 10, "the previous value back")
    print(f"previous value back {time.monotonic() - killed_at:.3f} s after SIGKILL")  # the report's figure
    assert "went away unconfirmed" in helper.log.read_text()


def test_sigterm_puts_back_every_unconfirmed_change(accounts, helpers):
    group = accounts.group()
    helper = helpers(group, fake_amd=False)
    sock = open_connection(helper.socket, HELLO, {"op": "set", "card": "sim0", "value": -60, "lease_s": 600})
    assert helper.stop(signal.SIGTERM) == 0
    sock.close()
    assert SimulatedBackend(state_path=helper.state_dir / "simulated" / "seed-0.json").knob("sim0").current == 0
    assert "every unconfirmed change was put back" in helper.log.read_text()


def test_bad_requests_get_one_line_and_a_code_and_the_helper_serves_on(accounts, helpers):
    group = accounts.group()
    member = accounts.user(group)
    helper = helpers(group)
    out = client(member, helper.socket, {"op": "read_knob", "card": CARD}, HELLO, "{not json", '{"op": "format"}',
                 "x" * 10_000, {"op": "set", "card": "0000:99:00.0", "value": -50}, set_request(-201),
                 set_request(-5, allow_overvolt=True, lease_s=1e9), {"op": "read_knob", "card": "../../etc/x"},
                 {"op": "hello", "version": 99}, {"op": "read_knob", "card": CARD})
    codes = [reply(line).get("code") for line in out]
    assert codes == ["hello-first", None, "bad-json", "unknown-request", "line-too-long", "unknown-card",
                     "out-of-range", "bad-request", "bad-request", "version", None]
    assert "-200..+0 mV" in reply(out[6])["error"]
    assert reply(out[-1])["result"]["current"] == 0  # nothing changed, and it still answers


def test_silent_and_flooding_clients_are_cut_off_while_others_are_served(accounts, helpers):
    group = accounts.group()
    helper = helpers(group)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(helper.socket))
    flood = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    flood.connect(str(helper.socket))
    flood.settimeout(120)
    cut_off = threading.Event()

    def keep_asking_never_reading() -> None:
        request = (json.dumps({"op": "read_knob", "card": CARD}) + "\n").encode() * 100
        try:
            flood.sendall((json.dumps(HELLO) + "\n").encode())
            while True:
                flood.sendall(request)
        except OSError:  # the helper hung up on it
            cut_off.set()

    threading.Thread(target=keep_asking_never_reading, daemon=True).start()
    served = [helper.knob(CARD)["current"] for _ in range(20)]  # another client is served meanwhile
    assert served == [0] * 20
    silent.settimeout(30)
    assert json.loads(silent.makefile("rb").readline())["code"] == "idle"
    wait_until(cut_off.is_set, 60, "the flooding client to be cut off")
    assert helper.knob(CARD)["current"] == 0 and helper.proc.poll() is None


def test_socket_paths_that_are_not_a_stale_socket_are_refused(accounts, helpers, world):
    group = accounts.group()
    helper = HelperProcess(world, group, fake_amd=False)
    helper.socket.parent.mkdir(mode=0o755)
    for make, what in ((lambda p: p.write_text("mine"), "is a regular file"),
                       (lambda p: p.symlink_to("/etc/passwd"), "is a symlink")):
        make(helper.socket)
        proc = subprocess.run([sys.executable, "-m", "tuner.helper", "--simulate", "--socket", str(helper.socket),
                               "--group", group, "--state-dir", str(helper.state_dir)], capture_output=True, text=True,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
        assert proc.returncode == 2 and what in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert helper.socket.is_symlink() or helper.socket.read_text() == "mine"
        helper.socket.unlink()
    # a stale socket (its helper died) is replaced
    first = helpers(group, fake_amd=False)
    first.stop(signal.SIGKILL)
    assert stat.S_ISSOCK(os.lstat(first.socket).st_mode)
    second = helpers(group, fake_amd=False)
    assert second.ask({"op": "list"})[0]["ok"]


def test_kernel_events_stream_only_the_lines_naming_the_card_or_no_card(accounts, helpers, world):
    from tuner.backends.helper_client import HelperBackend

    group = accounts.group()
    fifo = world / "kmsg"
    os.mkfifo(fifo)
    helper = helpers(group, extra=("--kmsg", str(fifo)))
    backend = HelperBackend.connect(helper.socket)
    try:
        source = backend.kernel_log_source([CARD])
        assert source is not None
        lines, close = source
        writer = wait_until(lambda: _open_writer(fifo), 30, "the helper to read the kernel log")
        os.write(writer, b"6,100,1000,-;amdgpu 0000:11:00.0: amdgpu: GPU reset begin!\n"  # another card
                         b"6,101,1001,-;usb 1-1: new high-speed USB device number 3\n"  # not a GPU line
                         b"3,102,1002,-;amdgpu 0000:10:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=7\n"
                         b" SUBSYSTEM=pci\n"  # a continuation line of the record above
                         b"3,103,1003,-;[drm] GPU reset succeeded, trying to resume\n")  # a failure naming no card
        received = iter(lines)
        assert next(received) == "amdgpu 0000:10:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=7"
        assert next(received) == "[drm] GPU reset succeeded, trying to resume"
        close()
        os.close(writer)
    finally:
        backend.close()


def test_a_helper_that_cannot_read_the_kernel_log_gives_no_stream_so_the_tuner_reads_its_own(tmp_path):
    """`kernel_log_source` is None "when the helper cannot read the kernel log", so a trial falls back to the
    user's own journalctl (tuning/trial.py). The helper acknowledged the stream before it opened the log, so the
    client got a stream that ended at once with the reason unread: the trial watched nothing (the watcher said only
    "its stream ended") where the user could have read the log. In-process, with a --kmsg that does not exist."""
    from tuner.backends.helper_client import HelperBackend
    from tuner.helper import server as helper_server
    from tuner.helper.service import HelperService
    from tuner.helper.state import MachineState

    state = MachineState(tmp_path / "state")
    state.create()
    service = HelperService(SimulatedBackend(state_path=tmp_path / "sim.json"), state, group="root",
                            log=lambda line: None)
    listener, lock_fd = helper_server.bind_listener(tmp_path / "run" / "h.sock", os.getgid())
    server = helper_server.HelperServer(service, listener, os.getgid(), kmsg_path=tmp_path / "no-kmsg")
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        backend = HelperBackend.connect(tmp_path / "run" / "h.sock")
        try:
            assert backend.kernel_log_source(["sim0"]) is None
        finally:
            backend.close()
    finally:
        server.stop.set()
        thread.join(timeout=30)
        listener.close()
        os.close(lock_fd)


def _open_writer(path) -> int | None:
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: nobody reads it yet
        return None


def test_under_socket_activation_it_serves_the_socket_it_inherits(accounts, world):
    """systemd's LISTEN_PID/LISTEN_FDS protocol, by hand: the listening socket as fd 3, the path left alone."""
    group = accounts.group()
    path = world / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    command = (f"LISTEN_PID=$$ LISTEN_FDS=1 exec {sys.executable} -m tuner.helper --simulate --group {group} "
               f"--state-dir {world / 'state'} --socket {world / 'unused.sock'}")
    proc = subprocess.Popen(["sh", "-c", command], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            preexec_fn=lambda: os.dup2(listener.fileno(), 3), pass_fds=(3, listener.fileno()),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    listener.close()
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        sock.sendall((json.dumps(HELLO) + "\n").encode())
        assert json.loads(sock.makefile("rb").readline())["result"]["simulated"] is True
        sock.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "the socket systemd passed" in out
    assert stat.S_ISSOCK(os.lstat(path).st_mode) and not (world / "unused.sock").exists()


def test_a_client_that_never_says_hello_is_cut_off_at_the_hello_timeout_whatever_else_it_sends(tmp_path,
                                                                                              monkeypatch):
    """docs/helper.md: "no `hello` within 5 s ... closes the connection". Any line (a blank one, a request refused
    as hello-first) used to switch the connection to the 30 s idle timeout, so a client sending a line now and then
    held a connection (of 64, 16 per user) without ever saying hello. In-process, with the timeouts shortened."""
    from tuner.helper import server as helper_server
    from tuner.helper.service import HelperService
    from tuner.helper.state import MachineState

    monkeypatch.setattr(helper_server, "HELLO_TIMEOUT_S", 0.5)
    monkeypatch.setattr(helper_server, "IDLE_TIMEOUT_S", 3600.0)
    state = MachineState(tmp_path / "state")
    state.create()
    service = HelperService(SimulatedBackend(state_path=tmp_path / "sim.json"), state, group="root",
                            log=lambda line: None)
    listener, lock_fd = helper_server.bind_listener(tmp_path / "run" / "h.sock", os.getgid())
    server = helper_server.HelperServer(service, listener, os.getgid())
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        for first in (b"\n", (json.dumps({"op": "read_knob", "card": "sim0"}) + "\n").encode()):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(tmp_path / "run" / "h.sock"))
            sock.sendall(first)
            sock.settimeout(20)  # a generous bound; the helper hangs up after 0.5 s
            codes = [json.loads(line)["code"] for line in sock.makefile("rb")]
            assert codes[-1] == "idle", codes
            sock.close()
    finally:
        server.stop.set()
        thread.join(timeout=30)
        listener.close()
        os.close(lock_fd)


def _helper_main(capsys, *args: str) -> tuple[int, str]:
    """`tuner-helper --simulate ARGS` in this process; its exit code and stderr."""
    from tuner.helper.cli import main

    code = main(["--simulate", "--group", grp.getgrgid(os.getgid()).gr_name, *args])
    return code, capsys.readouterr().err


def test_a_state_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    """Bad argv is one line with a documented exit code: a --state-dir naming a regular file (or a link to one)
    was a FileExistsError traceback from mkdir."""
    (tmp_path / "file").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    for state_dir in ("file", "link"):
        code, err = _helper_main(capsys, "--state-dir", str(tmp_path / state_dir), "--socket", str(tmp_path / "h.sock"))
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert str(tmp_path / state_dir) in err
    assert (tmp_path / "file").read_text() == "mine"


def test_a_socket_path_that_cannot_be_bound_is_one_line_and_exit_2(tmp_path, capsys):
    """Bad argv is one line with a documented exit code: a --socket under a regular file was a FileExistsError
    traceback, and a path near the 107-byte limit of a unix socket (the temporary name it is bound under first is
    longer) was `OSError: AF_UNIX path too long` with a traceback."""
    (tmp_path / "file").write_text("mine")
    padded = tmp_path / ("d" * (100 - len(str(tmp_path)) - len("/h.sock") - 1))
    padded.mkdir()
    for socket_path in (tmp_path / "file" / "h.sock", padded / "h.sock"):
        assert len(str(socket_path)) <= 107
        code, err = _helper_main(capsys, "--state-dir", str(tmp_path / "state"), "--socket", str(socket_path))
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert str(socket_path.parent) in err
    assert (tmp_path / "file").read_text() == "mine"
    assert not [p for p in padded.iterdir() if p.name == "h.sock" or p.name.endswith(".tmp")]


def test_a_bad_option_is_one_line_and_exit_2(capsys):
    """Bad argv is one line (non-negotiable 2), as `tuner`'s own parser makes it: argparse's default printed the
    whole usage block (six lines) before its error."""
    from tuner.helper.cli import main

    for argv in (["--bogus"], ["--sim-gpus", "x"], ["--sim-kind", "intel"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith("tuner-helper: error: ") and "--help" in err


def test_socket_activation_variables_naming_no_socket_are_one_line_and_exit_2(tmp_path):
    """Bad env is one line with a documented exit code: LISTEN_PID/LISTEN_FDS set (by hand, or leaked from a
    parent) while fd 3 is a regular file, or closed, was `OSError: [Errno 88] Socket operation on non-socket` (or
    EBADF) with a traceback."""
    for fd3 in ("3</etc/hostname", "3<&-"):
        command = (f"LISTEN_PID=$$ LISTEN_FDS=1 exec {sys.executable} -m tuner.helper --simulate --group "
                   f"{grp.getgrgid(os.getgid()).gr_name} --state-dir {tmp_path / 'state'} --socket "
                   f"{tmp_path / 'h.sock'} {fd3}")
        proc = subprocess.run(["sh", "-c", command], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "LISTEN_FDS" in proc.stderr and "Traceback" not in proc.stderr


def test_a_state_dir_below_a_directory_another_user_can_change_is_refused(tmp_path, capsys):
    """The state directory must be root's and not writable by others; a directory above it that another user
    owns lets that user rename it away and put their own in its place (a log.jsonl there that is a link, a
    trials.json of their making), read and appended to by root. It was accepted as long as the last directory
    was root's; the socket's directory is refused for the same reason."""
    parent = tmp_path / "home/alice"
    (parent / "state").mkdir(parents=True)
    os.chown(parent, 65534, 65534)
    code, err = _helper_main(capsys, "--state-dir", str(parent / "state"), "--socket", str(tmp_path / "h.sock"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(parent) in err, err
    assert not (tmp_path / "h.sock").exists()


def test_a_simulator_option_without_simulate_is_refused_before_anything_is_made(tmp_path, capsys):
    """`tuner-helper --sim-vmin -52` with --simulate forgotten served the real cards as root, the option silently
    dropped; `tuner` refuses the same mistake (tuner.backends.check_no_simulator_options). Refused first: no
    state directory, no socket."""
    from tuner.helper.cli import main

    for extra in (["--sim-vmin", "-52"], ["--sim-gpus", "2"], ["--sim-nondeterministic"],
                  ["--sim-contention-after", "5"]):
        code = main([*extra, "--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "h.sock")])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert extra[0] in err and "--simulate" in err
        assert not (tmp_path / "state").exists() and not (tmp_path / "h.sock").exists()


@pytest.mark.parametrize("sudo_uid", ["abc", "1000x", "\u00b2", "-1 "])
def test_a_sudo_uid_that_is_not_a_uid_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, sudo_uid):
    """Bad env is one line with a documented exit code: the helper imports the sudo user's own state at its start,
    and read SUDO_UID with int(), so a value that is not a whole number was a ValueError traceback (after the state
    directory was made and the cards' leftovers put back). Refused first, as the other bad input is."""
    monkeypatch.setenv("SUDO_UID", sudo_uid)
    code, err = _helper_main(capsys, "--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "h.sock"))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "SUDO_UID" in err
    assert not (tmp_path / "state").exists() and not (tmp_path / "h.sock").exists()


def test_a_client_whose_command_line_cannot_be_read_does_not_stall_the_others(tmp_path, monkeypatch):
    """The peer's command line comes from /proc/<pid>/cmdline, and that read can block: the kernel copies it out
    of the process's memory under its mmap lock (fs/proc/base.c get_mm_cmdline -> access_remote_vm ->
    mmap_read_lock_killable), which a process stuck in a page fault on a hung FUSE or NFS mapping, or a
    hostile one that arranges it, keeps taken. The helper read it on its accept thread, so one such client
    stopped every other client from being let in. The fake blocks the first read until the test ends."""
    from tuner.helper import peer as helper_peer
    from tuner.helper import server as helper_server
    from tuner.helper.service import HelperService
    from tuner.helper.state import MachineState

    first_read, release = threading.Event(), threading.Event()
    real_command_of = helper_peer.command_of

    def command_of(pid: int) -> str:
        if not first_read.is_set():
            first_read.set()
            release.wait()  # the blocked read of the stalled client
        return real_command_of(pid)

    monkeypatch.setattr(helper_peer, "command_of", command_of)
    state = MachineState(tmp_path / "state")
    state.create()
    service = HelperService(SimulatedBackend(state_path=tmp_path / "sim.json"), state, group="root",
                            log=lambda line: None)
    path = tmp_path / "run" / "h.sock"
    listener, lock_fd = helper_server.bind_listener(path, os.getgid())
    server = helper_server.HelperServer(service, listener, os.getgid())
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        stalled.connect(str(path))
        wait_until(first_read.is_set, what="the stalled client's command line is being read")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
            other.connect(str(path))
            other.sendall((json.dumps(HELLO) + "\n").encode())
            other.settimeout(20)  # a generous bound; answered at once unless the accept thread is stuck
            assert json.loads(other.makefile("rb").readline())["ok"] is True
    finally:
        release.set()
        stalled.close()
        server.stop.set()
        thread.join(timeout=30)
        listener.close()
        os.close(lock_fd)
