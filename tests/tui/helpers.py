"""Shared pieces for the TUI tests: a fake clock, a seeded simulated GPU and an App that does not sample."""

from __future__ import annotations

from pathlib import Path

from tests.polling import until
from tuner.actions.doctor import Check
from tuner.app.tuner_app import TunerApp
from tuner.backends.simulated import SimulatedBackend

T0_S = 1_750_000_000.0  # a fixed wall-clock start for simulated telemetry


class FakeClock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


FAKE_CHECKS = [
    Check("python", "ok", "Python 3.11"),
    Check("simulated gpu", "info", "SIMULATED GPUs in use: no hardware is read or written"),
    Check("torch", "warn", "CPU-only torch build", "install a CUDA or ROCm build of torch"),
    Check("kernel log", "fail", "cannot read the kernel log", "add yourself to the systemd-journal group"),
]


def sim_backend(tmp_path: Path, *, gpus: int = 1, seed: int = 0, vmin_mv: int | None = -60) -> SimulatedBackend:
    tel_clock = FakeClock(T0_S)
    backend = SimulatedBackend(gpus=gpus, seed=seed, vmin_mv=vmin_mv, state_path=tmp_path / "sim.json",
                               clock=tel_clock)
    backend.test_clock = tel_clock  # type: ignore[attr-defined]
    return backend


def make_app(tmp_path: Path, *, backend=None, clock=None, samples: int = 0, **kwargs) -> TunerApp:
    """An App on a seeded simulated GPU; `samples` seconds of telemetry pre-filled, the 1 Hz sampler off."""
    backend = backend or sim_backend(tmp_path)
    kwargs.setdefault("doctor", lambda: list(FAKE_CHECKS))
    kwargs.setdefault("sample_interval_s", None)
    app = TunerApp(backend=backend, clock=clock or FakeClock(), **kwargs)
    prefill(app, samples)
    return app


def prefill(app: TunerApp, samples: int) -> None:
    backend = app.backend
    for i in range(samples):
        for device in app.devices:
            backend.note_load(device.id, 10 <= i < 40)  # a load step, so the plots have a shape
            app.record_sample(device.id, backend.telemetry(device.id), backend.knob(device.id))
        backend.test_clock.advance(1.0)
    for device in app.devices:
        backend.note_load(device.id, False)


def rig_in_confirmation(ids=("sim0", "sim1", "sim2"), settings=(-40, -55, -30)):
    """A BisectState of every card as the App folds it mid-way through the whole-rig confirmation: each card
    searched (a few trials and its own recommendation), the recording at stock passed, attempt 1 failed on sim1
    (backed off), attempt 2 running. Built from the events a BisectJob of several cards emits, with fixed figures
    (snapshots)."""
    from tuner.app.jobs import apply_bisect_event
    from tuner.app.state import BisectState
    from tuner.tuning.events import (
        Recommendation,
        RigConfirmFinished,
        RigConfirmStarted,
        SessionStarted,
        TrialFinished,
        TrialResult,
        TrialStarted,
    )

    state = BisectState.started(tuple(ids))
    events: list = []
    for d, rec in zip(ids, settings, strict=True):
        events.append(SessionStarted(session="s1", device=d, label=d, unit="mV", stock=0, resumed=False))
        for k, (value, phase) in enumerate([(0, "baseline"), (-20, "coarse"), (rec - 10, "confirm")], start=1):
            events.append(TrialStarted(index=k, setting=value, unit="mV", phase=phase, duration_s=60.0,
                                       started_at=0.0, expected_trials=8, device=d))
            events.append(TrialFinished(index=k, device=d, result=TrialResult(
                setting=value, unit="mV", phase=phase, verdict="pass", tok_s=1000.0 + value, power_w=250.0 + value,
                tok_per_j=4.0 - value / 100, max_temp_c=70.0)))
        events.append(Recommendation(device=d, unit="mV", setting=rec, confirmed=rec - 10, lowest_pass=rec - 10,
                                     first_failure=rec - 20, margin=10, edge=False))
    stock = dict.fromkeys(ids, 0)
    units = dict.fromkeys(ids, "mV")
    first = dict(zip(ids, settings, strict=True))
    backed = {**first, ids[1]: first[ids[1]] + 5}
    events += [
        RigConfirmStarted(settings=stock, unit_by_device=units, duration_s=60.0, attempt=0, phase="rig-baseline"),
        RigConfirmFinished(attempt=0, passed=True, pinned=(), machine_event=None, backed_off={}, phase="rig-baseline"),
        RigConfirmStarted(settings=first, unit_by_device=units, duration_s=120.0, attempt=1),
        RigConfirmFinished(attempt=1, passed=False, pinned=(ids[1],), machine_event=None, backed_off=backed,
                           reasons={ids[1]: "fail (mismatch: loss bits differ under the rig load)"}),
        RigConfirmStarted(settings=backed, unit_by_device=units, duration_s=120.0, attempt=2),
    ]
    for event in events:
        state = apply_bisect_event(state, event)
    return state


def screen_text(app) -> str:
    """What the current screen shows, as plain text (every line of the rendered frame)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def open_profiles(pilot, app, *, reads: int = 1) -> None:
    """Switch to the Profiles screen and wait until its worker has read the store `reads` times (the screen lists
    profiles off the UI thread, so a key pressed before the list arrives has no row to act on)."""
    await pilot.press("4")
    await until(pilot, lambda: getattr(app.screen, "lists_read", 0) >= reads, what="the Profiles screen's list")
