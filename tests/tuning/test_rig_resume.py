"""`kill -9` of a concurrent bisect, then `--resume`: every card resumes (real processes, killed outright; the fake
engine and fake rig trial stand in for the CPU engine so each case takes seconds: tests/tuning/rig_cli_fakes.py).

One rule for a trial open when the tuner died (issue 11), per card and for the rig: left open in this boot, the
tool died, which says nothing about the voltage: inconclusive, it runs again, nothing goes on the unsafe list. Left
open by an earlier boot (the machine reset): a failure, unsafe, never tried again; a rig trial open at a reset is a
whole-machine event: every card backs off one step and that combination is never applied again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli_helpers import REPO
from tuner.backends.simulated import SimulatedBackend
from tuner.core.card_lock import CardBusy, CardLock
from tuner.tuning import journal

SIM = ["--simulate", "--sim-gpus", "2", "--sim-vmin", "-52,-67"]
CARDS = ("sim0", "sim1")
ARGS = ["bisect", "--device", "all", "--trial", "1s", "--confirm", "2s", "--yes", "--json"]


def _tuner(*args: str, block: str = "", **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RIG_FAKE_BLOCK": block}
    return subprocess.Popen([sys.executable, "-m", "tests.tuning.rig_cli_fakes", *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _wait_for(predicate, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the tuner ended early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the tuner")
        time.sleep(0.05)


def _open_at(setting: int) -> bool:
    docs = [journal.load(d) for d in CARDS]
    return all(d is not None and (d.get("open_trial") or {}).get("setting") == setting for d in docs)


def _kill_during_coarse(setting: int) -> None:
    proc = _tuner(*SIM, *ARGS, block=f"engine:{setting}")
    try:
        _wait_for(lambda: _open_at(setting), proc)
        # the journal records a trial before its card is touched: wait for the setting itself (a loaded box can
        # take a while between the two)
        _wait_for(lambda: all(SimulatedBackend(gpus=2).knob(d).current == setting for d in CARDS), proc)
        for d in CARDS:  # a second writer on any card is refused while the rig runs (another process: flock)
            with pytest.raises(CardBusy):
                CardLock(d, "tuner set").acquire()
        assert all(SimulatedBackend(gpus=2).knob(d).current == setting for d in CARDS)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)


def _resume() -> tuple[int, list[dict]]:
    proc = _tuner(*SIM, *ARGS, "--resume")
    out, _err = proc.communicate(timeout=60)
    return proc.returncode, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _tried_after_resume(events: list[dict], device: str) -> list[int]:
    return [e["setting"] for e in events if e["event"] == "trial_started" and e["device"] == device]


def test_kill_9_in_this_boot_then_resume_reruns_the_open_trial_on_every_card(boot):
    _kill_during_coarse(-30)
    code, events = _resume()
    assert code == 0
    started = [e for e in events if e["event"] == "session_started"]
    assert sorted(e["device"] for e in started) == list(CARDS) and all(e["resumed"] for e in started)
    recovered = [e for e in events if e["event"] == "trial_recovered"]
    assert sorted(e["device"] for e in recovered) == list(CARDS)
    assert all(e["result"]["kind"] == "tool-died" and e["result"]["verdict"] == "inconclusive" for e in recovered)
    assert all(_tried_after_resume(events, d)[0] == -30 for d in CARDS)  # the open value runs again
    assert all(journal.unsafe_settings(d) == {} for d in CARDS)
    final = next(e for e in events if e["event"] == "rig_outcome")
    assert final["settings"] == {"sim0": -40, "sim1": -55}
    assert all(SimulatedBackend(gpus=2).knob(d).current == 0 for d in CARDS)


def test_kill_9_then_a_machine_reset_never_retries_the_open_value(boot):
    _kill_during_coarse(-30)
    boot("boot-b")  # the machine reset: the open trials froze it
    code, events = _resume()
    assert code == 0
    assert all(-30 in journal.unsafe_settings(d) for d in CARDS)
    assert all(-30 not in _tried_after_resume(events, d) for d in CARDS)
    assert all(all(s > -30 for s in _tried_after_resume(events, d)) for d in CARDS)
    recs = {e["device"]: e for e in events if e["event"] == "recommendation"}
    assert all(r["edge"] and r["margin"] == 15 for r in recs.values())


def _kill_during_rig_confirm() -> dict[str, int]:
    proc = _tuner(*SIM, *ARGS, block="rig:rig-confirm")
    try:
        def open_confirm() -> bool:
            rig = journal.Journal.open_rig(CARDS, SimulatedBackend(gpus=2))
            return rig is not None and (rig.open_trial or {}).get("phase") == "rig-confirm"

        _wait_for(open_confirm, proc)
        _wait_for(lambda: SimulatedBackend(gpus=2).knob("sim1").current == -55, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    rig = journal.Journal.open_rig(CARDS, SimulatedBackend(gpus=2))
    assert rig is not None and rig.open_trial is not None
    return rig.open_trial["settings"]


def test_kill_9_during_the_rig_confirmation_reruns_it_in_this_boot(boot):
    assert _kill_during_rig_confirm() == {"sim0": -40, "sim1": -55}
    code, events = _resume()
    assert code == 0
    # the per-card searches had finished: not run again; the rig attempt runs again with the same settings
    assert not [e for e in events if e["event"] == "trial_started"]
    confirms = [e["settings"] for e in events if e["event"] == "rig_confirm_started" and e["phase"] == "rig-confirm"]
    assert confirms == [{"sim0": -40, "sim1": -55}]
    assert next(e for e in events if e["event"] == "rig_outcome")["settings"] == {"sim0": -40, "sim1": -55}


def test_a_reset_during_the_rig_confirmation_backs_off_every_card_and_never_applies_it_again(boot):
    left_open = _kill_during_rig_confirm()
    boot("boot-b")
    # the boot path (`tuner apply --boot`) sees the open rig trial and applies nothing
    assert journal.trial_open_at_previous_boot()["settings"] == left_open
    code, events = _resume()
    assert code == 0
    recovered = next(e for e in events if e["event"] == "rig_confirm_finished")
    assert not recovered["passed"] and "reset" in recovered["machine_event"]
    assert recovered["backed_off"] == {"sim0": -35, "sim1": -50}
    confirms = [e["settings"] for e in events if e["event"] == "rig_confirm_started" and e["phase"] == "rig-confirm"]
    assert left_open not in confirms and confirms == [{"sim0": -35, "sim1": -50}]
    assert next(e for e in events if e["event"] == "rig_outcome")["settings"] == {"sim0": -35, "sim1": -50}
    assert journal.Journal.open_rig(CARDS, SimulatedBackend(gpus=2)).doc["never"] == [left_open]
    assert journal.trial_open_at_previous_boot() is None  # closed now


def test_a_combination_that_reset_the_machine_is_never_applied_by_a_later_rig_session(boot):
    """`never` lived in one session's rig journal: --restart discarded the session without recovering its open
    trial, and every new rig journal began with `never=[]`, so the same searches reached the same candidates and
    applied the combination that had reset the machine again (docs/bisect.md: never applied again)."""
    left_open = _kill_during_rig_confirm()
    boot("boot-b")
    for extra in (["--restart"], []):  # a restart of the unfinished session, then a new one after a finished one
        proc = _tuner(*SIM, *ARGS, *extra)
        out, err = proc.communicate(timeout=90)
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        confirms = [e["settings"] for e in events
                    if e["event"] == "rig_confirm_started" and e["phase"] == "rig-confirm"]
        assert confirms and left_open not in confirms, (extra, confirms, err[-2000:])
        assert left_open in journal.Journal.open_rig(CARDS, SimulatedBackend(gpus=2)).doc["never"]
