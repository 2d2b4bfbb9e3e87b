"""The journal: durable open trials, previous-boot detection, the unsafe list."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tuner.core.errors import DamagedState
from tuner.tuning import journal


def test_no_journal_means_nothing_open(boot):
    assert journal.trial_open_at_previous_boot() is None


def test_open_trial_this_boot_is_not_previous_boot(boot, in_process_backend):
    j = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)
    j.begin_trial("coarse", setting=-50)
    assert journal.trial_open_at_previous_boot() is None


def test_open_trial_from_previous_boot_is_reported(boot, in_process_backend):
    j = journal.Journal.create("0000:03:00.0", params={}, knob={}, backend=in_process_backend)
    j.begin_trial("refine", setting=-60)
    boot("boot-b")
    trial = journal.trial_open_at_previous_boot()
    assert trial is not None
    assert trial["setting"] == -60 and trial["boot_id"] == "boot-a" and trial["device"] == "0000:03:00.0"
    assert trial["phase"] == "refine" and trial["pid"] == os.getpid()


def test_closed_trial_is_not_reported(boot, in_process_backend):
    j = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)
    j.begin_trial("coarse", setting=-50)
    j.finish_trial({"setting": -50, "phase": "coarse", "verdict": "pass"})
    boot("boot-b")
    assert journal.trial_open_at_previous_boot() is None
    doc = json.loads(journal.journal_path("sim0").read_text())
    assert doc["trials"][0]["verdict"] == "pass" and doc["open_trial"] is None


def test_unreadable_boot_id_counts_dead_pid(tmp_path, monkeypatch, in_process_backend):
    monkeypatch.setenv("TUNER_SYSFS_ROOT", str(tmp_path / "nothing"))
    j = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)
    j.begin_trial("coarse", setting=-50)
    assert journal.trial_open_at_previous_boot() is None  # our own pid is alive
    j.doc["open_trial"]["pid"] = 2**22 + 12345  # no such process
    j._save()
    assert journal.trial_open_at_previous_boot()["setting"] == -50


def test_unsafe_list_is_append_only_and_survives_a_new_session(boot, in_process_backend):
    journal.add_unsafe("sim0", -90, unit="mV", kind="system-reset", reason="machine reset", edge=True)
    journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)  # a new session
    journal.add_unsafe("sim0", -70, unit="mV", kind="tool-died", reason="tool died", edge=False)
    assert sorted(journal.unsafe_settings("sim0")) == [-90, -70]
    assert journal.unsafe_settings("sim0")[-90]["edge"] is True
    assert journal.unsafe_settings("sim1") == {}


def test_corrupt_journal_is_a_state_error(boot):
    path = journal.journal_path("sim0")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(journal.StateError):
        journal.load("sim0")
    # at boot an unreadable journal might have held an open trial: report it so nothing is applied
    assert "unreadable" in journal.trial_open_at_previous_boot()["reason"]


def test_guarded_trial_left_open_blocks_boot_and_becomes_unsafe(boot, in_process_backend):
    with journal.guarded_trial("sim0", -70, unit="mV", backend=in_process_backend):
        assert journal.trial_open_at_previous_boot() is None  # this boot, live pid
    assert not journal.guard_path("sim0").exists()  # a finished trial leaves nothing behind

    # a trial interrupted by a freeze: the guard survives the "reboot"
    guard = journal.guarded_trial("sim0", -75, unit="mV", backend=in_process_backend)
    guard.__enter__()
    boot("boot-b")
    assert journal.trial_open_at_previous_boot()["setting"] == -75
    assert journal.recover_stale_guard("sim0", "mV", 0)["setting"] == -75
    assert journal.unsafe_settings("sim0")[-75]["kind"] == "system-reset"
    assert journal.trial_open_at_previous_boot() is None


@pytest.mark.parametrize(("theirs", "pid", "readable", "owner"), [
    ("boot-b", "parent", True, journal.Owner.EARLIER_BOOT),  # another boot: a live pid there is a reused number
    ("boot-a", "parent", True, journal.Owner.RUNNING),  # another live process in this boot
    ("boot-a", "gone", True, journal.Owner.TOOL_DIED),  # this boot, its process is gone
    ("boot-a", "self", True, journal.Owner.TOOL_DIED),  # this process's own earlier job: no reset since
    ("boot-a", "gone", False, journal.Owner.UNKNOWN_BOOT),  # unreadable now: a reset cannot be ruled out
    (None, "gone", True, journal.Owner.UNKNOWN_BOOT),  # unreadable then: the same
    # a live pid without both boot ids: maybe a number reused after a reset (at boot the low ones all are): fail closed
    (None, "parent", False, journal.Owner.UNKNOWN_BOOT),
    ("boot-a", "parent", False, journal.Owner.UNKNOWN_BOOT),
    (None, "parent", True, journal.Owner.UNKNOWN_BOOT),
    (None, "self", False, journal.Owner.TOOL_DIED),  # this process's own: no reset since it started
])
def test_one_rule_says_who_left_an_open_trial(boot, theirs, pid, readable, owner):
    # pids by role, resolved here: a pid in the test's id would differ between pytest-xdist's workers
    pid = {"parent": os.getppid(), "self": os.getpid(), "gone": 2**22 + 12345}[pid]
    if not readable:
        (boot.root / "proc/sys/kernel/random/boot_id").unlink()
    got = journal.classify_open_trial({"boot_id": theirs, "pid": pid, "setting": -40, "phase": "coarse"})
    assert got == owner
    assert got.machine_may_have_reset == (owner in (journal.Owner.EARLIER_BOOT, journal.Owner.UNKNOWN_BOOT))


@pytest.mark.parametrize("where", ["journal", "guard"])
def test_a_dead_bisects_pid_reused_by_another_process_is_not_a_running_bisect(boot, in_process_backend, where):
    # a bisect killed with kill -9 whose pid a stranger takes later in the same boot: the trial named its writer by
    # pid alone, so it read as running: --resume and --restart were refused until the stranger ended, and
    # `tuner status` hid the value the dead tool may have left on the card
    stranger = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started = boot.process(stranger.pid)
        dead_bisect = {"pid": stranger.pid, "pid_start_ticks": started - 1}  # the same number, an earlier process
        if where == "journal":
            j = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)
            j.begin_trial("coarse", setting=-50)
            j.doc["open_trial"].update(dead_bisect)
            j._save()
        else:
            trial = {"setting": -50, "phase": "verify", "boot_id": "boot-a", "started_at": 1.7e9, **dead_bisect}
            journal.guard_path("sim0").parent.mkdir(parents=True)
            journal.guard_path("sim0").write_text(json.dumps({"open_trial": trial}))
        leftover = journal.leftover_trial("sim0")
        assert leftover is not None and leftover["owner"] == journal.Owner.TOOL_DIED, leftover
        assert leftover["setting"] == -50
        # the stranger really is the writer when its start time is the recorded one: it is running that trial
        assert journal.classify_open_trial({**dead_bisect, "pid_start_ticks": started, "boot_id": "boot-a"}) \
            == journal.Owner.RUNNING
    finally:
        stranger.stdin.close()
        stranger.wait()


def test_every_open_trial_names_its_writer_by_pid_and_start_time(boot, in_process_backend):
    me = boot.process(os.getpid())
    with journal.guarded_trial("sim0", -50, unit="mV", backend=in_process_backend):
        assert journal.load_guard("sim0")["open_trial"]["pid_start_ticks"] == me
    trial = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend).begin_trial(
        "coarse", setting=-50)
    assert (trial["pid"], trial["pid_start_ticks"]) == (os.getpid(), me) == \
        (journal.load("sim0")["open_trial"]["pid"], journal.load("sim0")["open_trial"]["pid_start_ticks"])


def test_this_pid_with_another_start_time_is_an_earlier_process_not_this_one(boot):
    # our pid in a trial we did not write (an earlier process had the number): a reset since that trial cannot be
    # ruled out when a boot id is unreadable, so it is not "this process's own earlier job"
    mine = {"pid": os.getpid(), "pid_start_ticks": boot.process(os.getpid()), "setting": -40, "phase": "coarse"}
    earlier = {**mine, "pid_start_ticks": mine["pid_start_ticks"] - 1}
    assert journal.classify_open_trial({**mine, "boot_id": "boot-a"}) == journal.Owner.TOOL_DIED
    assert journal.classify_open_trial({**earlier, "boot_id": "boot-a"}) == journal.Owner.TOOL_DIED
    (boot.root / "proc/sys/kernel/random/boot_id").unlink()
    assert journal.classify_open_trial({**mine, "boot_id": None}) == journal.Owner.TOOL_DIED
    assert journal.classify_open_trial({**earlier, "boot_id": None}) == journal.Owner.UNKNOWN_BOOT


@pytest.mark.parametrize("where", ["journal", "guard"])
def test_a_pid_no_process_can_have_is_damage_not_a_traceback(boot, in_process_backend, where):
    # pid_t is 32 bits: a hand-edited pid of 2**31 passed the schema, and asking whether it is alive (same boot)
    # raised OverflowError in status, bisect and verify
    if where == "journal":
        j = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)
        j.begin_trial("coarse", setting=-50)
        j.doc["open_trial"]["pid"] = 2**31
        j._save()
    else:
        trial = {"setting": -50, "phase": "verify", "boot_id": "boot-a", "pid": 2**31, "started_at": 1.7e9}
        journal.guard_path("sim0").parent.mkdir(parents=True)
        journal.guard_path("sim0").write_text(json.dumps({"open_trial": trial}))
    with pytest.raises(DamagedState, match="open trial: 'pid' is not a whole number from 1 to 2147483647"):
        journal.leftover_trial("sim0")


def test_a_verify_at_stock_that_a_reset_ended_does_not_put_stock_on_the_unsafe_list(boot, in_process_backend):
    # the one rule (record_hard_failure) never lists stock: the card cannot avoid it, and listed it blocks every
    # setting (set, apply, bisect). The stale verify guard added its setting itself, stock included
    guard = journal.guarded_trial("sim0", 0, unit="mV", backend=in_process_backend)
    guard.__enter__()
    boot("boot-b")
    with journal.guarded_trial("sim0", -10, unit="mV", backend=in_process_backend):
        pass
    assert 0 not in journal.unsafe_settings("sim0")



def test_a_verify_a_reset_ended_is_recorded_in_the_unit_and_under_the_serial_of_the_card_it_ran_on(boot):
    """A -40 mV verify (apply --verify) reset the machine; another kind of card (a clock offset in MHz) is in the
    slot at the next guarded trial. The guard kept neither unit nor serial, so the recovery recorded -40 in the
    new card's unit with no serial: -40 MHz, which blocks the new card's stock, while the card that crashed (the
    root helper counts only entries in a card's own unit, and files a line with no serial under the slot's card)
    kept no refusal of -40 mV."""
    from tuner.backends.simulated import SimulatedBackend

    crashed = SimulatedBackend(state_path=boot.root.parent / "amd")
    guard = journal.guarded_trial("sim0", -40, unit="mV", backend=crashed)
    guard.__enter__()
    boot("boot-b")
    swapped = SimulatedBackend(kind="nvidia", seed=1, state_path=boot.root.parent / "nvidia")
    assert swapped.knob("sim0").unit == "MHz"
    with journal.guarded_trial("sim0", 30, unit="MHz", backend=swapped):
        pass
    [entry] = journal.own_unsafe_entries("sim0")
    assert (entry["setting"], entry["unit"], entry["serial"]) == (-40, "mV", crashed.device("sim0").serial)


# --- a journal directory its user cannot list (Path.glob answers it as empty) ------------------------------------
_NOBODY = 65534


def _as_nobody(home, code: str):
    """Run `code` (with `journal` imported) as an unprivileged uid for real: root lists any directory, so only
    another uid meets the EACCES a mode-0311 directory gives on listing (while its files stay reachable)."""
    import subprocess

    from tests.for_others import code_for_others, python_for_others, pythonpath_for_others

    env = {**os.environ, "PYTHONPATH": pythonpath_for_others(), "XDG_STATE_HOME": str(home / "state"),
           "HOME": str(home), "TUNER_SYSFS_ROOT": str(home / "sysroot"), "TUNER_STATE_DIR": str(home / "machine")}
    return subprocess.run(["setpriv", f"--reuid={_NOBODY}", f"--regid={_NOBODY}", "--clear-groups",
                           *python_for_others(), "-c", f"from tuner.tuning import journal\n{code}"],
                          capture_output=True, text=True, env=env, cwd=code_for_others(), timeout=120)


@pytest.fixture
def nobody_home(monkeypatch):
    """A state directory owned by an unprivileged uid, with a fake boot id it can read; its journal directory is
    made unlistable (mode 0311) by `unlistable`. Under /tmp: pytest's own directories are root's alone (0700)."""
    import shutil
    import tempfile
    from pathlib import Path

    from tests.conftest import FakeBoot

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root to run the check as another, unprivileged uid")
    home = Path(tempfile.mkdtemp(prefix="tuner-nobody-"))
    os.chmod(home, 0o755)
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))
    boot = FakeBoot(home / "sysroot")
    boot("boot-a")
    monkeypatch.setenv("TUNER_SYSFS_ROOT", str(boot.root))
    journal.journal_dir().mkdir(parents=True)
    try:
        yield home, boot
    finally:
        shutil.rmtree(home)


def _unlistable(home) -> None:
    for directory, _dirs, files in os.walk(home / "state"):
        for name in [directory, *(os.path.join(directory, f) for f in files)]:
            os.chown(name, _NOBODY, _NOBODY)
    os.chmod(journal.journal_dir(), 0o311)  # its owner may reach and write its files, not list them


def test_a_journal_directory_its_user_cannot_list_fails_the_safety_check_closed(nobody_home):
    """A torn rig journal holding the card (which might hold the value that crashed the machine) is only found by
    listing the directory: one that cannot be listed is not "no rig journal", it is a check that cannot be made."""
    home, _boot = nobody_home
    journal.rig_path(["sim0", "sim1"]).write_bytes(b'{"open_trial": {"settings": {"sim0": -1')  # torn
    with pytest.raises(DamagedState):
        journal.check_safety_state("sim0")  # as root, who lists anything: the torn file is found
    _unlistable(home)
    proc = _as_nobody(home, """
