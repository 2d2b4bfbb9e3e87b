"""Shared pieces for the TUI tests: a fake clock, a seeded simulated GPU and an App that does not sample."""

from __future__ import annotations

from pathlib import Path

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
