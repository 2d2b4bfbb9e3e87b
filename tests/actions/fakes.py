"""A small simulated card whose knob is an NVIDIA-style clock offset: positive MHz in 15 MHz steps at a lock clock.

A stand-in for the rules tests only (the full `--sim-kind nvidia` card is built elsewhere): the knob's shape copies
what tuner/backends/nvidia.py reports (`Knob(CLOCK_OFFSET, "MHz", step=15, aggressive_direction=+1,
lock_clock_mhz=...)`, see tests/profiles/helpers.py NV_KNOB), and like the NVIDIA backend it offers
`set_lock_clock`. Faults start past a hidden limit in MHz, as the simulated mV card's do below its vmin.
"""

from __future__ import annotations

from dataclasses import replace

from tuner.backends.simulated import SimulatedBackend
from tuner.core.models import Knob, KnobKind, StressTarget

STEP_MHZ, MAX_MHZ, STOCK_LOCK_MHZ = 15, 300, 2500


class ClockOffsetSim(SimulatedBackend):
    def __init__(self, *args, limit_mhz: int = 150, **kwargs):
        super().__init__(*args, **kwargs)
        self.limit_mhz = limit_mhz
        self.locked_mhz = STOCK_LOCK_MHZ
        self.lock_calls: list[tuple[str, int]] = []

    def lock_clock_mhz(self, device_id: str) -> int:  # the simulated card asks it for its loaded clock
        return self.locked_mhz

    def knob(self, device_id: str) -> Knob:
        return Knob(KnobKind.CLOCK_OFFSET, "MHz", stock=0, current=self._setting(device_id), min=0,
                    max=MAX_MHZ, step=STEP_MHZ, aggressive_direction=1, lock_clock_mhz=self.locked_mhz)

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        self.knob(device_id).validate(value, allow_overvolt=allow_overvolt)
        self._write_setting(device_id, value)
        return self.knob(device_id)

    def set_lock_clock(self, device_id: str, clock_mhz: int) -> None:
        self.lock_calls.append((device_id, clock_mhz))
        self.locked_mhz = clock_mhz

    def stress_target(self, device_id: str) -> StressTarget:
        over = self.knob(device_id).current - self.limit_mhz
        return StressTarget(torch_device="cpu", pci_bus_id=None, fault_rate=0.05 if over > 0 else 0.0,
                            hang=False, simulated=True)


class RealLookingSim(SimulatedBackend):
    """The simulated card, but reporting itself as real hardware (DeviceInfo.simulated False): for the rules that
    only real cards trigger (the consent a bisect needs). Nothing real is touched."""

    def devices(self):
        return [replace(d, simulated=False) for d in super().devices()]
