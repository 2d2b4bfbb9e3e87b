"""The helper's rules without a socket: the schema, the re-checks, leases, and reading a user's files as root."""

from __future__ import annotations

import doctest
import importlib
import json
import os
import pwd
import threading
import typing

import msgspec
import pytest

from tests.polling import wait_until
from tuner.backends.helper_client import _ERRORS
from tuner.backends.simulated import SimulatedBackend
from tuner.core.card_lock import CardBusy
from tuner.core.errors import DamagedState, NotApplied, OutOfRange, TunerError
from tuner.helper import schema as s
from tuner.helper.peer import Peer
from tuner.helper.service import Client, HelperService, Refused
from tuner.helper.state import MachineState
from tuner.helper.user_import import read_user_state


@pytest.mark.parametrize("name", ["tuner.helper.kmsg", "tuner.helper.state", "tuner.core.unsafe_rule"])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


REQUESTS = typing.get_args(s.Request)


def minimal(kind: type) -> dict:
    """The smallest valid request of this kind."""
    values = {"card": "sim0", "value": -5, "setting": -5, "phase": "coarse", "active": True, "cards": ["sim0"]}
    fields = {f.name for f in msgspec.structs.fields(kind) if f.required}
    return {"op": kind.__struct_config__.tag, **{name: values[name] for name in fields}}


@pytest.mark.parametrize("kind", REQUESTS, ids=lambda k: k.__struct_config__.tag)
def test_every_request_decodes_and_refuses_a_field_it_does_not_declare(kind):
    request = minimal(kind)
    assert isinstance(s.decode_request(json.dumps(request).encode()), kind)
    for extra in ({"path": "/sys/class/drm/card0/device/pp_od_clk_voltage"}, {"file": "x"}):
        with pytest.raises(s.BadRequest) as refused:
            s.decode_request(json.dumps({**request, **extra}).encode())
        assert refused.value.code == "bad-request"


@pytest.mark.parametrize("card", ["../../etc/passwd", "/dev/kmsg", "a/b", "", ".hidden", "x" * 65])
def test_a_card_is_never_a_path(card):
    with pytest.raises(s.BadRequest):
        s.decode_request(json.dumps({"op": "read_knob", "card": card}).encode())


@pytest.mark.parametrize(("request_", "field"), [
    ({"op": "trial_begin", "card": "sim0", "setting": -5, "phase": "coarse\n"}, "phase"),
    ({"op": "trial_begin", "card": "sim0", "setting": -5, "phase": "coarse", "session": "s1\n"}, "session"),
    ({"op": "trial_end", "card": "sim0", "unsafe": {"kind": "hang\n", "reason": "r"}}, "kind"),
    ({"op": "read_knob", "card": "sim0\n"}, "card"),
])
def test_a_word_from_the_wire_ends_where_its_pattern_does_not_before_a_newline(request_, field):
    """Python's `$` also matches before a final newline (msgspec checks a pattern with re.search): 'coarse\n' was
    a Word, so a client's phase split the helper's audit line in two ('trial_begin sim0 setting=-5 phase=coarse'
    and, alone on the next line, 'by uid ...'), and an unsafe kind with a newline reached the machine's list that
    other users read. The patterns are anchored at the very end (\\Z), as journal_schema's are."""
    with pytest.raises(s.BadRequest) as refused:
        s.decode_request(json.dumps(request_).encode())
    assert refused.value.code == "bad-request" and field in str(refused.value)


def test_every_code_the_client_maps_is_declared():
    assert set(_ERRORS) <= set(s.CODES)


# --- the service, in-process --------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def peer(uid: int, pid: int = 4242) -> Peer:
    return Peer(pid=pid, uid=uid, gid=uid, groups=(), command=f"tuner set (uid {uid})")


@pytest.fixture
def mallory_home(tmp_path, monkeypatch):
    """A member's home directory, as the helper finds it (pwd) for the uid that says hello: its state is imported."""
    from tuner.helper import service as service_module

    home = tmp_path / "mallory"
    monkeypatch.setattr(service_module.pwd, "getpwuid", lambda uid: type("pw", (), {"pw_dir": str(home)}))
    return home


@pytest.fixture
def service(tmp_path):
    clock = Clock()
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    state = MachineState(tmp_path / "state")
    state.create()
    svc = HelperService(backend, state, group="tuner", clock=clock, log=lambda line: None)
    svc.clock_ = clock
    return svc


def ask(service: HelperService, who: Client, request: s.Request):
    return service.handle(who, request)


def test_a_lease_that_runs_out_puts_the_previous_value_back_and_the_next_heartbeat_says_so(service):
    alice = Client(1, peer(1000))
    ask(service, alice, s.Set(card="sim0", value=-20, lease_s=5))
    ask(service, alice, s.Confirm(card="sim0"))
    ask(service, alice, s.Set(card="sim0", value=-50, lease_s=5))
    service.clock_.now += 4
    ask(service, alice, s.Heartbeat())  # renewed: 5 s from now
    service.clock_.now += 4
    service.expire_leases()
    assert service.backend.knob("sim0").current == -50
    service.clock_.now += 2
    service.expire_leases()
    assert service.backend.knob("sim0").current == -20
    [lost] = ask(service, alice, s.Heartbeat()).lost
    assert (lost.card, lost.value, lost.restored) == ("sim0", -50, -20) and "lease" in lost.reason
    # the card is free again: another client may write
    ask(service, Client(2, peer(1001)), s.Set(card="sim0", value=-10))


def test_a_clients_revert_to_the_overvolt_it_found_is_not_refused_as_a_new_overvolt(tmp_path):
    """The card held -15 MHz (an overvolt, another tool's) when this connection set +60: its revert puts back what
    the card held, which Backend.revert never refuses as a new overvolt, and the lease would put back anyway. The
    helper refused it (`overvolt-not-allowed`), so `tuner set`'s revert failed and the card stayed at +60."""
    nvidia = HelperService(SimulatedBackend(kind="nvidia", state_path=tmp_path / "nv.json"),
                           MachineState(tmp_path / "nv-state"), group="tuner", log=lambda line: None)
    nvidia.state.create()
    nvidia.backend.apply("sim0", -15, allow_overvolt=True)  # another tool's overvolt, before this connection
    alice = Client(1, peer(1000))
    ask(nvidia, alice, s.Set(card="sim0", value=60, lease_s=5))
    assert ask(nvidia, alice, s.Set(card="sim0", value=-15, lease_s=5, allow_overvolt=True, revert=True)).current \
        == -15
    assert nvidia.book.pending == {}
    ask(nvidia, alice, s.Set(card="sim0", value=60, lease_s=5))
    with pytest.raises(Refused) as refused:  # a value the change did not find is still refused, revert or not
        ask(nvidia, alice, s.Set(card="sim0", value=-30, lease_s=5, allow_overvolt=True, revert=True))
    assert refused.value.code == "overvolt-not-allowed"


def test_a_second_set_that_fails_leaves_the_record_at_the_value_the_card_holds(service, monkeypatch):
    """A connection's second unconfirmed set that the backend refused (its own restore put the first one back)
    kept the refused value as the change: the writes journal, the revert line of the audit log and the client's
    lost change named -50 mV, a value the card never held (putting it back used the right previous value)."""
    alice = Client(1, peer(1000))
    ask(service, alice, s.Set(card="sim0", value=-20, lease_s=5))
    real_apply = service.backend.apply

    def refused(card, value, **kw):  # the driver read back another value; the backend put -20 back
        raise NotApplied(f"{card}: wrote {value:+d} mV but the card reads back -30 mV; restored -20 mV")

    monkeypatch.setattr(service.backend, "apply", refused)
    with pytest.raises(NotApplied):
        ask(service, alice, s.Set(card="sim0", value=-50, lease_s=5))
    monkeypatch.setattr(service.backend, "apply", real_apply)
    assert service.backend.knob("sim0").current == -20
    assert service.state.writes()[service.keys["sim0"]].value == -20
    service.clock_.now += 6
    service.expire_leases()
    assert service.backend.knob("sim0").current == 0
    [lost] = ask(service, alice, s.Heartbeat()).lost
    assert (lost.value, lost.restored) == (-20, 0)
    [revert] = [json.loads(line) for line in service.state.log_path.read_text().splitlines()
                if json.loads(line)["event"] == "revert"]
    assert revert["value"] == -20


def test_one_writer_per_card_names_the_holder_and_a_forced_reset_takes_it_back(service):
    alice, bob = Client(1, peer(1000, pid=11)), Client(2, peer(1001, pid=22))
    ask(service, alice, s.Claim(card="sim0", purpose="auto-bisect of sim0"))
    for request in (s.Set(card="sim0", value=-10), s.TrialBegin(card="sim0", setting=-10, phase="coarse"),
                    s.Reset(card="sim0"), s.Claim(card="sim0")):
        with pytest.raises(CardBusy, match=r"uid 1000 pid 11 \(auto-bisect of sim0\)"):
            ask(service, bob, request)
    ask(service, alice, s.Set(card="sim0", value=-30))
    assert ask(service, bob, s.Reset(card="sim0", force=True)).current == 0
    [lost] = ask(service, alice, s.Heartbeat()).lost
    assert "--force" in lost.reason
    ask(service, bob, s.Set(card="sim0", value=-10))


