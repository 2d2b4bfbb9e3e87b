"""`run_trial`'s cleanup cannot be skipped: an exception at any phase of a whole-rig trial (a half-done apply on
the second card, the load marker, the engine's start, a broken event consumer, an interrupt while the ranks run, a
failing reset of one card), a stop, or an engine that dies, still leaves EVERY card at stock (read back) and
unloaded, and stops every engine and the kernel-log watcher. Uses the strict fake group engine (no real engines)."""

from __future__ import annotations

import threading

import pytest

from tests.tuning.rig_fakes import FakeGroupEngine
from tuner.backends.simulated import SimulatedBackend
from tuner.core.errors import NotApplied
from tuner.tuning import kernel_log, trial
from tuner.tuning.engine_client import WatchdogPolicy
from tuner.tuning.events import TrialProgress
from tuner.tuning.trial import TrialParams, run_trial

FAST = WatchdogPolicy(min_silence_s=0.5, first_step_timeout_s=30, kill_grace_s=1, poll_s=0.05)
CARDS = ("sim0", "sim1", "sim2")
SETTINGS = {"sim0": -40, "sim1": -55, "sim2": -30}


class Boom(Exception):
    """Not a TunerError: something nobody expected."""


class FaultyBackend(SimulatedBackend):
    """Fails where told, on the second card, *after* doing the work (the strictest case: a half-done call)."""

    def __init__(self, point: str | None, **kw):
        super().__init__(**kw)
        self.point = point
        self.resets: list[str] = []

    def apply(self, device_id, value, *, allow_overvolt=False):
        knob = super().apply(device_id, value, allow_overvolt=allow_overvolt)
        if self.point == "apply" and device_id == "sim1" and value != 0:
            raise Boom("apply")
        return knob

    def note_load(self, device_id, active):
        super().note_load(device_id, active)
        if self.point == f"note_load_{active}" and device_id == "sim1":
            raise Boom("note_load")

    def stress_target(self, device_id):
        if self.point == "stress_target" and device_id == "sim1":
            raise Boom("stress_target")
        return super().stress_target(device_id)

    def reset(self, device_id):
        self.resets.append(device_id)
        knob = super().reset(device_id)
        if self.point == "reset" and device_id == "sim1":
            raise NotApplied("sim1 did not return to stock", "reboot")
        return knob


class Watcher(kernel_log.NullWatcher):
    def __init__(self, point: str | None):
        super().__init__()
        self.point, self.stopped = point, False

    def start(self):
        if self.point == "watcher_start":
            raise Boom("watcher_start")
        return super().start()

    def stop(self):
        self.stopped = True
        return super().stop()


def _all_clean(backend: FaultyBackend, engine: FakeGroupEngine, watcher: Watcher) -> None:
    for d in CARDS:
        knob = backend.knob(d)
        assert knob.current == knob.stock, d
        assert not backend._loaded(d), d
    assert all(run._stopped.is_set() or run._done.is_set() for run in engine.runs)
    assert watcher.stopped


def _run(backend, engine, watcher, tmp_path, *, on_event=None, stop=None, duration_s=600.0):
    refs = {d: tmp_path / f"{d}.json" for d in CARDS}
    for p in refs.values():
        p.write_text("{}")
    return run_trial(backend, SETTINGS, TrialParams(phase="rig-confirm", duration_s=duration_s, mode="mixed",
                                                    reference_paths=refs, watchdog=FAST, peer_grace_s=0.2,
                                                    progress_interval_s=0.0),
                     on_event, stop or threading.Event(), engine_factory=engine,
                     kernel_watcher_factory=lambda d: watcher)


@pytest.mark.parametrize("point", ["apply", "note_load_True", "note_load_False", "stress_target", "watcher_start",
                                   "engine_factory", "engine_start", "on_event", "interrupt", "reset"])
def test_an_exception_at_any_phase_leaves_every_card_at_stock(point, tmp_path, monkeypatch):
    backend = FaultyBackend(point, gpus=3, vmin_mv=(-52, -67, -40))
    watcher = Watcher(point)
    fake = FakeGroupEngine()
    made = []

    def engine(request, watchdog):
        if point == "engine_factory" and request.options.rank == 1:
            raise Boom("engine_factory")
        run = fake(request, watchdog)
        if point == "engine_start" and request.options.rank == 2:
            def start():
                raise Boom("engine_start")
            run.start = start
        made.append(run)
        return run

    def on_event(event):
        if point == "on_event" and isinstance(event, TrialProgress) and event.device == "sim2":
            raise Boom("on_event")

    if point == "interrupt":
        real = trial._supervise

        def interrupted(ranks, *args):
            for r in ranks.values():  # once every rank trains
                while r.run is None or not r.run.started:
                    pass
            raise KeyboardInterrupt

        monkeypatch.setattr(trial, "_supervise", interrupted)
        assert real is not interrupted
    expected = {"reset": NotApplied, "interrupt": KeyboardInterrupt, "note_load_False": Boom}.get(point, Boom)
    at_the_end = point in ("note_load_False", "reset")  # only reached on the way out: a short run
    with pytest.raises(expected):
        _run(backend, fake if point not in ("engine_factory", "engine_start") else engine, watcher, tmp_path,
             on_event=on_event, duration_s=0.3 if at_the_end else 600.0)
    _all_clean(backend, fake, watcher)
    if point == "reset":  # the card whose reset failed did not stop the others' resets
        assert set(backend.resets) >= set(CARDS)


def test_a_stop_leaves_every_card_at_stock(tmp_path):
    backend = FaultyBackend(None, gpus=3, vmin_mv=(-52, -67, -40))
    watcher, stop = Watcher(None), threading.Event()
    engine = FakeGroupEngine(on_start=lambda request: threading.Timer(0.2, stop.set).start())
    assert _run(backend, engine, watcher, tmp_path, stop=stop).stopped
    _all_clean(backend, engine, watcher)


def test_an_engine_that_dies_is_pinned_and_every_card_is_back_at_stock(tmp_path):
    backend = FaultyBackend(None, gpus=3, vmin_mv=(-52, -67, -40))
    watcher, engine = Watcher(None), FakeGroupEngine(crash_rank=1)
    res = _run(backend, engine, watcher, tmp_path)
    assert res.pinned == ("sim1",) and res.results["sim1"].kind == "crash"
    assert {res.results[d].verdict for d in ("sim0", "sim2")} == {"inconclusive"}
    _all_clean(backend, engine, watcher)
