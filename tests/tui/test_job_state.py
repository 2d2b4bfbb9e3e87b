"""The UI's job state is an immutable snapshot: each event gives a new one (dispatched by the event's type), the old
one is untouched, and nothing can be assigned on it."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.app.jobs import apply_bisect_event, apply_stress_event
from tuner.app.state import LOG_LINES, BisectState, StressState
from tuner.tuning.engine_client import FaultEvent, StepEvent
from tuner.tuning.events import BisectStopped, TrialFinished, TrialResult, TrialStarted


def test_stress_events_give_new_snapshots():
    before = StressState(device_id="sim0", running=True)
    after = apply_stress_event(before, StepEvent(t=1.0, raw={}, step=10, loss=2.5, tok_s=900.0))
    after = apply_stress_event(after, FaultEvent(t=2.0, raw={}, kind="canary", step=11, detail="mismatch"))
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


def test_bisect_events_replace_rows_without_mutating_the_old_snapshot():
    start = TrialStarted(index=1, setting=-10, unit="mV", phase="coarse", duration_s=5.0, started_at=0.0)
    running = apply_bisect_event(BisectState(device_id="sim0", running=True), start)
    result = TrialResult(setting=-10, unit="mV", phase="coarse", verdict="pass")
    done = apply_bisect_event(running, TrialFinished(index=1, result=result))
    assert running.trials[0]["verdict"] == "running" and running.current["progress"] == 0.0
    assert [r["verdict"] for r in done.trials] == ["pass"] and done.current["progress"] == 1.0
    start2 = TrialStarted(index=2, setting=-20, unit="mV", phase="coarse", duration_s=5.0, started_at=0.0)
    stopped = apply_bisect_event(apply_bisect_event(done, start2), BisectStopped(reason="you", resumable=True))
    assert [r["verdict"] for r in stopped.trials] == ["pass", "stopped"] and "u resumes" in stopped.failure