def test_every_write_is_rechecked_whatever_the_client_checked(service, tmp_path):
    alice = Client(1, peer(1000))
    with pytest.raises(OutOfRange, match="step"):
        ask(service, alice, s.Set(card="sim0", value=-52))
    with pytest.raises(OutOfRange, match="outside"):
        ask(service, alice, s.Set(card="sim0", value=-500))
    # the NVIDIA-style card: a clock offset below stock is the overvolting side, inside its range
    nvidia = HelperService(SimulatedBackend(kind="nvidia", state_path=tmp_path / "nv.json"),
                           MachineState(tmp_path / "nv-state"), group="tuner", log=lambda line: None)
    with pytest.raises(OutOfRange, match="overvolt"):
        ask(nvidia, alice, s.Set(card="sim0", value=-15))
    with pytest.raises(Refused) as refused:  # asking is not enough: the helper's config must allow it too
        ask(nvidia, alice, s.Set(card="sim0", value=-15, allow_overvolt=True))
    assert refused.value.code == "overvolt-not-allowed"
    nvidia.allow_overvolt = True
    assert ask(nvidia, alice, s.Set(card="sim0", value=-15, allow_overvolt=True)).current == -15
    assert service.backend.knob("sim0").current == 0


def test_a_trial_that_failed_hard_goes_on_the_machine_list_and_blocks_that_value_and_beyond(service):
    alice, bob = Client(1, peer(1000)), Client(2, peer(1001))
    ask(service, alice, s.TrialBegin(card="sim0", setting=-60, phase="coarse", session="s"))
    ask(service, alice, s.Set(card="sim0", value=-60))
    ask(service, alice, s.Reset(card="sim0"))
    ask(service, alice, s.TrialEnd(card="sim0", unsafe=s.UnsafeMark(kind="hang", reason="the engine hung")))
    for value in (-60, -70):
        with pytest.raises(Refused) as refused:
            ask(service, bob, s.Set(card="sim0", value=value))
        assert refused.value.code == "unsafe" and "hang" in refused.value.message
    ask(service, bob, s.Set(card="sim0", value=-55))
    removed = ask(service, bob, s.UnsafeClear(card="sim0", setting=-60))
    assert [e.setting for e in removed] == [-60]


def test_a_damaged_safety_file_refuses_writes_and_names_it(service):
    key = service.keys["sim0"]
    service.state.unsafe_path(key).write_text('{"setting": "-40"}\n')
    with pytest.raises(DamagedState, match=key):
        ask(service, Client(1, peer(1000)), s.Set(card="sim0", value=-10))
    assert service.backend.knob("sim0").current == 0


def test_a_trial_end_needs_this_connections_open_trial(service):
    with pytest.raises(Refused) as refused:
        ask(service, Client(1, peer(1000)), s.TrialEnd(card="sim0"))
    assert refused.value.code == "no-trial"


# --- reading a user's files as root --------------------------------------------------------------------------------
def test_a_users_state_is_read_without_following_links_or_foreign_files(tmp_path):
    home = tmp_path / "home"
    unsafe = home / ".local/state/tuner/unsafe"
    unsafe.mkdir(parents=True)
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"setting": -99, "unit": "mV"}) + "\n")
    (unsafe / "link.jsonl").symlink_to(secret)
    (unsafe / "sim0.jsonl").write_text(json.dumps({"setting": -40, "unit": "mV", "device": "sim0"}) + "\n")
    fifo = unsafe / "fifo.jsonl"
    os.mkfifo(fifo)  # must not hang the helper
    found = read_user_state(home, os.getuid())
    assert [e.setting for e in found.unsafe] == [-40]
    assert any("link.jsonl" in p for p in found.problems) and any("fifo.jsonl" in p for p in found.problems)
    # a file of another user in that directory is not theirs to hand the helper (root's own files are: an old
    # `sudo tuner` may have left them)
    if os.geteuid() == 0:
        os.chown(unsafe / "sim0.jsonl", 4321, 4321)
        foreign = read_user_state(home, 1000)
        assert foreign.unsafe == [] and any("sim0.jsonl" in p for p in foreign.problems)
    # a linked directory in the path is not followed either
    other = tmp_path / "elsewhere"
    (other / "unsafe").mkdir(parents=True)
    (other / "unsafe" / "sim0.jsonl").write_text(json.dumps({"setting": -77}) + "\n")
    linked = tmp_path / "home2"
    (linked / ".local/state").mkdir(parents=True)
    (linked / ".local/state/tuner").symlink_to(other)
    assert read_user_state(linked, os.getuid()).unsafe == []


def test_a_users_state_directory_that_cannot_be_opened_is_reported_not_skipped_in_silence(tmp_path):
    """A skipped file gets a line in the helper's log; a whole `journal` or `unsafe` directory that could not be
    opened (a link, a file, unreadable) was skipped with none, and every entry in it with it. A missing one is
    simply none to import."""
    home = tmp_path / "home"
    base = home / ".local/state/tuner"
    base.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "sim0.jsonl").write_text(json.dumps({"setting": -40, "device": "sim0"}) + "\n")
    (base / "unsafe").symlink_to(elsewhere)
    (base / "journal").write_text("not a directory")
    found = read_user_state(home, os.getuid())
    assert found.unsafe == []
    assert any(f"{base}/unsafe" in p for p in found.problems), found.problems
    assert any(f"{base}/journal" in p for p in found.problems), found.problems
    (base / "unsafe").unlink()
    (base / "journal").unlink()
    assert read_user_state(home, os.getuid()).problems == []


@pytest.mark.parametrize("part", [".local", ".local/state", ".local/state/tuner"])
def test_a_users_state_directory_above_the_lists_that_cannot_be_opened_is_reported_too(tmp_path, part):
    """The rule above holds for every directory on the way: a `~/.local/state/tuner` (or `.local`) that is a link
    (state kept on another disk) or a file is not followed, and every list and journal below it was skipped with no
    line in the helper's log, as if the user had none."""
    home = tmp_path / "home"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "unsafe").mkdir(parents=True)
    (elsewhere / "unsafe" / "sim0.jsonl").write_text(json.dumps({"setting": -40, "device": "sim0"}) + "\n")
    (home / part).parent.mkdir(parents=True)
    (home / part).symlink_to(elsewhere)
    found = read_user_state(home, os.getuid())
    assert found.unsafe == []
    assert any(f"{home / part}" in p for p in found.problems), found.problems
    (home / part).unlink()
    assert read_user_state(home, os.getuid()).problems == []


def test_a_users_directory_of_many_files_is_listed_only_to_the_cap(tmp_path, monkeypatch):
    """`os.listdir` listed the whole directory before the cap was applied: a user directory of millions of entries
    was read in full by root at every hello (memory and time), only to keep the first MAX_FILES."""
    from tuner.helper import user_import

    monkeypatch.setattr(user_import, "MAX_FILES", 3)
    unsafe = tmp_path / "home/.local/state/tuner/unsafe"
    unsafe.mkdir(parents=True)
    for n in range(53):
        (unsafe / f"card{n:02}.jsonl").write_text(json.dumps({"setting": -n, "device": "sim0"}) + "\n")
    listed: list[str] = []
    real_scandir, real_listdir = os.scandir, os.listdir

    class Counted:  # os.scandir's iterator, counting each entry handed out
        def __init__(self, entries):
            self.entries = entries

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.entries.close()

        def __iter__(self):
            return self

        def __next__(self):
            entry = next(self.entries)
            listed.append(entry.name)
            return entry

        def close(self):
            self.entries.close()

    monkeypatch.setattr(user_import.os, "scandir", lambda path=".": Counted(real_scandir(path)))
    monkeypatch.setattr(user_import.os, "listdir", lambda path=".": listed.extend(real_listdir(path)) or
                        real_listdir(path))
    found = read_user_state(tmp_path / "home", os.getuid())
    assert len(listed) <= 3 + 1, f"{len(listed)} entries listed for a cap of 3"
    assert len(found.unsafe) == 3 and any("only 3 read" in p for p in found.problems), found.problems