try:
    journal.check_safety_state("sim0")
    print("passed")
except journal.StateError as e:
    print(type(e).__name__, "|", e.message, "|", e.remedy)
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("DamagedState |") and "Permission denied" in proc.stdout, proc.stdout
    assert len(proc.stdout.strip().splitlines()) == 1


def test_a_journal_directory_the_boot_path_cannot_list_answers_a_crash_cannot_be_ruled_out(nobody_home,
                                                                                           in_process_backend):
    home, boot = nobody_home
    j = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)
    j.begin_trial("refine", setting=-60)
    boot("boot-b")  # the machine reset during the trial
    assert journal.trial_open_at_previous_boot()["setting"] == -60  # as root: found
    _unlistable(home)
    proc = _as_nobody(home, "print(journal.trial_open_at_previous_boot())")
    assert proc.returncode == 0, proc.stderr
    assert "cannot be ruled out" in proc.stdout and "Permission denied" in proc.stdout, proc.stdout


def test_a_mark_appended_after_a_torn_line_is_a_line_of_its_own(boot):
    """A crash mid-append leaves the unsafe list's last line without its newline (ext4 keeps what reached the
    disk: 'data=ordered' orders data before metadata, not whole lines). The next mark must start a line of its
    own: glued to the torn one, both values would be in one damaged line, and deleting that line by hand (as the
    error's remedy says) would forget the new one too."""
    path = journal.unsafe_path("sim0")
    path.parent.mkdir(parents=True)
    path.write_text('{"setting": -40, "kind": "hang", "ed')  # torn: no closing brace, no newline
    journal.add_unsafe("sim0", -65, unit="mV", kind="reset", reason="the machine reset", edge=True)
    with pytest.raises(DamagedState, match="line 1 "):
        journal.own_unsafe_entries("sim0")
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["setting"] == -65
    path.write_text(lines[1] + "\n")  # the remedy: delete the torn line
    assert [e["setting"] for e in journal.own_unsafe_entries("sim0")] == [-65]
