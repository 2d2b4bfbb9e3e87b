"""`run_trial`'s cleanup cannot be skipped: an exception injected at every step of a trial still leaves the card at
stock (read back) and stops everything the trial started (kernel-log watcher, telemetry sampler, load marker,
engine, stop-watcher thread)."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest

from tests.tuning.fake_engine import FakeEngine
from tuner.backends.simulated import SimulatedBackend
from tuner.tuning import kernel_log, trial
from tuner.tuning.sampler import TelemetrySampler
from tuner.tuning.trial import TrialParams, run_trial


class Boom(Exception):
    """Not a TunerError: something nobody expected."""


class Faults:
    def __init__(self, point: str | None):
        self.point, self.reached = point, []

    def check(self, name: str) -> None:
        self.reached.append(name)
        if name == self.point:
            raise Boom(name)


class FaultyBackend(SimulatedBackend):
    """The simulated card, failing where told. apply and note_load fail *after* doing their work (the strictest
    case: a half-done call that raises)."""

    def __init__(self, faults: Faults, **kw):
        super().__init__(**kw)
        self.faults = faults

    def apply(self, device_id, value, *, allow_overvolt=False):
        knob = super().apply(device_id, value, allow_overvolt=allow_overvolt)
        if value != 0:
            self.faults.check("apply")
        return knob

    def note_load(self, device_id, active):
        super().note_load(device_id, active)
        self.faults.check(f"note_load_{'start' if active else 'end'}")

    def stress_target(self, device_id):
        self.faults.check("stress_target")
        return super().stress_target(device_id)

    def loaded(self) -> bool:
        return "load_pid" in self._stored("sim0")


class FaultyWatcher(kernel_log.NullWatcher):
    def __init__(self, faults: Faults):
        super().__init__()
        self.faults, self.started, self.stopped = faults, False, False

    def start(self):
        self.started = True
        self.faults.check("watcher_start")
        return super().start()

    def stop(self):
        self.stopped = True
        events = super().stop()
        self.faults.check("watcher_stop")
        return events


class FaultySampler(TelemetrySampler):
    made: ClassVar[list[FaultySampler]] = []
    faults: ClassVar[Faults]

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        FaultySampler.made.append(self)

    def start(self):
        super().start()
        self.faults.check("sampler_start")
        return self

    def stop(self):
        summary = super().stop()
        self.faults.check("sampler_stop")
        return summary


class FaultyRun:
    """The fake engine's run, failing where told; it records whether it was stopped."""

    def __init__(self, run, faults: Faults):
        self.run, self.faults = run, faults

    def start(self):
        self.run.start()
        self.faults.check("engine_start")

    def events(self):
        for i, ev in enumerate(self.run.events()):
            if i == 2:
                self.faults.check("mid_events")
            yield ev

    def stop(self):
        self.run.stop()
        self.faults.check("engine_stop")

    def result(self, timeout=None):
        self.faults.check("engine_result")
        return self.run.result()


POINTS = ["watcher_start", "apply", "note_load_start", "stress_target", "sampler_start", "engine_factory",
          "engine_start", "mid_events", "engine_result", "engine_stop", "sampler_stop", "note_load_end",
          "watcher_stop"]


def _run(tmp_path, monkeypatch, point):
    faults = Faults(point)
    backend = FaultyBackend(faults, vmin_mv=-50, state_path=tmp_path / "sim.json")
    watcher = FaultyWatcher(faults)
    engine = FakeEngine()
    runs = []

    def factory(config, watchdog):
        faults.check("engine_factory")
        run = FaultyRun(engine(config, watchdog), faults)
        runs.append(run)
        return run

    FaultySampler.made, FaultySampler.faults = [], faults
    monkeypatch.setattr(trial, "TelemetrySampler", FaultySampler)
    params = TrialParams(phase="coarse", duration_s=1, telemetry_interval_s=0.05, progress_interval_s=0.0)
    outcome = None
    try:
        outcome = run_trial(backend, {"sim0": -20}, params, engine_factory=factory,
                            kernel_watcher_factory=lambda _card: watcher).result
    except Boom as e:
        assert str(e) == point
    else:
        assert point is None, f"{point} was never reached: {faults.reached}"
    return faults, backend, watcher, engine, runs, outcome


def _assert_everything_undone(backend, watcher, engine, runs):
    assert backend.knob("sim0").current == 0  # the card ends at stock, read back
    assert SimulatedBackend(state_path=backend.state_path).knob("sim0").current == 0  # ... and on disk
    assert not backend.loaded()  # the load ended
    assert watcher.stopped or not watcher.started
    assert all(not s._thread.is_alive() for s in FaultySampler.made)  # every sampler that started, stopped
    assert all(r.run.stopped for r in runs) and all(r.stopped for r in engine.runs)  # every engine, stopped
    assert not [t for t in threading.enumerate() if t.name.startswith("trial-follow")]  # the event follower ended


@pytest.mark.parametrize("point", POINTS)
def test_an_exception_at_any_step_still_ends_at_stock_with_everything_stopped(tmp_path, monkeypatch, point):
    faults, backend, watcher, engine, runs, _ = _run(tmp_path, monkeypatch, point)
    assert point in faults.reached
    _assert_everything_undone(backend, watcher, engine, runs)
    if POINTS.index(point) >= POINTS.index("apply"):
        assert "apply" in faults.reached  # the setting was written, and still undone


def test_the_cleanup_runs_in_order_after_a_passing_trial(tmp_path, monkeypatch):
    faults, backend, watcher, engine, runs, outcome = _run(tmp_path, monkeypatch, None)
    assert outcome.verdict == "pass" and outcome.setting == -20
    _assert_everything_undone(backend, watcher, engine, runs)
    tail = [p for p in faults.reached if p in ("engine_stop", "sampler_stop", "note_load_end", "watcher_stop")]
    assert tail == ["engine_stop", "sampler_stop", "note_load_end", "watcher_stop"]


def test_a_trial_stopped_before_it_starts_writes_nothing(tmp_path, monkeypatch):
    backend = FaultyBackend(Faults(None), state_path=tmp_path / "sim.json")
    stop = threading.Event()
    stop.set()
    result = run_trial(backend, {"sim0": -20}, TrialParams(phase="coarse", duration_s=1), stop=stop,
                       engine_factory=FakeEngine(),
                       kernel_watcher_factory=lambda _card: kernel_log.NullWatcher()).result
    assert result.verdict == "stopped" and backend.knob("sim0").current == 0 and not backend.loaded()