def test_one_import_holds_a_bounded_number_of_a_members_lines_however_many_files_they_write(tmp_path):
    """Each hello imports the member's own files as root: up to MAX_FILES unsafe files of MAX_FILE_BYTES each, every
    valid line held before the merge. A line of 14 bytes (`{"setting":1}`) is a Python object of ~180 bytes: 256
    files of 1 MiB were ~19 million lines, over 3 GiB of root's memory at every hello (16 at once per uid). What
    one import reads of a member's unsafe lines, all files together, is bounded; the rest stay in their files,
    said once."""
    import tracemalloc

    from tuner.helper import user_import

    unsafe = tmp_path / "home/.local/state/tuner/unsafe"
    unsafe.mkdir(parents=True)
    line = b'{"setting":1}\n'
    for n in range(3):  # of 256 allowed: enough to show the growth
        (unsafe / f"card{n}.jsonl").write_bytes(line * (user_import.MAX_FILE_BYTES // len(line)))
    tracemalloc.start()
    try:
        found = read_user_state(tmp_path / "home", os.getuid())
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_bytes < 24 << 20, f"{peak_bytes >> 20} MiB held by one import of 3 MiB of lines"
    assert found.unsafe and any("only the first" in p for p in found.problems), found.problems


def test_an_nvidia_lock_clock_choice_is_one_writers_and_goes_back_with_its_connection(tmp_path):
    nvidia = HelperService(SimulatedBackend(kind="nvidia", state_path=tmp_path / "nv.json"),
                           MachineState(tmp_path / "nv-state"), group="tuner", log=lambda line: None)
    alice, bob = Client(1, peer(1000, pid=11)), Client(2, peer(1001, pid=22))
    stock_lock = nvidia.backend.knob("sim0").lock_clock_mhz
    assert ask(nvidia, alice, s.LockClock(card="sim0", measured_mhz=2300.0)).mhz == 2295
    with pytest.raises(CardBusy):
        ask(nvidia, bob, s.LockClock(card="sim0", mhz=2100))
    with pytest.raises(Refused):
        ask(nvidia, alice, s.LockClock(card="sim0", mhz=2100, measured_mhz=2100.0))
    assert ask(nvidia, alice, s.Set(card="sim0", value=90)).lock_clock_mhz == 2295
    nvidia.connection_closed(alice)  # unconfirmed: the offset and the lock both go back
    knob = nvidia.backend.knob("sim0")
    assert (knob.current, knob.lock_clock_mhz) == (0, stock_lock)
    ask(nvidia, bob, s.LockClock(card="sim0", mhz=2100))
    # AMD cards have no lock clock
    with pytest.raises(Exception, match="NVIDIA"):
        amd = HelperService(SimulatedBackend(state_path=tmp_path / "amd.json"), MachineState(tmp_path / "a"),
                            group="tuner", log=lambda line: None)
        ask(amd, alice, s.LockClock(card="sim0", mhz=2100))


def test_an_unconfirmed_lock_clock_that_goes_back_names_the_setting_in_the_audit_log(tmp_path):
    """A connection that only chose the lock clock left the offset where it was (Pending.setting: the previous
    value): the revert line of the audit log and the helper's own log said value None, where the lost change the
    client gets says the value the card held."""
    lines: list[str] = []
    nvidia = HelperService(SimulatedBackend(kind="nvidia", state_path=tmp_path / "nv.json"),
                           MachineState(tmp_path / "nv-state"), group="tuner", log=lines.append)
    nvidia.state.create()
    alice = Client(1, peer(1000, pid=11))
    ask(nvidia, alice, s.LockClock(card="sim0", measured_mhz=2300.0))
    nvidia.connection_closed(alice)
    [revert] = [json.loads(line) for line in nvidia.state.log_path.read_text().splitlines()
                if json.loads(line)["event"] == "revert"]
    assert revert["value"] == 0, revert
    [said] = [line for line in lines if line.startswith("revert ")]
    assert "None" not in said, said


def test_a_confirmed_lock_clock_names_the_setting_in_the_audit_log(tmp_path):
    """The confirm line of the audit log, as the revert line: a change that only chose the lock clock keeps the
    offset the card had (Pending.setting), not value None."""
    nvidia = HelperService(SimulatedBackend(kind="nvidia", state_path=tmp_path / "nv.json"),
                           MachineState(tmp_path / "nv-state"), group="tuner", log=lambda line: None)
    nvidia.state.create()
    alice = Client(1, peer(1000, pid=11))
    ask(nvidia, alice, s.LockClock(card="sim0", measured_mhz=2300.0))
    ask(nvidia, alice, s.Confirm(card="sim0"))
    [confirm] = [json.loads(line) for line in nvidia.state.log_path.read_text().splitlines()
                 if json.loads(line)["event"] == "confirm"]
    assert confirm["value"] == 0, confirm


def test_a_forced_reset_reports_a_lost_change_to_stock_as_the_value_written(service):
    """A change to 0 (stock) that another user's forced reset took back is lost at 0, not at the value before it:
    the helper said `value or previous`, which reads 0 as no value."""
    alice, bob = Client(1, peer(1000, pid=11)), Client(2, peer(1001, pid=22))
    ask(service, alice, s.Set(card="sim0", value=-30))
    ask(service, alice, s.Confirm(card="sim0"))
    ask(service, alice, s.Set(card="sim0", value=0))  # unconfirmed, from -30
    ask(service, bob, s.Reset(card="sim0", force=True))
    [lost] = ask(service, alice, s.Heartbeat()).lost
    assert (lost.card, lost.value) == ("sim0", 0) and "--force" in lost.reason


def test_a_forced_reset_ends_the_other_connections_open_trial(service):
    """`tuner reset --force` (the `busy` line's remedy) dropped another connection's hold and change but left its
    trial open in trials.json and the book: no one held the card, yet every other trial on it was refused ("a
    trial is already open", ended only by a connection that no longer holds it), and a freeze after someone
    else's later change would be recorded at the next start as the forced-out trial's setting failing. The trial
    ends as a dead client's does: inconclusive, recovered; its client learns on its next heartbeat."""
    alice, bob = Client(1, peer(1000, pid=11)), Client(2, peer(1001, pid=22))
    ask(service, alice, s.TrialBegin(card="sim0", setting=-60, phase="coarse", session="s"))
    ask(service, bob, s.Reset(card="sim0", force=True))  # before alice's set: no change of hers is pending
    trials = ask(service, bob, s.ReadTrials(card="sim0"))
    assert trials.open is None, trials.open
    [recovered] = trials.recovered
    assert (recovered.trial.setting, recovered.verdict) == (-60, "inconclusive") and "--force" in recovered.reason
    [lost] = ask(service, alice, s.Heartbeat()).lost
    assert (lost.card, lost.value) == ("sim0", -60) and "--force" in lost.reason
    ask(service, bob, s.TrialBegin(card="sim0", setting=-40, phase="coarse", session="b"))
    # alice's tuner still ends its trial (a `finally`): answered, so its own error (LeaseLost) is what it reports,
    # and it does not end bob's trial (its hard-failure mark is -60's own:
    # test_a_hard_failure_marked_after_a_forced_reset_ended_the_trial_still_goes_on_the_machine_list)
    ask(service, alice, s.TrialEnd(card="sim0"))
    assert ask(service, bob, s.ReadTrials(card="sim0")).open.session == "b"
    assert ask(service, bob, s.UnsafeList(card="sim0")) == []
    with pytest.raises(Refused) as refused:  # once: a second end is this connection's mistake again
        ask(service, alice, s.TrialEnd(card="sim0"))
    assert refused.value.code == "no-trial"


def test_a_hard_failure_marked_after_a_forced_reset_ended_the_trial_still_goes_on_the_machine_list(service):
    """A member's trial at -60 hangs the card; another user, seeing it stuck, runs `tuner reset --force`, which ends
    the trial (inconclusive: the reset, not the voltage). The first tuner's trial_end then arrives with its hang
    mark (`journal.record_hard_failure`: a hang, reset or lost card seen at that setting), and it was answered as
    done and dropped: -60 stayed off the machine's list, so the other user's next set (or their bisect) applied the
    value that had just hung the card. The mark is evidence of the trial's own setting, whenever it arrives."""
    alice, bob = Client(1, peer(1000, pid=11)), Client(2, peer(1001, pid=22))
    ask(service, alice, s.TrialBegin(card="sim0", setting=-60, phase="coarse", session="s"))
    ask(service, alice, s.Set(card="sim0", value=-60))
    ask(service, bob, s.Reset(card="sim0", force=True))
    ask(service, alice, s.TrialEnd(card="sim0", unsafe=s.UnsafeMark(kind="hang", reason="ring gfx timeout")))
    assert [(e.setting, e.kind) for e in ask(service, bob, s.UnsafeList(card="sim0"))] == [(-60, "hang")]
    with pytest.raises(Refused) as refused:
        ask(service, bob, s.Set(card="sim0", value=-60))
    assert refused.value.code == "unsafe"


def test_a_mark_after_a_forced_reset_whose_write_failed_can_be_sent_again(service, monkeypatch):
    """The same mark as above, but the machine list's disk is full when it arrives (ENOSPC: `DiskFull`). The
    trial's end was taken before the write, so the same request sent again once space was freed was refused as
    `no-trial` and the hang at -60 never reached the machine's list. The end stays until its mark is written."""
    import errno

    alice, bob = Client(1, peer(1000, pid=11)), Client(2, peer(1001, pid=22))
    ask(service, alice, s.TrialBegin(card="sim0", setting=-60, phase="coarse", session="s"))
    ask(service, alice, s.Set(card="sim0", value=-60))
    ask(service, bob, s.Reset(card="sim0", force=True))
    from tuner.helper import state as state_module

    real_append = state_module.append_durable

    def disk_full(path, line):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_module, "append_durable", disk_full)
    mark = s.UnsafeMark(kind="hang", reason="ring gfx timeout")
    with pytest.raises(TunerError, match="no space left on the device"):
        ask(service, alice, s.TrialEnd(card="sim0", unsafe=mark))
    monkeypatch.setattr(state_module, "append_durable", real_append)
    ask(service, alice, s.TrialEnd(card="sim0", unsafe=mark))  # sent again
    assert [(e.setting, e.kind) for e in ask(service, bob, s.UnsafeList(card="sim0"))] == [(-60, "hang")]


def test_a_lost_card_does_not_stop_the_rest_of_a_closed_connection_going_back(tmp_path):
    """A card that falls off the bus (NVML GpuIsLost, an unreadable pp_od_clk_voltage: the backend's knob() raises
    DeviceLost) while its client goes away. `_restore` read the knob outside its error handling, so
    `connection_closed` stopped at that card: the client's other card stayed held by a dead connection (busy for
    everyone until the helper restarts) and its open trial was never recorded."""
    from tuner.core.errors import DeviceLost

    backend = SimulatedBackend(gpus=2, state_path=tmp_path / "sim.json")
    state = MachineState(tmp_path / "state")
    state.create()
    service = HelperService(backend, state, group="tuner", log=lambda line: None)
    alice, bob = Client(1, peer(1000)), Client(2, peer(1001))
    ask(service, alice, s.Claim(card="sim1", purpose="auto-bisect"))
    ask(service, alice, s.TrialBegin(card="sim0", setting=-60, phase="coarse", session="s"))
    ask(service, alice, s.Set(card="sim0", value=-60))
    real_knob = backend.knob

    def knob(card: str):
        if card == "sim0":
            raise DeviceLost("sim0: the GPU has fallen off the bus", "reboot")
        return real_knob(card)

    backend.knob = knob  # type: ignore[method-assign]
    service.connection_closed(alice)
    assert ask(service, bob, s.Set(card="sim1", value=-10)).current == -10  # not held by the dead connection
    [recovered] = state.recovered(service.keys["sim0"])
    assert recovered.verdict == "inconclusive" and state.open_trials() == {}


def test_clearing_the_machine_list_is_a_write_another_connections_hold_refuses(service):
    """docs/helper.md lists `unsafe_clear` as a write, and a write needs the card's safety state to validate and no
    other connection holding the card. It checked neither: another user cleared the machine's list in the middle
    of a bisect that held the card (and whose plan had skipped those values)."""
    alice, bob = Client(1, peer(1000, pid=11)), Client(2, peer(1001, pid=22))
    ask(service, alice, s.TrialBegin(card="sim0", setting=-60, phase="coarse", session="s"))
    ask(service, alice, s.TrialEnd(card="sim0", unsafe=s.UnsafeMark(kind="hang", reason="the engine hung")))
    ask(service, alice, s.Claim(card="sim0", purpose="auto-bisect of sim0"))
    with pytest.raises(CardBusy, match=r"uid 1000 pid 11 \(auto-bisect of sim0\)"):
        ask(service, bob, s.UnsafeClear(card="sim0", setting=-60))
    assert [e.setting for e in ask(service, bob, s.UnsafeList(card="sim0"))] == [-60]
    ask(service, alice, s.Release(card="sim0"))
    assert [e.setting for e in ask(service, bob, s.UnsafeClear(card="sim0", setting=-60))] == [-60]


def test_reading_a_users_home_at_hello_does_not_stop_the_helper_putting_changes_back(service, monkeypatch):
    """`import_user` reads the caller's home as root, then takes the service's lock only to merge; but `handle`
    held the lock around the whole hello, so a home whose read does not return (a hung NFS mount, a user's FUSE
    file system) stopped every other request and the lease reaper: another user's expired change was never put
    back. The slow file system is stood in for by a reader that waits."""
    from tuner.helper import service as service_module
    from tuner.helper.user_import import UserState

    reading, release = threading.Event(), threading.Event()

    def hung_read(home, uid):
        reading.set()
        release.wait(60)
        return UserState()

    monkeypatch.setattr(service_module, "read_user_state", hung_read)
    alice, mallory = Client(1, peer(1000)), Client(2, peer(pwd.getpwnam("nobody").pw_uid))  # an account: a home
    ask(service, alice, s.Set(card="sim0", value=-50, lease_s=5))
    hello = threading.Thread(target=ask, args=(service, mallory, s.Hello(version=s.PROTOCOL_VERSION)), daemon=True)
    hello.start()
    try:
        wait_until(reading.is_set, 30, "the hello to start reading the home")
        service.clock_.now += 6
        reaper = threading.Thread(target=service.expire_leases, daemon=True)
        reaper.start()
        reaper.join(20)
        assert not reaper.is_alive(), "the lease reaper waited for another user's home to be read"
        assert service.backend.knob("sim0").current == 0
    finally:
        release.set()
        hello.join(30)


def test_a_holders_purpose_reaches_another_user_without_control_characters(service):
    """A `busy` refusal shows another user what the holder said it is doing (`claim`'s purpose), in that user's
    terminal. The holder's command line is escaped (peer.command_of), its purpose was not: a member could send
    escape sequences (clear the screen, retitle the terminal) or a newline into every other user's error line."""
    alice, bob = Client(1, peer(1000, pid=11)), Client(2, peer(1001, pid=22))
    ask(service, alice, s.Claim(card="sim0", purpose="auto-bisect\x1b[2J\x1b]0;owned\x07\nline two\u202e"))
    with pytest.raises(CardBusy) as busy:
        ask(service, bob, s.Set(card="sim0", value=-10))
    shown = busy.value.one_line() + busy.value.hold.purpose
    assert "auto-bisect" in shown and not [ch for ch in shown if not ch.isprintable()], shown


def test_an_unsafe_entrys_words_reach_other_users_without_control_characters(service, mallory_home):
    """The machine's list is shown to every user (the `unsafe` refusal, the tuner's own refusal built from the
    entries the helper lists). Its kind and reason come from another user: a trial_end's mark, or a line of that
    user's own file imported as root. They were stored and shown as sent, escape sequences and newlines included."""

    hostile = "hung\x1b[2J\x1b]0;owned\x07\nline two\u202e"
    alice, bob = Client(1, peer(1000)), Client(2, peer(1001))
    ask(service, alice, s.TrialBegin(card="sim0", setting=-60, phase="coarse", session="s"))
    ask(service, alice, s.TrialEnd(card="sim0", unsafe=s.UnsafeMark(kind="hang", reason=hostile)))
    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text(
        json.dumps({"setting": -40, "unit": "mV", "device": "sim0", "kind": hostile, "reason": hostile}) + "\n")
    service.import_user(os.getuid())
    entries = ask(service, bob, s.UnsafeList(card="sim0"))
    assert sorted(e.setting for e in entries) == [-60, -40]
    with pytest.raises(Refused) as refused:
        ask(service, bob, s.Set(card="sim0", value=-60))
    shown = [refused.value.one_line(), *(e.kind for e in entries), *(e.reason for e in entries)]
    assert not [text for text in shown if not text.isprintable()], shown


def test_an_unsafe_entrys_kernel_log_reaches_other_users_without_control_characters(service, mallory_home):
    """An entry's kernel-log lines are shown to every other user as its kind and reason are (`tuner unsafe list
    --json`, read with `jq -r`), and come from another user too: a trial_end's mark, or a line of that user's own
    file imported as root. Kind and reason went through `printable`, the kernel-log lines did not: stored and
    listed with their escape sequences and newlines."""

    hostile = "amdgpu: ring gfx timeout\x1b[2J\x1b]0;owned\x07\nline two\u202e"
    alice, bob = Client(1, peer(1000)), Client(2, peer(1001))
    ask(service, alice, s.TrialBegin(card="sim0", setting=-60, phase="coarse", session="s"))
    ask(service, alice, s.TrialEnd(card="sim0", unsafe=s.UnsafeMark(kind="hang", reason="r", kernel_log=[hostile])))
    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text(
        json.dumps({"setting": -40, "unit": "mV", "device": "sim0", "kind": "hang", "kernel_log": [hostile]}) + "\n")
    service.import_user(os.getuid())
    entries = ask(service, bob, s.UnsafeList(card="sim0"))
    assert sorted(e.setting for e in entries) == [-60, -40]
    shown = [line for e in entries for line in e.kernel_log]
    assert len(shown) == 2 and all("ring gfx timeout" in line for line in shown), shown
    assert not [line for line in shown if not line.isprintable()], shown


def test_an_older_helpers_unsafe_entry_reaches_other_users_without_control_characters(service):
    """The words of an entry are escaped as they are stored (since 1ea447b, and its kernel-log lines since); a
    machine list an older helper kept holds them as a member sent them, and the list is never dropped: its kind and
    reason reached every other user's terminal raw, in the helper's `unsafe` refusal and in its list."""
    hostile = "hung\x1b[2J\x1b]0;owned\x07\nline two\u202e"
    path = service.state.unsafe_path(service.keys["sim0"])
    path.write_text(json.dumps({"setting": -40, "unit": "mV", "kind": hostile, "reason": hostile, "device": "sim0",
                                "session": "s", "kernel_log": [hostile], "source": "import from uid 1000"}) + "\n"
                    + json.dumps({"setting": -45, "unit": "mV" + hostile, "kind": "hang", "reason": "r"}) + "\n")
    bob = Client(2, peer(1001))
    with pytest.raises(Refused) as refused:
        ask(service, bob, s.Set(card="sim0", value=-40))
    entries = ask(service, bob, s.UnsafeList(card="sim0"))
    shown = [refused.value.one_line(), *(w for e in entries for w in (e.unit, e.kind, e.reason, *e.kernel_log))]
    assert not [text for text in shown if not text.isprintable()], shown


def test_an_imported_entrys_words_keep_the_limits_of_a_trial_ends_mark(service, mallory_home):
    """A trial_end's mark is held to the wire's limits (a reason and each kernel-log line of `schema.Text`, at most
    `MAX_KERNEL_LOG_LINES` lines); a line of a member's own file, imported as root, kept its words at any length: a
    1 MiB reason or kernel-log line grew root's machine list (read at every set) up to the import's caps."""

    huge = "r" * 10_000
    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text(json.dumps({
        "setting": -40, "unit": "mV", "device": "sim0", "kind": "k" * 10_000, "reason": huge,
        "kernel_log": [huge] * 30}) + "\n")
    service.import_user(os.getuid())
    [entry] = ask(service, Client(1, peer(1000)), s.UnsafeList(card="sim0"))
    assert len(entry.reason) <= s.MAX_TEXT_CHARS and len(entry.kind) <= s.MAX_TEXT_CHARS
    assert len(entry.kernel_log) <= s.MAX_KERNEL_LOG_LINES
    assert all(len(line) <= s.MAX_TEXT_CHARS for line in entry.kernel_log), [len(line) for line in entry.kernel_log]


def test_an_entrys_escaped_words_keep_the_limits_of_a_trial_ends_mark(service, mallory_home):
    """A word shown to other users is escaped (`printable`), and escaping makes one character up to seven (U+E0001,
    a format character, is `\\ue0001`): an imported line's kind, reason and 20 kernel-log lines of 500 such characters
    each became an entry of ~88 KB (and a trial_end's ~8 KB), where a real one is a few hundred bytes; the list of a
    card is read whole at every set. Each word is cut to MAX_TEXT_CHARS after escaping, as the wire holds a mark."""
    hostile = "\U000e0001" * s.MAX_TEXT_CHARS
    alice = Client(1, peer(1000))
    mark = msgspec.convert({"kind": "hang", "reason": hostile, "kernel_log": [hostile]}, s.UnsafeMark)
    ask(service, alice, s.TrialBegin(card="sim0", setting=-60, phase="coarse", session="s"))
    ask(service, alice, s.TrialEnd(card="sim0", unsafe=mark))
    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text(json.dumps({
        "setting": -70, "unit": "mV", "device": "sim0", "kind": hostile, "reason": hostile,
        "kernel_log": [hostile] * s.MAX_KERNEL_LOG_LINES}) + "\n")
    service.import_user(os.getuid())
    entries = ask(service, alice, s.UnsafeList(card="sim0"))
    assert sorted(e.setting for e in entries) == [-70, -60]
    sizes = [len(w) for e in entries for w in (e.kind, e.reason, *e.kernel_log)]
    assert max(sizes) <= s.MAX_TEXT_CHARS, sizes


def test_an_imported_entrys_unit_card_serial_session_and_boot_id_are_held_to_the_wires_types(
        service, monkeypatch, mallory_home):
    """A member's own unsafe lines and open trials, imported as root, kept their unit, card, serial, session, boot
    id and phase as the file had them: any characters, any length. The unit reaches every other user's terminal
    unescaped (`tuner unsafe list`'s SETTING column, `tuner unsafe clear`'s question), so a member could clear
    their screens or retitle their terminals, or file a 10 KiB session on root's list. Each is held to the wire's
    type (a card id, a session, a word, a knob unit); a line that is not is skipped and logged, as other bad
    lines are (the member's own tuner still refuses it)."""

    serial = service.devices["sim0"].serial
    hostile = "\x1b[2J\x1b]0;owned\x07"
    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/journal").mkdir(parents=True)
    line = {"unit": "mV", "device": "sim0", "kind": "hang"}
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text("".join(json.dumps({**line, **fields}) + "\n"
                                                                       for fields in [
        {"setting": -40, "unit": "mV" + hostile}, {"setting": -45, "session": "s" * 10_240},
        {"setting": -50, "serial": "x" + hostile}, {"setting": -35, "boot_id": "b" + hostile},
        {"setting": -30, "serial": serial, "device": "x" + hostile}, {"setting": -55}]))
    trial = {"phase": "coarse", "boot_id": "boot-earlier", "session": "s1"}
    for name, device, fields in [("a", "sim0", {"setting": -60, "phase": "coarse" + hostile}),
                                 ("b", "sim0", {"setting": -70, "session": "s" * 10_240}),
                                 ("c" + hostile, None, {"setting": -75, "serial": serial}),
                                 ("d", "sim0", {"setting": -80, "unit": "MHz" + hostile}),
                                 ("e", "sim0", {"setting": -85})]:
        (home / ".local/state/tuner/journal" / f"{name}.json").write_text(
            json.dumps({"device": device, "open_trial": {**trial, **fields}}))
    logged: list[str] = []
    monkeypatch.setattr(service, "_log", logged.append)
    service.import_user(os.getuid())
    entries = ask(service, Client(2, peer(1001)), s.UnsafeList(card="sim0"))
    words = [w for e in entries for w in (e.unit, e.device, e.serial, e.session, e.boot_id, e.kind, e.reason) if w]
    assert not [w for w in words if not w.isprintable() or len(w) > s.MAX_TEXT_CHARS], words
    assert {e.unit for e in entries} <= {"mV", "MHz"}, entries
    assert sorted(e.setting for e in entries) == [-85, -55], entries
    assert len([line for line in logged if "skipped" in line]) == 9, logged


def test_every_imported_setting_is_one_an_unsafe_clear_request_can_name(service, mallory_home):
    """`tuner unsafe clear VALUE` removes one listed setting, and the wire holds VALUE to `schema.Setting`. A member's
    own line (or open trial) was imported at any setting, -10**20 included: listed to every user, and no request could
    name it to clear it (bad-request), only a clear of the card's whole list. A setting beyond the wire's bounds
    (wider than any card's range) is skipped and logged, as other bad lines are."""

    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/journal").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text("".join(
        json.dumps({"setting": setting, "unit": "mV", "device": "sim0", "kind": "hang"}) + "\n"
        for setting in (-10**20, -200_000, -40)))
    (home / ".local/state/tuner/journal/sim0.json").write_text(json.dumps({"device": "sim0", "open_trial": {
        "setting": -10**20, "phase": "coarse", "boot_id": "boot-earlier", "session": "s1"}}))
    service.import_user(os.getuid())
    for entry in ask(service, Client(2, peer(1001)), s.UnsafeList(card="sim0")):
        s.decode_request(json.dumps({"op": "unsafe_clear", "card": "sim0", "setting": entry.setting}).encode())
    assert [e.setting for e in ask(service, Client(2, peer(1001)), s.UnsafeList(card="sim0"))] == [-40]


