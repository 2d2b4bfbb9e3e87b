"""Shared builders for the screen tests: a small trajectory, a bundle of it, and sealing a changed document."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tuner.backends.simulated import SimulatedBackend
from tuner.engine.reference import Reference
from tuner.profiles import reference_bundle as rb

FINGERPRINT = {"protocol": 1, "preset": "tiny", "depth": 2, "width": 64, "head_dim": 32, "seq_len": 64,
               "batch_size": 8, "seed": 0, "dtype": "fp32", "device_type": "cpu", "device_name": "CPU: test",
               "data_sha256": "ab" * 32, "torch_version": "2.13.0+cpu", "cuda_version": None, "hip_version": None,
               "kernels": {"deterministic": "strict"}, "kernel_env": {}, "driver_version": None, "threads": 1}


def trajectory(steps: int = 5) -> Reference:
    return Reference(dict(FINGERPRINT), [f"{i:032x}" for i in range(steps)], canary="ab" * 8)


def bundle(tmp_path: Path, *, steps: int = 5, driver: str | None = None, **recording) -> rb.Bundle:
    backend = SimulatedBackend(state_path=tmp_path / "sim.json", driver=driver)
    fields = {"tier": "quick", "load_s": 30.0, "steps": steps, "median_step_ms": 3.0, "repeatable": True,
              "replayed_steps": steps, "eval_losses": (1.5, 2.0, 2.5)}
    fields.update(recording)
    return rb.build_bundle(device=backend.device("sim0"), recording=rb.Recording(**fields),
                           trajectory=trajectory(steps))


def raw(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def write_raw(path: Path, doc: dict) -> None:
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


# The screens and recordings of the tests: short loads (the tiers are 30 s and more). 1 s is the shortest a duration
# may be and still some 20 steps of the tiny preset here: every pass screen compares steps (each engine run costs
# about 2 s of start-up besides). A bad card's screen ends at its first fault whatever the load: FAULT_LOAD.
LOAD = ("--duration", "1s")
FAULT_LOAD = ("--duration", "3s")  # a margin of steps for a simulated fault to be caught (the run ends at it)


def state(tmp_path: Path, name: str) -> dict:
    """Environment for a tuner with its own state directory (another machine); the engine's cache is shared."""
    base = tmp_path / name
    return {"XDG_STATE_HOME": str(base / "state"), "XDG_CONFIG_HOME": str(base / "config"),
            "XDG_CACHE_HOME": str(tmp_path / "cache")}
