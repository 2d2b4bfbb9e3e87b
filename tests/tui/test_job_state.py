"""The UI's job state is an immutable snapshot: each event gives a new one (dispatched by the event's type), the old
one is untouched, and nothing can be assigned on it."""

from __future__ import annotations

import dataclasses

import pytest

from tests.engine.examples import example
from tuner.app.jobs import apply_bisect_event, apply_card_event, apply_stress_event
from tuner.app.state import LOG_LINES, BisectState, CardState, StressState
from tuner.tuning.events import BisectStopped, TrialFinished, TrialResult, TrialStarted


def test_stress_events_give_new_snapshots():
    before = StressState(device_id="sim0", running=True)
    after = apply_stress_event(before, example("step", step=10, loss=2.5, tok_s=900.0))
    after = apply_stress_event(after, example("fault", kind="canary", step=11, detail="mismatch", figure=None))
    assert before.steps == () and before.log == ()
    assert after.steps == ((10, 2.5, 900.0),)
    assert after.detector("canary") == "FAULT at step 11"
    assert after.log[-1] == "FAULT canary at step 11: mismatch"
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.running = False  # type: ignore[misc]


def test_the_stress_log_is_bounded():
    state = StressState()
    for i in range(LOG_LINES + 5):
        state = apply_stress_event(state, f"line {i}")
    assert len(state.log) == LOG_LINES and state.log_written == LOG_LINES + 5
    assert state.log[-1] == f"line {LOG_LINES + 4}"


def test_an_unknown_event_changes_nothing():
    state = StressState()
    assert apply_stress_event(state, object()) is state
    assert apply_bisect_event(BisectState(), object()) == BisectState()
    assert apply_card_event(CardState(), object()) == CardState()


def test_bisect_events_replace_rows_without_mutating_the_old_snapshot():
    start = TrialStarted(index=1, setting=-10, unit="mV", phase="coarse", duration_s=5.0, started_at=0.0)
    running = apply_card_event(CardState(device_id="sim0", running=True), start)
    result = TrialResult(setting=-10, unit="mV", phase="coarse", verdict="pass")
    done = apply_card_event(running, TrialFinished(index=1, result=result))
    assert running.trials[0]["verdict"] == "running" and running.current["progress"] == 0.0
    assert [r["verdict"] for r in done.trials] == ["pass"] and done.current["progress"] == 1.0
    start2 = TrialStarted(index=2, setting=-20, unit="mV", phase="coarse", duration_s=5.0, started_at=0.0)
    stopped = apply_card_event(apply_card_event(done, start2), BisectStopped(reason="you", resumable=True))
    assert [r["verdict"] for r in stopped.trials] == ["pass", "stopped"] and "u resumes" in stopped.failure


def test_rig_events_go_to_their_card_and_the_rig_rows_without_mutating_the_old_snapshot():
    from tuner.app.state import running_label
    from tuner.tuning.events import RigConfirmFinished, RigConfirmStarted, TrialWarning

    rig = BisectState.started(("sim0", "sim1"))
    start = TrialStarted(index=3, setting=-20, unit="mV", phase="coarse", duration_s=5.0, started_at=0.0,
                         device="sim1")
    searching = apply_bisect_event(rig, start)
    assert rig.card("sim1").trials == () and searching.card("sim1").trials[0]["setting"] == -20
    assert searching.card("sim0").trials == ()  # another card's event is not this card's
    assert running_label(StressState(), searching, "sim1", compact=True) == "BISECT trial 3 at -20 mV"
    assert apply_bisect_event(searching, dataclasses.replace(start, device="sim9")) == searching  # not in this rig
    confirming = apply_bisect_event(searching, RigConfirmStarted(settings={"sim0": -40, "sim1": -55},
                                                              unit_by_device={"sim0": "mV", "sim1": "mV"},
                                                              duration_s=120.0, attempt=1, phase="rig-confirm"),
                                 now_s=100.0)
    assert running_label(StressState(), confirming, "sim0") == "RIG confirm 1 at -40 mV"
    failed = apply_bisect_event(confirming, RigConfirmFinished(attempt=1, passed=False, pinned=("sim1",),
                                                            machine_event=None,
                                                            backed_off={"sim0": -40, "sim1": -50},
                                                            reasons={"sim1": "fail (mismatch)"}))
    assert confirming.attempts[0]["verdict"] == "running" and confirming.current["started_s"] == 100.0
    [row] = failed.attempts
    assert row["verdict"] == "fail" and row["pinned"] == ("sim1",) and row["backed_off"]["sim1"] == -50
    assert failed.current is None
    warned = apply_bisect_event(failed, TrialWarning("the rig run was slow", device="rig"))
    assert warned.warnings == ("the rig run was slow",)


@pytest.mark.parametrize(("mode", "detector"), [("hip-abort", "device errors"), ("silent-hang", "watchdog")])
def test_a_fault_the_client_found_shows_on_its_detector(tmp_path, monkeypatch, mode, detector):
    """A hang (the watchdog's) or a device error read from the engine's stderr has no `fault` event from the
    engine: the run ended FAIL while the Tune screen's detectors still said `watchdog ok` / `device errors ok`."""
    import sys
    from pathlib import Path

    from tests.tui.helpers import sim_backend
    from tuner.actions import stress as stress_action
    from tuner.app.jobs import StressJob
    from tuner.tuning import engine_client as sc

    fake = Path(__file__).parents[1] / "engine" / "fake_engine.py"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    wrapper.chmod(0o755)
    fast = sc.WatchdogPolicy(min_silence_s=0.6, silence_factor=20, first_step_timeout_s=5, kill_grace_s=0.5,
                             poll_s=0.05)
    monkeypatch.setattr(stress_action, "default_engine_factory", lambda config, _policy: sc.StressRun(
        dataclasses.replace(config, python=str(wrapper), env={"FAKE_ENGINE_MODE": mode}), watchdog=fast))
    events: list[object] = []
    job = StressJob(sim_backend(tmp_path), "sim0", preset="tiny", mode="train", emit=events.append,
                    without_reference=True)
    summary = job.run()
    state = StressState(device_id="sim0", running=True)
    for event in events:
        state = apply_stress_event(state, event)
    assert summary.startswith("FAIL"), summary
    assert state.detector(detector).startswith("FAULT"), (summary, state.detectors)