def test_an_imported_line_at_the_cards_stock_does_not_refuse_stock(service, mallory_home):
    """Stock never goes on a list (`_mark_unsafe`, the user's own `record_hard_failure`): it is where every
    failure goes back to. A line of a member's own file at the card's stock was imported as it was, and the helper
    then refused `set` to stock on that card for every user ("+0 mV is at or beyond +0 mV, which failed hard")."""

    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text("".join(
        json.dumps({"setting": setting, "unit": "mV", "device": "sim0", "kind": "hang"}) + "\n"
        for setting in (0, -40)))
    service.import_user(os.getuid())
    bob = Client(2, peer(1001))
    assert [e.setting for e in ask(service, bob, s.UnsafeList(card="sim0"))] == [-40]
    ask(service, bob, s.Set(card="sim0", value=-20))
    assert ask(service, bob, s.Set(card="sim0", value=0)).current == 0


def test_an_imported_line_beyond_stock_outside_the_cards_range_does_not_refuse_stock(service, mallory_home):
    """As a line at stock (above), a member's line at a setting the card cannot take on the overvolt side of stock
    (+5 mV, outside the range -200..0 mV: `Knob.validate`) was imported, and stock is "beyond" it in the aggressive
    direction: the helper then refused `set` to stock on that card for every user. No set could ever have written
    such a setting, so it adds nothing to refuse (as a trial's mark: `_refused_already`) and is left in the file."""

    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text("".join(
        json.dumps({"setting": setting, "unit": "mV", "device": "sim0", "kind": "hang"}) + "\n"
        for setting in (5, 100_000, -40)))
    (home / ".local/state/tuner/journal").mkdir()  # a trial its journal left open in an earlier boot, likewise
    (home / ".local/state/tuner/journal/sim0.json").write_text(json.dumps({"device": "sim0", "open_trial": {
        "setting": 7, "unit": "mV", "phase": "coarse", "boot_id": "boot-earlier", "session": "s1"}}))
    service.import_user(os.getuid())
    bob = Client(2, peer(1001))
    assert [e.setting for e in ask(service, bob, s.UnsafeList(card="sim0"))] == [-40]
    ask(service, bob, s.Set(card="sim0", value=-20))
    assert ask(service, bob, s.Set(card="sim0", value=0)).current == 0


