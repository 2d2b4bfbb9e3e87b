"""Shared helpers for the profile tests: fake real devices, a simulated backend, the CLI in-process."""

from __future__ import annotations

from pathlib import Path

from tuner import cli
from tuner.backends.simulated import SimulatedBackend
from tuner.core.models import DeviceInfo, Knob, KnobKind
from tuner.profiles import build_profile

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "profiles" / "example-rdna4.toml"

RX9070 = DeviceInfo(id="0000:03:00.0", vendor="amd", name="AMD Radeon RX 9070 XT", pci_id="1002:7550",
                    subsystem_id="1da2:e490", pci_slot="0000:03:00.0", vbios="113-A", driver_version="6.14.0",
                    serial="AAAA0001", od_format="rdna4")
AMD_KNOB = Knob(KnobKind.VOLTAGE_OFFSET, "mV", stock=0, current=0, min=-200, max=0, step=5, aggressive_direction=-1)
NV_KNOB = Knob(KnobKind.CLOCK_OFFSET, "MHz", stock=0, current=0, min=0, max=1000, step=15, aggressive_direction=1,
               lock_clock_mhz=2500)
RTX4090 = DeviceInfo(id="0000:01:00.0", vendor="nvidia", name="NVIDIA GeForce RTX 4090", pci_id="10de:2684",
                     subsystem_id="10de:167c", pci_slot="0000:01:00.0", serial="GPU-1111", od_format="nvml")


def sim(gpus: int = 2, seed: int = 0, vmin_mv: int | None = None) -> SimulatedBackend:
    """A simulated backend sharing its state file with `tuner --simulate --sim-seed SEED` in this test's dirs."""
    return SimulatedBackend(gpus=gpus, seed=seed, vmin_mv=vmin_mv)


def sim_profile(name: str = "sim", *, device_index: int = 0, value: int = -45, seed: int = 0, **kw):
    backend = sim(seed=seed)
    dev = backend.devices()[device_index]
    return build_profile(name, dev, backend.knob(dev.id), value, kernel="6.14.0-test", **kw)


def tuner(capsys, *argv: str) -> tuple[int, str, str]:
    """Run the real entry point in-process; returns (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def save_and_apply(capsys, profile, *apply_args: str, gpus: int = 2):
    from tuner.profiles import save_profile

    save_profile(profile, overwrite=True)
    return tuner(capsys, "--simulate", "--sim-gpus", str(gpus), "apply", profile.name, *apply_args)
