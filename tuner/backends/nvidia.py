"""NVIDIA cards through NVML (`nvidia-ml-py`, imported as `pynvml`).

NVML has no voltage control and reports no core voltage. The established "undervolt" is: lock the maximum graphics
clock (`nvmlDeviceSetGpuLockedClocks`), then add a positive graphics clock offset, so the card reaches that clock
at a lower point of its V/F curve, hence a lower voltage. The knob is that offset in MHz (higher = more aggressive);
the lock defaults to the card's stock maximum boost and can be changed with `set_lock_clock`.
Offsets use `nvmlDeviceSetClockOffsets` (driver >= 555, called through `nvml_offsets` because pynvml's wrapper
ignores errors) and fall back to `nvmlDeviceSetGpcClkVfOffset` (driver >= 520). Reset = offset 0 and
`nvmlDeviceResetGpuLockedClocks`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from fractions import Fraction

from tuner.backends import nvml_offsets
from tuner.backends.base import Backend
from tuner.core.errors import DeviceLost, NotApplied, PermissionDenied, TunerError, Unsupported, UsageError
from tuner.core.models import Capabilities, DeviceInfo, Knob, KnobKind, StressTarget, Telemetry

_THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
OFFSET_API = "nvmlDeviceSetClockOffsets"
VF_OFFSET_API = "nvmlDeviceSetGpcClkVfOffset"


def import_nvml():
    """pynvml, or None when the package is not installed. Importing never touches the driver."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def normalise_bus_id(bus_id) -> str:
    """NVML's `00000000:01:00.0` as the tuner's `0000:01:00.0` (lower-case, 4-digit domain).

    >>> normalise_bus_id(b"00000000:2B:00.0")
    '0000:2b:00.0'
    """
    text = _text(bus_id).strip().lower()
    domain, _, rest = text.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else text


def offset_step_mhz(clocks_mhz: list[float]) -> int:
    """The smallest whole-MHz multiple of the supported clocks' spacing (15 MHz; 7.5 MHz spacing gives 15).

    >>> offset_step_mhz([2100, 2085, 2070]), offset_step_mhz([1957.5, 1950, 1942.5]), offset_step_mhz([])
    (15, 15, 1)
    """
    steps = sorted(
        {
            abs(Fraction(a).limit_denominator(8) - Fraction(b).limit_denominator(8))
            for a, b in zip(sorted(clocks_mhz), sorted(clocks_mhz)[1:])
        }
        - {0}
    )
    if not steps:
        return 1
    step = steps[0]
    return int(step * step.denominator) if step.denominator > 1 else int(step)