def test_a_users_file_names_reach_the_helpers_log_without_control_characters(
        service, tmp_path, monkeypatch, mallory_home):
    """A file the import skips is logged by name (the unit's journal, read by admins), and the name is the user's:
    a newline in it wrote a line of the user's choosing into root's log, as if the helper had said it."""

    home = mallory_home
    unsafe = home / ".local/state/tuner/unsafe"
    unsafe.mkdir(parents=True)
    (unsafe / "x\ntuner-helper: revert sim0 -60 -> 0 (forged)\x1b[2J.jsonl").symlink_to(tmp_path / "nowhere")
    (unsafe / "y\ntuner-helper: forged too.jsonl").write_text("not json\n")
    logged: list[str] = []
    monkeypatch.setattr(service, "_log", logged.append)
    service.import_user(os.getuid())
    skipped = [line for line in logged if "skipped" in line]
    assert len(skipped) == 2 and not [line for line in skipped if not line.isprintable()], skipped


def test_a_users_bad_lines_do_not_flood_the_helpers_log(service, monkeypatch, mallory_home):
    """Each line of a member's file the import skips was logged on its own, at every hello: a 1 MiB file of bad
    lines ("x\\n") wrote some 500,000 lines into root's log per file per hello, and journald's rate limit then drops
    the helper's own lines with them (a revert, a write's audit). The user writes these: a few lines, then one
    saying how many more (as for the entries naming no card)."""

    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    for n in range(3):
        (home / f".local/state/tuner/unsafe/sim{n}.jsonl").write_text("x\n" * 5_000)
    logged: list[str] = []
    monkeypatch.setattr(service, "_log", logged.append)
    service.import_user(os.getuid())
    assert 1 <= len(logged) <= 20, (len(logged), logged[-1])
    assert f"skipped {15_000 - len(logged) + 1} more" in logged[-1], logged[-1]


