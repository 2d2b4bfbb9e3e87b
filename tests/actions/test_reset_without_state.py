"""Returning a card to stock never needs the state directory (issue 28, item 2).

Root ignores mode bits, so "read-only" is made the way the kernel enforces it for everyone: a read-only bind
mount (EROFS) and a full tmpfs (ENOSPC), each inside a private mount namespace of the test's own subprocess
(`unshare --mount`), so nothing outside it ever sees the mounts. A second test takes the mode-bit path honestly:
the state directory mode 0555, the tuner run as an unprivileged uid (setpriv), where EACCES is what it meets.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.cli_helpers import REPO
from tests.for_others import code_for_others, python_for_others, pythonpath_for_others
from tuner.core import paths


def _can_unshare_mounts() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(not _can_unshare_mounts(),
                                  reason="needs root and mount namespaces (unshare --mount) to make a read-only "
                                  "or full file system")
TUNER = f"{sys.executable} -m tuner --simulate"


def _in_namespace(script: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "STATE": str(paths.state_dir()),
           "HOME_STATE": str(paths.state_dir().parent)}
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=180)


def _offset(status_json: str) -> int:
    return json.loads(status_json)["devices"][0]["knob"]["current"]


def _set_minus_30() -> None:
    proc = subprocess.run([*TUNER.split(), "set", "--device", "sim0", "--offset", "-30", "--yes"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


@needs_mounts
def test_reset_returns_the_card_to_stock_with_the_state_directory_read_only():
    _set_minus_30()  # the state directory now holds the lock file, the simulated card is at -30
    proc = _in_namespace(f"""
        set -e
        mount --bind "$STATE" "$STATE" && mount -o remount,bind,ro "$STATE"
        touch "$STATE/probe" 2>/dev/null && echo "NOT READ-ONLY"
        {TUNER} reset --device sim0; echo "rc=$?"
        {TUNER} status --json >&2
    """)
    assert "NOT READ-ONLY" not in proc.stdout
    assert "rc=0" in proc.stdout and "reset to stock" in proc.stdout, proc.stdout + proc.stderr
    assert "sim0 is at stock; the state directory could not record this reset (Read-only file system" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert _offset(proc.stderr[proc.stderr.index("{"):]) == 0


@needs_mounts
def test_reset_returns_the_card_to_stock_on_a_full_disk():
    proc = _in_namespace(f"""
        mkdir -p "$HOME_STATE" && mount -t tmpfs -o size=256k tmpfs "$HOME_STATE" || exit 99
        {TUNER} set --device sim0 --offset -30 --yes >/dev/null || exit 98
        dd if=/dev/zero of="$HOME_STATE/fill" bs=4k 2>/dev/null
        echo x > "$HOME_STATE/probe" 2>/dev/null && echo "NOT FULL"
        {TUNER} reset --device sim0; echo "rc=$?"
        {TUNER} status --json
    """)
    assert "NOT FULL" not in proc.stdout, proc.stdout
    assert "rc=0" in proc.stdout and "reset to stock" in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert _offset(proc.stdout[proc.stdout.index("{"):]) == 0


@needs_mounts
def test_a_read_only_simulated_card_says_so_in_one_line():
    """The simulated card itself unwritable (its directory read-only too) is a card that cannot take the
    write, like a real one: one line, exit 3, no traceback."""
    _set_minus_30()
    proc = _in_namespace(f"""
        mount --bind "$HOME_STATE" "$HOME_STATE" && mount -o remount,bind,ro "$HOME_STATE"
        {TUNER} reset --device sim0; echo "rc=$?"
    """)
    assert "rc=3" in proc.stdout, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tuner: error:")]
    assert len(errors) == 1 and "simulated card file" in errors[0] and "Traceback" not in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to run the tuner as another, unprivileged uid")
def test_reset_as_a_user_whose_state_directory_is_mode_0555(tmp_path):
    home = Path(tempfile.mkdtemp(prefix="tuner-nobody-"))  # pytest's own directories are root's alone (0700)
    try:
        _reset_as_nobody(home)
    finally:
        shutil.rmtree(home)


def _reset_as_nobody(home: Path) -> None:
    os.chmod(home, 0o755)
    uid = gid = 65534
    env = {**os.environ, "PYTHONPATH": pythonpath_for_others(), "XDG_STATE_HOME": str(home / "state"),
           "HOME": str(home)}

    def as_user(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                               *python_for_others(), "-m", "tuner", "--simulate", *args], capture_output=True,
                              text=True, env=env, cwd=code_for_others(), timeout=120)

    os.chown(home, uid, gid)
    assert as_user("set", "--device", "sim0", "--offset", "-30", "--yes").returncode == 0
    state = home / "state" / "tuner"
    for directory in (state, state / "locks"):
        os.chmod(directory, 0o555)
    (state / "locks" / "sim0.lock").unlink()  # made by root below: nothing the user could have made
    proc = as_user("reset", "--device", "sim0")
    assert proc.returncode == 0 and "reset to stock" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    assert "reset without the card lock" in proc.stderr and "Permission denied" in proc.stderr
    assert _offset(as_user("status", "--json").stdout) == 0


@needs_mounts
def test_every_writer_over_a_read_only_state_directory_is_one_line_or_works():
    """set, bisect, apply and apply --boot over a read-only state directory (issue 28, item 7): each either works
    (what it needs is only read: an existing lock file takes a read-only flock) or says why in one line with a
    documented code; never a traceback, and the card is never left off stock by a command that failed."""
    from tuner.profiles.store import read_profile_file, save_profile

    for system in (False, True):
        save_profile(read_profile_file(REPO / "tests/profiles/data/v1-sim.toml"), system=system)
    paths.state_dir().mkdir(parents=True)
    bisect = "bisect --device sim0 --trial 5s --confirm 10s --yes"
    commands = ["set --device sim0 --offset -30 --yes", "reset", bisect, "reset", "apply v1-sim --yes", "reset",
                "apply --boot", "reset"]
    script = "\n".join(f'{TUNER} {c}; echo "rc=$?"' for c in commands)
    for first_time in (True, False):  # an empty state directory, then one that holds the lock files
        proc = _in_namespace(f"""
            mount --bind "$STATE" "$STATE" && mount -o remount,bind,ro "$STATE" || exit 99
            {script}
        """)
        assert "Traceback" not in proc.stderr, proc.stderr
        codes = [int(line[3:]) for line in proc.stdout.splitlines() if line.startswith("rc=")]
        # 3: the OS refused a write (the lock file); 2: a state file could not be written (the journal's own
        # StateError: "nothing was changed")
        assert len(codes) == len(commands) and set(codes) <= {0, 2, 3}, (codes, proc.stderr)
        errors = [line for line in proc.stderr.splitlines()  # the boot path logs as `tuner: boot:`
                  if line.startswith(("tuner: error:", "tuner: boot: could not apply"))]
        assert len(errors) == len(codes) - codes.count(0), proc.stderr
        assert codes[1::2] == [0] * 4  # every reset works
        assert _offset(subprocess.run([*TUNER.split(), "status", "--json"], capture_output=True, text=True,
                                      env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO).stdout) == 0
        if first_time:
            _set_minus_30()  # now the lock file exists (and the card is at -30 until the next reset)
