"""Backends: the only code that touches sysfs, NVML or amdsmi. `open_backend` picks them; core never does."""

from __future__ import annotations

import importlib

from tuner.backends.base import Backend, CompositeBackend
from tuner.core.errors import Unsupported, UsageError

# Vendor modules, each exposing `discover() -> Backend | None` (None when it finds no card of its vendor).
REAL_BACKEND_MODULES = ("tuner.backends.amd", "tuner.backends.nvidia")


def open_backend(
    *, simulate: bool, sim_gpus: int = 1, sim_seed: int = 0, sim_vmin_mv: int | tuple[int, ...] | None = None,
    sim_kind: str = "amd",
    sim_nondeterministic: bool = False, sim_contention_after_s: float | None = None,
    sim_sdc_rate: float | tuple[float, ...] | None = None, sim_driver: str | None = None,
) -> Backend:
    """The backend for this run: the simulator when asked, else every real vendor that finds a card."""
    if simulate:
        from tuner.backends.simulated import SimulatedBackend

        return SimulatedBackend(gpus=sim_gpus, seed=sim_seed, vmin_mv=sim_vmin_mv, kind=sim_kind,
                                nondeterministic=sim_nondeterministic, contention_after_s=sim_contention_after_s,
                                sdc_rate=sim_sdc_rate, driver=sim_driver)
    check_no_simulator_options(sim_nondeterministic, sim_contention_after_s, sim_sdc_rate, sim_driver,
                               vmin=sim_vmin_mv, gpus=sim_gpus, seed=sim_seed, kind=sim_kind)
    found: list[Backend] = []
    for module_name in REAL_BACKEND_MODULES:
        backend = importlib.import_module(module_name).discover()  # a missing module is a broken install: raise
        if backend is not None:
            found.append(backend)
    if not found:
        raise Unsupported(
            "no supported GPU found (no AMD card with amdgpu in /sys/class/drm, no NVIDIA card via NVML)",
            "try `tuner --simulate` to use a simulated GPU, or `tuner doctor` to see what is missing",
        )
    return found[0] if len(found) == 1 else CompositeBackend(found)


def check_no_simulator_options(nondeterministic: bool, contention_after_s: float | None,
                               sdc_rate: float | tuple[float, ...] | None, driver: str | None, *,
                               vmin: int | tuple[int, ...] | None = None, gpus: int = 1, seed: int = 0,
                               kind: str = "amd") -> None:
    """Real cards (in-process or through the helper): the simulator's own options are a UsageError, so a command
    meant for the simulator (`tuner --sim-vmin -52 set ...` with --simulate forgotten) never acts on a real card.
    `gpus`, `seed` and `kind` have the simulator's defaults (the parser's): another value was given."""
    given = [flag for flag, on in (("--sim-gpus", gpus != 1), ("--sim-seed", seed != 0), ("--sim-kind", kind != "amd"),
                                   ("--sim-vmin", vmin is not None), ("--sim-nondeterministic", nondeterministic),
                                   ("--sim-contention-after", contention_after_s is not None),
                                   ("--sim-sdc-rate", sdc_rate is not None), ("--sim-driver", driver is not None))
             if on]
    if given:
        raise UsageError(f"the simulator's options ({', '.join(given)}) need --simulate",
                         "add --simulate, or leave them out on real hardware")


__all__ = ["Backend", "CompositeBackend", "check_no_simulator_options", "open_backend"]