def test_importing_a_users_list_reads_the_machines_list_once_per_card_not_once_per_line(
        service, monkeypatch, mallory_home):
    """Each imported line was merged on its own: the card's whole machine list read (and a line fsynced) per line,
    under the service lock. A member's file within the caps (1 MiB: some 25,000 short lines) made that quadratic:
    hours of root's work at every hello, with every request and the lease reaper (which puts unconfirmed changes
    back) waiting for the lock. The work counted here is the reads of the machine's list."""

    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text("".join(
        json.dumps({"setting": -40, "unit": "mV", "device": "sim0", "recorded_at": 1000.0 + n}) + "\n"
        for n in range(300)))
    machine_list = service.state.unsafe_path(service.keys["sim0"])
    reads: list[object] = []
    real_read = MachineState._read
    monkeypatch.setattr(MachineState, "_read", lambda self, path: (reads.append(path), real_read(self, path))[1])
    service.import_user(os.getuid())
    assert reads.count(machine_list) <= 1, reads.count(machine_list)
    assert len(ask(service, Client(1, peer(1000)), s.UnsafeList(card="sim0"))) == 300
    service.import_user(os.getuid())  # idempotent: nothing twice
    assert len(ask(service, Client(1, peer(1000)), s.UnsafeList(card="sim0"))) == 300


def test_an_import_leaves_a_cards_machine_list_far_inside_a_reply(service, monkeypatch, mallory_home):
    """The machine list of a card is one `unsafe_list` reply, which the client reads no further than
    `schema.MAX_REPLY_BYTES` (then: the helper is lost, exit 9), and it is read whole at every `set`. The import
    added every distinct line of a member's files (256 files of 1 MiB a directory, at every hello): 130 MiB of
    long lines grew a card's list to 70 MB in one hello, past the reply's bound, so every user's tuner failed on
    that card, `tuner unsafe clear` included (it lists first). An import adds nothing to a list already at
    `state.MAX_IMPORTED_LIST_BYTES` (an eighth of a reply); what it leaves stays in the member's files (their own
    tuner refuses it) and one line says how many. Never an entry dropped from the list."""
    from tuner.helper import state as state_module
    from tuner.helper import user_import

    # one import reads MAX_IMPORTED_BYTES of a member's lines; a member renaming their files between hellos gets
    # the rest read at later ones: the list's own cap, as if one hello read them all
    monkeypatch.setattr(user_import, "MAX_IMPORTED_BYTES", user_import.MAX_FILES * user_import.MAX_FILE_BYTES)
    home = mallory_home
    unsafe = home / ".local/state/tuner/unsafe"
    unsafe.mkdir(parents=True)
    long = "r" * s.MAX_TEXT_CHARS
    n = 0
    for f in range(24):
        lines = []
        for _ in range(80):  # about 1 MiB a file
            lines.append(json.dumps({"setting": -40, "unit": "mV", "device": "sim0", "kind": "hang", "reason": long,
                                     "kernel_log": [long] * s.MAX_KERNEL_LOG_LINES, "recorded_at": 1000.0 + n}))
            n += 1
        (unsafe / f"f{f:03d}.jsonl").write_text("\n".join(lines) + "\n")
    logged: list[str] = []
    monkeypatch.setattr(service, "_log", logged.append)
    service.import_user(os.getuid())
    size = service.state.unsafe_path(service.keys["sim0"]).stat().st_size
    assert size <= state_module.MAX_IMPORTED_LIST_BYTES < s.MAX_REPLY_BYTES, size
    assert [line for line in logged if "more entries" in line], logged
    alice = Client(1, peer(1000))  # a helper's own record still goes on the list (one the -40s do not refuse)
    ask(service, alice, s.TrialBegin(card="sim0", setting=-20, phase="coarse", session="s"))
    ask(service, alice, s.TrialEnd(card="sim0", unsafe=s.UnsafeMark(kind="hang", reason="froze")))
    assert ask(service, alice, s.UnsafeList(card="sim0"))[-1].setting == -20


def test_importing_lines_that_name_no_card_of_this_machine_creates_no_files_as_root(service, mallory_home):
    """A user's line naming a card this machine does not have went to a machine list of its own, named from the
    line ("unknown-slot-<device>.jsonl"), which no card's key ever reads. So each distinct name made root create a
    file in its state directory: a member's file of 25,000 lines naming 25,000 made-up cards, at every hello, until
    the disk or its inodes ran out (and with them every durable write the helper needs to put a card back)."""

    home = mallory_home
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text("".join(
        json.dumps({"setting": -40, "unit": "mV", "device": device}) + "\n"
        for device in ["sim0", *(f"0000:{n:02x}:00.0" for n in range(50))]))
    service.import_user(os.getuid())
    made = sorted(p.name for p in (service.state.root / "unsafe").iterdir())
    assert made == [f"{service.keys['sim0']}.jsonl"], made[:3]
    assert [e.setting for e in ask(service, Client(1, peer(1000)), s.UnsafeList(card="sim0"))] == [-40]


def test_a_trial_a_users_journal_left_open_is_filed_under_the_card_and_in_the_unit_it_ran_in(tmp_path, monkeypatch):
    """The import filed a user's trial left open in an earlier boot under the card in that slot now, in that card's
    unit: it never read the serial and unit the journal holds (the user's own tuner records such a trial under the
    card it ran on since 28c354b/cea5df3). After a card swap the crashed card's value went to the wrong card: the
    card now in the slot refused it, while the card that crashed (moved to another slot) kept no refusal. A guard
    file holds both in its open trial; an older journal with neither still falls back to the slot's card."""
    from tuner.helper import service as service_module

    backend = SimulatedBackend(gpus=2, state_path=tmp_path / "sim.json")
    state = MachineState(tmp_path / "state")
    state.create()
    service = HelperService(backend, state, group="tuner", log=lambda line: None)
    moved = backend.device("sim1").serial  # the card that crashed in slot sim0, now in slot sim1
    home = tmp_path / "alice"
    journal = home / ".local/state/tuner/journal"
    journal.mkdir(parents=True)
    (journal / "sim0.json").write_text(json.dumps({
        "device": "sim0", "serial": moved, "knob": {"unit": "mV", "stock": 0},
        "open_trial": {"setting": -60, "phase": "coarse", "boot_id": "boot-earlier", "session": "s1"}}))
    (journal / "sim0.guard.json").write_text(json.dumps({"open_trial": {
        "device": "sim0", "setting": -70, "unit": "MHz", "serial": moved, "phase": "verify",
        "boot_id": "boot-earlier"}}))
    monkeypatch.setattr(service_module.pwd, "getpwuid", lambda uid: type("pw", (), {"pw_dir": str(home)}))
    service.import_user(os.getuid())
    alice = Client(1, peer(1000))
    assert ask(service, alice, s.UnsafeList(card="sim0")) == []
    assert sorted((e.setting, e.unit, e.serial) for e in ask(service, alice, s.UnsafeList(card="sim1"))) == [
        (-70, "MHz", moved), (-60, "mV", moved)]
    # an older journal (no serial, no unit): the card in its slot, in that card's unit, as before
    (journal / "sim0.guard.json").unlink()
    (journal / "sim0.json").write_text(json.dumps({"device": "sim0", "open_trial": {
        "setting": -50, "phase": "coarse", "boot_id": "boot-earlier", "session": "s2"}}))
    service.import_user(os.getuid())
    assert [(e.setting, e.unit) for e in ask(service, alice, s.UnsafeList(card="sim0"))] == [(-50, "mV")]