class NvidiaBackend(Backend):
    name = "nvidia"

    def __init__(
        self, nvml, *, warn: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time
    ):
        """`nvml` is an initialised pynvml module (or a fake with the same names)."""
        self.nvml = nvml
        self._warn = warn or (lambda msg: print(f"tuner: warning: {msg}", file=sys.stderr))
        self._clock = clock
        self._handles: dict[str, object] = {}
        self._infos: list[DeviceInfo] = []
        self._lock_mhz: dict[str, int] = {}
        self._api: dict[str, str] = {}
        driver = self._nv(lambda: _text(nvml.nvmlSystemGetDriverVersion()), "reading the driver version")
        for index in range(self._nv(nvml.nvmlDeviceGetCount, "counting GPUs")):
            h = self._nv(lambda i=index: nvml.nvmlDeviceGetHandleByIndex(i), "opening a GPU")
            pci = self._nv(lambda h=h: nvml.nvmlDeviceGetPciInfo(h), "reading the PCI id")
            slot = normalise_bus_id(pci.busId)
            self._handles[slot] = h
            self._infos.append(
                DeviceInfo(
                    id=slot,
                    vendor="nvidia",
                    name=_text(self._nv(lambda h=h: nvml.nvmlDeviceGetName(h), "reading the name")),
                    pci_id=f"{pci.pciDeviceId & 0xFFFF:04x}:{pci.pciDeviceId >> 16:04x}",
                    subsystem_id=f"{pci.pciSubSystemId & 0xFFFF:04x}:{pci.pciSubSystemId >> 16:04x}",
                    pci_slot=slot,
                    vbios=self._optional(lambda h=h: _text(nvml.nvmlDeviceGetVbiosVersion(h))),
                    driver_version=driver,
                    serial=self._optional(lambda h=h: _text(nvml.nvmlDeviceGetUUID(h))),
                    od_format="nvml",
                )
            )

    # --- error handling -------------------------------------------------------------------------------------------
    def _translate(self, e: Exception, what: str) -> TunerError:
        n, code = self.nvml, getattr(e, "value", None)
        if code == n.NVML_ERROR_NO_PERMISSION:
            return PermissionDenied(
                f"{what}: NVML says insufficient permissions", "setting clocks needs root: run with sudo"
            )
        if code == n.NVML_ERROR_NOT_SUPPORTED:
            return Unsupported(f"{what} is not supported on this GPU or driver")
        if code == n.NVML_ERROR_FUNCTION_NOT_FOUND:
            return Unsupported(
                f"{what}: the NVIDIA driver is too old",
                "clock offsets need driver >= 555 (or >= 520 for the older GpcClkVfOffset call); update the driver",
            )
        if code == n.NVML_ERROR_GPU_IS_LOST:
            return DeviceLost(
                f"{what}: the GPU has fallen off the bus (NVML GpuIsLost)",
                "check `sudo dmesg | grep -i xid`; a reboot is usually needed",
            )
        return NotApplied(f"{what} failed: {e}", "see `nvidia-smi -q` and `sudo dmesg | grep -i nvrm`")

    def _nv(self, fn: Callable, what: str):
        try:
            return fn()
        except self.nvml.NVMLError as e:
            raise self._translate(e, what) from None

    def _optional(self, fn: Callable):
        """A figure the card may not report: None instead of an error, except a lost GPU."""
        try:
            return fn()
        except self.nvml.NVMLError as e:
            if getattr(e, "value", None) == self.nvml.NVML_ERROR_GPU_IS_LOST:
                raise self._translate(e, "reading telemetry") from None
            return None

    def _is(self, e: Exception, code_name: str) -> bool:
        return getattr(e, "value", None) == getattr(self.nvml, code_name)

    # --- clocks and offsets -----------------------------------------------------------------------------------------
    def _handle(self, device_id: str):
        self.device(device_id)
        return self._handles[device_id]

    def _supported_clocks(self, h) -> list[float]:
        n = self.nvml
        mems = self._optional(lambda: n.nvmlDeviceGetSupportedMemoryClocks(h)) or []
        if not mems:
            return []
        return list(self._optional(lambda: n.nvmlDeviceGetSupportedGraphicsClocks(h, max(mems))) or [])

    def _stock_max_mhz(self, h) -> int:
        n = self.nvml
        boost = self._optional(lambda: n.nvmlDeviceGetMaxCustomerBoostClock(h, n.NVML_CLOCK_GRAPHICS))
        if not boost:
            boost = self._nv(
                lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_GRAPHICS), "reading the max clock"
            )
        return int(boost)

    def _read_offset(self, device_id: str) -> tuple[int, int, int]:
        """(current, min, max) graphics offset in MHz at P0, through whichever API this driver has."""
        n, h = self.nvml, self._handle(device_id)
        if self._api.get(device_id, OFFSET_API) == OFFSET_API:
            try:
                off = nvml_offsets.get_clock_offset(n, h, n.NVML_CLOCK_GRAPHICS, n.NVML_PSTATE_0)
                self._api[device_id] = OFFSET_API
                return off.current_mhz, off.min_mhz, off.max_mhz
            except n.NVMLError as e:
                if not self._is(e, "NVML_ERROR_FUNCTION_NOT_FOUND"):
                    raise self._translate(e, "reading the clock offset") from None
        self._api[device_id] = VF_OFFSET_API
        current = self._nv(lambda: n.nvmlDeviceGetGpcClkVfOffset(h), "reading the clock offset")
        lo, hi = self._nv(lambda: n.nvmlDeviceGetGpcClkMinMaxVfOffset(h), "reading the clock offset range")
        return int(current), int(lo), int(hi)

    def _write_offset(self, device_id: str, offset_mhz: int) -> None:
        n, h = self.nvml, self._handle(device_id)
        if self._api.get(device_id) is None:
            self._read_offset(device_id)
        if self._api[device_id] == OFFSET_API:
            self._nv(
                lambda: nvml_offsets.set_clock_offset(
                    n, h, n.NVML_CLOCK_GRAPHICS, n.NVML_PSTATE_0, offset_mhz
                ),
                "setting the clock offset",
            )
        else:
            self._nv(lambda: n.nvmlDeviceSetGpcClkVfOffset(h, offset_mhz), "setting the clock offset")

    def lock_clock_mhz(self, device_id: str) -> int:
        if device_id not in self._lock_mhz:
            self._lock_mhz[device_id] = self._stock_max_mhz(self._handle(device_id))
        return self._lock_mhz[device_id]

    def set_lock_clock(self, device_id: str, mhz: int) -> None:
        """The max graphics clock the next `apply` locks to (default: the card's stock max boost)."""
        n, h = self.nvml, self._handle(device_id)
        clocks = self._supported_clocks(h)
        lo = int(min(clocks)) if clocks else 1
        hi = self._nv(lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_GRAPHICS), "reading the max clock")
        if isinstance(mhz, bool) or not isinstance(mhz, int) or not lo <= mhz <= hi:
            raise UsageError(
                f"--lock-mhz {mhz} is outside this card's clocks {lo}..{hi} MHz",
                f"pick a clock between {lo} and {hi} MHz",
            )
        self._lock_mhz[device_id] = mhz

    def _lock(self, device_id: str) -> None:
        n, h = self.nvml, self._handle(device_id)
        clocks = self._supported_clocks(h)
        if clocks:
            floor = int(min(clocks))
        else:
            floor = int(
                self._nv(
                    lambda: n.nvmlDeviceGetMinMaxClockOfPState(h, n.NVML_CLOCK_GRAPHICS, n.NVML_PSTATE_0)[0],
                    "reading the lowest clock",
                )
            )
        top = self.lock_clock_mhz(device_id)
        self._nv(
            lambda: n.nvmlDeviceSetGpuLockedClocks(h, min(floor, top), top), "locking the graphics clock"
        )

    def persistence_off(self, device_id: str) -> bool:
        n, h = self.nvml, self._handle(device_id)
        return self._optional(lambda: n.nvmlDeviceGetPersistenceMode(h)) == getattr(
            n, "NVML_FEATURE_DISABLED", 0
        )

    # --- Backend ----------------------------------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return list(self._infos)

    def knob(self, device_id: str) -> Knob:
        current, lo, hi = self._read_offset(device_id)
        return Knob(
            kind=KnobKind.CLOCK_OFFSET,
            unit="MHz",
            stock=0,
            current=current,
            min=min(lo, 0),
            max=max(hi, 0),
            step=offset_step_mhz(self._supported_clocks(self._handle(device_id))),
            aggressive_direction=1,
            lock_clock_mhz=self.lock_clock_mhz(device_id),
        )

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        before = self.knob(device_id)
        before.validate(value, allow_overvolt=allow_overvolt)  # OutOfRange: nothing written
        if value == before.stock:
            return self.reset(device_id)
        try:
            self._lock(device_id)
            self._write_offset(device_id, value)
            got = self._read_offset(device_id)[0]
            if got != value:
                raise NotApplied(
                    f"{device_id}: wrote {value:+d} MHz but NVML reads back {got:+d} MHz; "
                    f"restored {before.current:+d} MHz",
                    "the driver may not support offsets on this card",
                )
        except DeviceLost:
            raise
        except TunerError as e:
            self._restore(device_id, before.current, e)
            raise
        if self.persistence_off(device_id):
            self._warn(
                "persistence mode is off: the setting vanishes when the driver unloads "
                "(run `sudo nvidia-smi -pm 1`)"
            )
        return self.knob(device_id)

    def _restore(self, device_id: str, previous: int, cause: TunerError) -> None:
        try:
            if previous == 0:
                self.reset(device_id)
            else:
                self._write_offset(device_id, previous)
        except TunerError as e:
            raise NotApplied(
                f"{cause.message}; restoring {previous:+d} MHz also failed: {e.message}",
                "run `sudo tuner reset` or `sudo nvidia-smi -rgc`",
            ) from cause

    def reset(self, device_id: str) -> Knob:
        n, h = self.nvml, self._handle(device_id)
        current = self._read_offset(device_id)[0]
        if current != 0:
            self._write_offset(device_id, 0)
        self._nv(lambda: n.nvmlDeviceResetGpuLockedClocks(h), "unlocking the graphics clock")
        knob = self.knob(device_id)
        if knob.current != knob.stock:
            raise NotApplied(
                f"{device_id}: after reset NVML reads {knob.current:+d} MHz, not 0",
                "run `sudo nvidia-smi -rgc` or reboot",
            )
        return knob

    def telemetry(self, device_id: str) -> Telemetry:
        n, h = self.nvml, self._handle(device_id)
        opt = self._optional
        power_mw = opt(lambda: n.nvmlDeviceGetPowerUsage(h))
        energy_mj = opt(lambda: n.nvmlDeviceGetTotalEnergyConsumption(h))
        util = opt(lambda: n.nvmlDeviceGetUtilizationRates(h))
        reasons = opt(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
        if reasons is None:
            reasons = opt(lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        return Telemetry(
            time_s=self._clock(),
            power_w=None if power_mw is None else power_mw / 1000.0,
            temp_edge_c=opt(lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))),
            core_clock_mhz=opt(lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_GRAPHICS))),
            mem_clock_mhz=opt(lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM))),
            voltage_mv=None,  # NVML does not report core voltage
            util_pct=None if util is None else float(util.gpu),
            energy_j=None if energy_mj is None else energy_mj / 1000.0,
            throttle_reasons=tuple(name for bit, name in _THROTTLE_BITS.items() if reasons and reasons & bit),
        )

    def capabilities(self, device_id: str) -> Capabilities:
        notes = ["undervolt = locked max clock + positive clock offset (NVML has no voltage control)"]
        try:
            self.knob(device_id)
            can_apply = True
            notes.append(f"offsets via {self._api.get(device_id, OFFSET_API)}")
        except TunerError as e:
            can_apply = False
            notes.append(e.one_line())
        if self.persistence_off(device_id):
            notes.append(
                "persistence mode is off: settings vanish when the driver unloads (`sudo nvidia-smi -pm 1`)"
            )
        energy = self._optional(
            lambda: self.nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle(device_id))
        )
        return Capabilities(
            can_apply=can_apply,
            can_read_voltage=False,
            can_read_energy=energy is not None,
            needs_root=True,
            notes=tuple(notes),
        )

    def stress_target(self, device_id: str) -> StressTarget:
        index = [d.id for d in self._infos].index(self.device(device_id).id)
        return StressTarget(
            torch_device=f"cuda:{index}", pci_bus_id=device_id, env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        )

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def discover(nvml=None) -> NvidiaBackend | None:
    """The NVIDIA cards NVML sees, or None when pynvml, libnvidia-ml or the driver is missing, or no card is found."""
    nvml = nvml or import_nvml()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:  # LibraryNotFound, DriverNotLoaded, ...
        return None
    try:
        if nvml.nvmlDeviceGetCount() == 0:
            nvml.nvmlShutdown()
            return None
        return NvidiaBackend(nvml)
    except (nvml.NVMLError, TunerError):
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
        return None