def test_a_card_whose_knob_cannot_be_read_does_not_refuse_a_users_hello(service, tmp_path, monkeypatch):
    """An older journal's open trial says no unit, so the import asked the card in its slot for its knob; where
    that read failed (an AMD card without overdrive enabled: Unsupported; one that fell off the bus) the error
    left `import_user`, so the member's `hello` was refused (every command of theirs, on every card, failed) and
    a helper starting for a sudo user with such a journal did not start. The trial is left for a later import
    (it stays in the user's journal), and said."""
    from tuner.core.errors import Unsupported
    from tuner.helper import service as service_module

    home = tmp_path / "alice"
    journal = home / ".local/state/tuner/journal"
    journal.mkdir(parents=True)
    (journal / "sim0.json").write_text(json.dumps({"device": "sim0", "open_trial": {
        "setting": -50, "phase": "coarse", "boot_id": "boot-earlier", "session": "s2"}}))
    logged: list[str] = []
    monkeypatch.setattr(service, "_log", logged.append)
    monkeypatch.setattr(service_module.pwd, "getpwuid", lambda uid: type("pw", (), {"pw_dir": str(home)}))
    real_knob = service.backend.knob

    def no_overdrive(card):
        raise Unsupported(f"{card} has no overdrive table", "enable overdrive")

    monkeypatch.setattr(service.backend, "knob", no_overdrive)
    alice = Client(1, peer(os.getuid()))
    assert ask(service, alice, s.Hello(version=s.PROTOCOL_VERSION)).uid == os.getuid()
    assert [line for line in logged if "sim0" in line and "skipped" in line], logged
    monkeypatch.setattr(service.backend, "knob", real_knob)
    ask(service, alice, s.Hello(version=s.PROTOCOL_VERSION))  # readable again: imported then
    assert [(e.setting, e.unit) for e in ask(service, alice, s.UnsafeList(card="sim0"))] == [(-50, "mV")]


def test_one_cards_damaged_machine_list_does_not_refuse_a_users_hello(tmp_path, monkeypatch):
    """A damaged machine list refuses every write to its card (fail closed). The import merged a user's lines into
    each card's list at their hello, and the DamagedState of one card's list left `import_user`: the hello was
    refused, so that user could do nothing through the helper on any card, not even reset another card to stock
    (and a helper starting for a sudo user with such lines exited). The other cards' lines are merged; the damaged
    one's stay in the user's file for a later import, and one line says so."""
    from tuner.helper import service as service_module

    backend = SimulatedBackend(gpus=2, state_path=tmp_path / "sim.json")
    state = MachineState(tmp_path / "state")
    state.create()
    logged: list[str] = []
    service = HelperService(backend, state, group="tuner", log=logged.append)
    state.unsafe_path(service.keys["sim0"]).write_text("{torn\n")
    home = tmp_path / "alice"
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text("".join(
        json.dumps({"setting": -40, "unit": "mV", "device": device, "kind": "hang"}) + "\n"
        for device in ("sim0", "sim1")))
    monkeypatch.setattr(service_module.pwd, "getpwuid", lambda uid: type("pw", (), {"pw_dir": str(home)}))
    alice = Client(1, peer(os.getuid()))
    assert ask(service, alice, s.Hello(version=s.PROTOCOL_VERSION)).uid == os.getuid()
    assert [e.setting for e in ask(service, alice, s.UnsafeList(card="sim1"))] == [-40]
    assert ask(service, alice, s.Reset(card="sim1")).current == 0
    assert [line for line in logged if "sim0" in line and "damaged" in line], logged
    with pytest.raises(DamagedState):
        ask(service, alice, s.Set(card="sim0", value=-10))


def test_nothing_is_written_after_the_helper_put_everything_back_to_stop(service):
    """On SIGTERM `serve` calls `shutdown` (every unconfirmed change goes back) and the process exits; but each
    connection's thread lives until then, and a `set` waiting for the service lock got it right after `shutdown`
    released it: written, unconfirmed, and left on the card by a helper that said "every unconfirmed change was
    put back" (under socket activation nothing starts it again to put it back until someone connects)."""
    alice = Client(1, peer(1000))
    service.shutdown()
    with pytest.raises(TunerError):
        ask(service, alice, s.Set(card="sim0", value=-50))
    assert service.backend.knob("sim0").current == 0


def test_a_set_the_backend_could_not_undo_stays_unconfirmed_and_goes_back(tmp_path):
    """The backend's own put-back can fail too: amdgpu commits the value, then the card stops answering (a GPU
    reset, EPERM, as an undervolt that is too deep causes) and the AMD backend's restore cannot even read the
    table; it raises NotApplied "restoring ... also failed". The helper took any failure of a first change as
    "the backend put the previous value back" and forgot it: no lease, no put-back when the client went away, the
    value left on the card (amdgpu re-applies the user's table after its reset). The fake kernel stops answering
    right after the commit, then answers again."""
    import errno

    from tests.backends.fakes.fake_kernel import FakeKernelIO, FakeOdKernel
    from tests.backends.fakes.trees import OD_TEXT, make_tree
    from tuner.backends import amd
    from tuner.backends.amd_sysfs import amd_card_dirs

    make_tree(tmp_path, ["rdna4"])
    (d,) = amd_card_dirs(tmp_path)
    od_file = d / "pp_od_clk_voltage"
    kernel = FakeOdKernel(OD_TEXT["rdna4"])
    io = FakeKernelIO({od_file: kernel})
    backend = amd.AmdBackend([d], root=tmp_path, sysfs=io, sleep=lambda s: None)
    state = MachineState(tmp_path / "state")
    state.create()
    clock = Clock()
    service = HelperService(backend, state, group="tuner", clock=clock, log=lambda line: None)
    card, alice = backend.devices()[0].id, Client(1, peer(1000))
    real_write = kernel.write

    def write(data: bytes) -> int:
        written = real_write(data)
        if data == b"c\n":
            kernel.in_reset = True  # the GPU resets under the new value: EPERM on every read and write
            io.read_errors[od_file] = errno.EPERM
        return written

    kernel.write = write  # type: ignore[method-assign]
    with pytest.raises(TunerError):
        ask(service, alice, s.Set(card=card, value=-50, lease_s=5))
    kernel.write, kernel.in_reset = real_write, False  # type: ignore[method-assign]  # the reset is over
    io.read_errors.clear()
    assert backend.knob(card).current == -50  # what the failed set left on the card
    clock.now += 6
    service.expire_leases()
    assert backend.knob(card).current == 0


def test_an_unconfirmed_change_never_goes_back_to_a_value_the_machine_list_now_refuses(service, tmp_path,
                                                                                     monkeypatch):
    """Putting a change back is automatic, and a value that failed hard is never applied again automatically.
    The value before the change (here a kept -100 mV) can reach the machine's list meanwhile (another user's
    own list, imported at their hello); the lease put it back anyway. It goes to stock instead."""
    from tuner.helper import service as service_module

    alice = Client(1, peer(1000))
    ask(service, alice, s.Set(card="sim0", value=-100, lease_s=5))
    ask(service, alice, s.Confirm(card="sim0"))
    ask(service, alice, s.Set(card="sim0", value=-120, lease_s=5))
    home = tmp_path / "bob"
    (home / ".local/state/tuner/unsafe").mkdir(parents=True)
    (home / ".local/state/tuner/unsafe/sim0.jsonl").write_text(
        json.dumps({"setting": -100, "unit": "mV", "device": "sim0", "kind": "hang"}) + "\n")
    monkeypatch.setattr(service_module.pwd, "getpwuid", lambda uid: type("pw", (), {"pw_dir": str(home)}))
    service.import_user(os.getuid())
    service.clock_.now += 6
    service.expire_leases()
    assert service.backend.knob("sim0").current == 0


def test_a_full_disk_does_not_stop_the_rest_of_a_closed_connection_going_back(tmp_path, monkeypatch):
    """A full disk must not block putting a card back (state.log). When the client of a rig went away, the first
    card was put back, then forgetting its journal entry (writes.json) raised DiskFull out of
    `connection_closed`: the second card's unconfirmed change stayed on the card, and a card the client held was
    busy for everyone until the helper restarted."""
    from tuner.core.errors import DiskFull

    backend = SimulatedBackend(gpus=3, state_path=tmp_path / "sim.json")
    state = MachineState(tmp_path / "state")
    state.create()
    service = HelperService(backend, state, group="tuner", log=lambda line: None)
    alice, bob = Client(1, peer(1000)), Client(2, peer(1001))
    ask(service, alice, s.Set(card="sim0", value=-50))
    ask(service, alice, s.Set(card="sim1", value=-50))
    ask(service, alice, s.Claim(card="sim2", purpose="rig"))

    def full(path, data, *, append=False):
        raise DiskFull(f"{path}: no space left on device", "free some space")

    monkeypatch.setattr(state, "_store", full)
    service.connection_closed(alice)
    assert [backend.knob(card).current for card in ("sim0", "sim1")] == [0, 0]
    ask(service, bob, s.Claim(card="sim2", purpose="tuner set"))  # not busy (a set needs the disk to journal it)


def test_a_machine_list_kept_under_a_placeholder_serial_still_refuses_after_the_upgrade(tmp_path):
    """Before placeholder serials meant 'no serial', every AMD card whose serial amdsmi could not read ("N/A") had
    its machine list at `unsafe/amd-serial-N_A.jsonl`; now each is keyed by its slot, and that list was read by
    no card: a value that hung the machine was applied again. Such a list was every such card's, so it stays so."""
    from tests.backends.fakes.trees import two_rdna4_cards_without_serials

    backend, slots = two_rdna4_cards_without_serials(tmp_path / "hw")
    state = MachineState(tmp_path / "state")
    state.create()
    state.add_unsafe("amd-serial-N_A", s.UnsafeEntry(setting=-100, unit="mV", kind="hang", reason="the engine hung",
                                                     device=slots[1], serial="N/A", session="old"))
    service = HelperService(backend, state, group="tuner", log=lambda line: None)
    service.recover_at_start()  # as tuner-helper starts
    for card in slots:
        with pytest.raises(Refused) as refused:
            ask(service, Client(1, peer(1000)), s.Set(card=card, value=-100))
        assert refused.value.code == "unsafe"
        assert backend.knob(card).current == 0


def test_a_machine_list_kept_under_the_serial_an_older_helper_read_still_refuses(tmp_path):
    """Without amdsmi, an older helper knew an AMD card by its board's FRU `serial_number`, or, with none, by its
    slot; amdsmi's asic_serial (and now the sysfs path too) is the chip's `unique_id`. Under the new key those
    lists were read by no card: a value that hung the machine was applied again."""
    from tests.backends.fakes.fake_kernel import FakeKernelIO, FakeOdKernel
    from tests.backends.fakes.trees import OD_TEXT, make_card, make_tree
    from tuner.backends import amd
    from tuner.backends.amd_sysfs import amd_card_dirs

    hw = tmp_path / "hw"
    make_tree(hw, [])
    slots = ["0000:03:00.0", "0000:04:00.0"]
    for i, slot in enumerate(slots):
        dev = make_card(hw, i, "rdna4", slot=slot)
        (dev / "unique_id").write_text(f"5a0b3c4d6e7f809{i}\n")
    (dev / "serial_number").write_text("PJ0123456789\n")  # the second card's FRU
    dirs = amd_card_dirs(hw)
    kernels = FakeKernelIO({d / "pp_od_clk_voltage": FakeOdKernel(OD_TEXT["rdna4"]) for d in dirs})
    backend = amd.AmdBackend(dirs, root=hw, sysfs=kernels, amdsmi=None)
    state = MachineState(tmp_path / "state")
    state.create()
    state.add_unsafe("amd-slot-0000_03_00.0", s.UnsafeEntry(setting=-100, unit="mV", kind="hang", reason="hung",
                                                            device=slots[0], session="old"))
    state.add_unsafe("amd-serial-PJ0123456789", s.UnsafeEntry(setting=-90, unit="mV", kind="hang", reason="hung",
                                                              device=slots[1], serial="PJ0123456789", session="old"))
    service = HelperService(backend, state, group="tuner", log=lambda line: None)
    service.recover_at_start()  # as tuner-helper starts
    for card, value in zip(slots, (-100, -90), strict=True):
        with pytest.raises(Refused) as refused:
            ask(service, Client(1, peer(1000)), s.Set(card=card, value=value))
        assert refused.value.code == "unsafe"
        assert backend.knob(card).current == 0


def test_a_member_repeating_a_hard_failure_does_not_grow_the_machine_list_without_bound(service):
    """A group member could loop trial_begin/trial_end with an unsafe mark at a value the list refused already:
    each mark (a new recorded_at, a long reason and kernel log) went on, so the list grew without bound, past the
    reply the client reads (`schema.MAX_REPLY_BYTES`): every user's tuner then lost the helper on that card,
    `tuner unsafe clear` included. A mark the list refuses already (at that value or beyond a listed one of its
    unit: `unsafe_rule`) adds nothing to refuse and is not recorded again; one that refuses more still goes on.
    Nor is a setting the card cannot take (outside its range or step: `Knob.validate`, as a set is held to), so
    the list holds at most one entry a value of the card's range; +100000 mV had refused stock itself. (A
    trial_begin of such a value is refused now; one an older helper journaled fails at a machine reset.)"""
    mallory = Client(1, peer(1000))
    long = "r" * s.MAX_TEXT_CHARS
    mark = s.UnsafeMark(kind="hang", reason=long, kernel_log=[long] * s.MAX_KERNEL_LOG_LINES)
    key = service.keys["sim0"]
    for setting in (100_000, -100_000, -61):  # -61: off the card's 5 mV step
        service.state.set_open_trial(key, s.OpenTrial(
            card="sim0", key=key, setting=setting, stock=0, unit="mV", phase="coarse", session="s", uid=1000,
            pid=1, helper_pid=1, boot_id="an-earlier-boot", started_at=1.0))
        service.recover_at_start()  # the machine reset during it: a hard failure, marked
        assert service.state.open_trials() == {}
    for setting in (-60, -60, -65, -60, -100):
        ask(service, mallory, s.TrialBegin(card="sim0", setting=setting, phase="coarse", session="s"))
        ask(service, mallory, s.TrialEnd(card="sim0", unsafe=mark))
    assert [e.setting for e in ask(service, mallory, s.UnsafeList(card="sim0"))] == [-60]
    ask(service, mallory, s.TrialBegin(card="sim0", setting=-40, phase="coarse", session="s"))
    ask(service, mallory, s.TrialEnd(card="sim0", unsafe=mark))
    assert [e.setting for e in ask(service, mallory, s.UnsafeList(card="sim0"))] == [-60, -40]


def test_a_member_opening_trials_and_going_away_does_not_grow_the_recovered_file_without_bound(service):
    """Each trial whose client goes away is appended to `recovered.jsonl`, which never shrank and is read whole at
    every `read_trials` and by every user's boot check: a member opening a trial and closing the connection, over
    and over, grew it without bound. It keeps each card's newest `RECOVERED_SHOWN` (all `read_trials` answers
    with) and every failure recovered in this boot (what the boot check `failed_trial_recovered_in` asks for)."""
    from tuner.core.kernel_files import boot_id
    from tuner.helper.state import RECOVERED_SHOWN

    key = service.keys["sim0"]
    opened = s.OpenTrial(card="sim0", key=key, setting=-80, stock=0, unit="mV", phase="coarse", session="old",
                         uid=1000, pid=1, helper_pid=1, boot_id="earlier", started_at=1.0)
    froze = s.RecoveredTrial(opened, "fail", "system-reset", "froze", 2.0, boot_id())
    service.state.add_recovered(froze)
    for n in range(3 * RECOVERED_SHOWN):
        mallory = Client(n + 10, peer(1000, pid=n + 10))
        ask(service, mallory, s.TrialBegin(card="sim0", setting=-5, phase="coarse", session=f"m{n}"))
        service.connection_closed(mallory)
    lines = service.state.recovered_path.read_bytes().splitlines()
    assert len(lines) <= RECOVERED_SHOWN + 1, len(lines)
    assert service.state.failed_trial_recovered_in(boot_id()) == froze
    shown = ask(service, Client(1, peer(1001)), s.ReadTrials(card="sim0")).recovered
    assert [r.trial.session for r in shown] == [f"m{n}" for n in range(2 * RECOVERED_SHOWN, 3 * RECOVERED_SHOWN)]


def test_the_write_log_keeps_one_older_generation_and_never_grows_past_twice_its_cap(tmp_path, monkeypatch):
    """log.jsonl had no bound: a group member setting and resetting in a loop grew root's state directory (under
    /var/lib) by a line per request until the disk was full. It keeps the newest MAX_LOG_BYTES, and the generation
    before in log.jsonl.1, with no line lost at the turn."""
    from tuner.helper import state as state_module

    monkeypatch.setattr(state_module, "MAX_LOG_BYTES", 4096, raising=False)
    state = MachineState(tmp_path)
    state.create()
    for i in range(500):
        state.log("set", card="sim0", value=-i, uid=1000)
    older = state.log_path.with_name("log.jsonl.1")
    assert state.log_path.stat().st_size <= 4096 and older.exists() and older.stat().st_size <= 4096
    newest = [json.loads(line) for line in state.log_path.read_text().splitlines()]
    before = [json.loads(line) for line in older.read_text().splitlines()]
    assert newest[-1]["value"] == -499 and before[-1]["value"] == newest[0]["value"] + 1


@pytest.mark.parametrize("setting", [-100_000, 5, -3])  # past the card's range, beyond stock, off its 5 mV step
def test_a_trial_of_a_value_the_card_cannot_take_is_refused_and_nothing_is_opened(service, setting):
    """trial_begin took any setting within the wire's ±100,000 and journaled an open trial for it: held as the card's
    open trial (every other user's `read_trials` showed it, and a next trial_begin was refused) for a value no set
    could ever write. It is refused as a set of it would be, and nothing is journaled."""
    alice = Client(1, peer(1000))
    with pytest.raises(OutOfRange):
        ask(service, alice, s.TrialBegin(card="sim0", setting=setting, phase="coarse"))
    assert service.state.open_trials() == {}
