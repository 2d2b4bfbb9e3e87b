"""NVIDIA cards through NVML (`nvidia-ml-py`, imported as `pynvml`).

NVML has no voltage control and reports no core voltage. The established "undervolt" is: lock the maximum graphics
clock (`nvmlDeviceSetGpuLockedClocks`), then add a positive graphics clock offset, so the card reaches that clock
at a lower point of its V/F curve, hence a lower voltage. The knob is that offset in MHz (higher = more aggressive);
the lock defaults to the card's stock maximum boost and can be changed with `set_lock_clock`.
Offsets use `nvmlDeviceSetClockOffsets` (driver >= 555, called through `nvml_offsets` because pynvml's wrapper
ignores errors) and fall back to `nvmlDeviceSetGpcClkVfOffset` (driver >= 520). Reset = offset 0 and
`nvmlDeviceResetGpuLockedClocks` (stock); revert = the state found before the change (each pstate's offset, and
the tuner's own lock or none), read back.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

import msgspec

from tuner.backends import card_records, nvml_offsets
from tuner.backends.base import Backend, check_lock_mhz, warn_on_stderr
from tuner.core.errors import DeviceLost, NotApplied, PermissionDenied, TunerError, Unsupported
from tuner.core.models import (
    Capabilities,
    DeviceInfo,
    ErrorCounters,
    Knob,
    KnobKind,
    StressTarget,
    Telemetry,
    known_serial,
)

# Clock event ("throttle") reasons: pynvml's constant suffix -> the name shown. The bits are read from the module
# (`nvmlClocksEventReason*`, r535 and later; `nvmlClocksThrottleReason*` before, and for BoardLimit/Reliability,
# which nvidia-ml-py 13.615 names only that way), so a reason this nvidia-ml-py does not know is never guessed.
REASON_NAMES = (
    ("GpuIdle", "idle"),
    ("ApplicationsClocksSetting", "applications clocks"),
    ("SwPowerCap", "power cap"),
    ("HwSlowdown", "hw slowdown"),
    ("SyncBoost", "sync boost"),
    ("SwThermalSlowdown", "thermal"),
    ("HwThermalSlowdown", "hw thermal"),
    ("HwPowerBrakeSlowdown", "hw power brake"),
    ("DisplayClockSetting", "display clocks"),
    ("BoardLimit", "board limit"),
    ("Reliability", "reliability"),
)
MIB = 1024 * 1024
OFFSET_API = "nvmlDeviceSetClockOffsets"
# Offsets are per performance state; CUDA work often runs in P2 on GeForce cards (LACT PR #461, #918).
OFFSET_PSTATES = (0, 2)
SNAP_LIMIT_MHZ = 15  # a read-back this close below the written offset is the driver's snapping, not a refusal
VF_OFFSET_API = "nvmlDeviceSetGpcClkVfOffset"

# pynvml ships no type information: the module (or a fake with the same names) and its device handles are Any.
Nvml = Any
NvmlHandle = Any
T = TypeVar("T")


@dataclass(frozen=True)
class FoundState:
    """What a card held before a write: each performance state's offset as NVML reads it (key None on the older
    whole-curve API), the knob's reading of it, and the tuner's record with the lock that came with it. NVML cannot
    read locked clocks back, so the lock is the one the tuner's record says it set with the offset on the card; any
    other state (stock, another tool's offset) counts as unlocked: a lock another tool set is not visible, and
    putting the tuner's own lock on a card that had none caps it at a clock it never had (docs/backends.md)."""

    offsets_mhz: dict[int | None, int]  # what to write back
    read_mhz: dict[int | None, int]  # what NVML read: what it must read again once they are back
    knob_mhz: int
    record_offset_mhz: int
    lock_mhz: int | None


class _FoundRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A FoundState as a record outliving the process (`found_state`): JSON has no None key, so (pstate, MHz)
    pairs."""

    offsets_mhz: list[tuple[int | None, int]]
    read_mhz: list[tuple[int | None, int]]
    knob_mhz: int
    record_offset_mhz: int
    lock_mhz: int | None


def import_nvml() -> Nvml | None:
    """pynvml, or None when the package is not installed. Importing never touches the driver."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def reason_names(nvml: Nvml, mask: int | None) -> tuple[str, ...]:
    """The names of the bits set in an NVML clock event reasons mask, in bit order; a bit this nvidia-ml-py has no
    constant for is shown as `reason 0x...`, not dropped."""
    if not mask:
        return ()
    names, known = [], 0
    for suffix, name in REASON_NAMES:
        bit = getattr(nvml, "nvmlClocksEventReason" + suffix, None) or getattr(
            nvml, "nvmlClocksThrottleReason" + suffix, None
        )
        if isinstance(bit, int) and bit:
            known |= bit
            if mask & bit:
                names.append((bit, name))
    rest = mask & ~known
    names += [(1 << i, f"reason 0x{1 << i:x}") for i in range(64) if rest & (1 << i)]
    return tuple(name for _, name in sorted(names))


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _mib(n_bytes: object) -> float | None:
    return round(n_bytes / MIB, 1) if isinstance(n_bytes, int) else None


def normalise_bus_id(bus_id: str | bytes) -> str:
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
            for a, b in itertools.pairwise(sorted(clocks_mhz))
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
        self, nvml: Nvml, *, warn: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time
    ):
        """`nvml` is an initialised pynvml module (or a fake with the same names)."""
        self.nvml = nvml
        self._warn = warn or warn_on_stderr
        self._clock = clock
        self._handles: dict[str, NvmlHandle] = {}
        self._infos: list[DeviceInfo] = []
        self._lock_mhz: dict[str, int] = {}  # the lock chosen in this process (measured, --lock-mhz, a revert)
        self._boost_mhz: dict[str, int] = {}  # the card's max customer boost clock, when it reports one
        self._api: dict[str, str] = {}
        self._pstates: dict[str, tuple[int, ...]] = {}
        # the state found before the first write of the change in progress: what `revert` puts back
        self._found: dict[str, FoundState] = {}
        driver = self._nv(lambda: _text(nvml.nvmlSystemGetDriverVersion()), "reading the driver version")
        for index in range(self._nv(nvml.nvmlDeviceGetCount, "counting GPUs")):
            try:
                h = self._nv(functools.partial(nvml.nvmlDeviceGetHandleByIndex, index), "opening a GPU")
                info = self._describe(h, driver)
            except DeviceLost as e:
                # one card that fell off the bus must not hide the others: they may still carry settings to reset
                self._warn(f"NVIDIA GPU {index} is left out: {e.message}")
                continue
            self._handles[info.id] = h
            self._infos.append(info)

    def _describe(self, h: NvmlHandle, driver: str) -> DeviceInfo:
        nvml = self.nvml
        pci = self._nv(lambda: nvml.nvmlDeviceGetPciInfo(h), "reading the PCI id")
        slot = normalise_bus_id(pci.busId)
        return DeviceInfo(
            id=slot,
            vendor="nvidia",
            name=_text(self._nv(lambda: nvml.nvmlDeviceGetName(h), "reading the name")),
            pci_id=f"{pci.pciDeviceId & 0xFFFF:04x}:{pci.pciDeviceId >> 16:04x}",
            subsystem_id=f"{pci.pciSubSystemId & 0xFFFF:04x}:{pci.pciSubSystemId >> 16:04x}",
            pci_slot=slot,
            vbios=self._optional(lambda: _text(nvml.nvmlDeviceGetVbiosVersion(h))),
            driver_version=driver,
            serial=known_serial(self._optional(lambda: _text(nvml.nvmlDeviceGetUUID(h)))),
            od_format="nvml",
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

    def _nv(self, fn: Callable[[], T], what: str) -> T:
        try:
            return fn()
        except self.nvml.NVMLError as e:
            raise self._translate(e, what) from None
        except AttributeError as e:  # a pynvml too old for a call: never let it escape as a traceback
            raise Unsupported(
                f"{what}: this nvidia-ml-py lacks {getattr(e, 'name', None) or e}",
                "install nvidia-ml-py >= 12.555 (`pip install -U nvidia-ml-py`)",
            ) from None

    def _optional(self, fn: Callable[[], T]) -> T | None:
        """A figure the card may not report: None instead of an error, except a lost GPU."""
        try:
            return fn()
        except self.nvml.NVMLError as e:
            if getattr(e, "value", None) == self.nvml.NVML_ERROR_GPU_IS_LOST:
                raise self._translate(e, "reading telemetry") from None
            return None
        except AttributeError:  # the installed pynvml lacks this call
            return None

    def _is(self, e: Exception, code_name: str) -> bool:
        return getattr(e, "value", None) == getattr(self.nvml, code_name)

    # --- clocks and offsets -----------------------------------------------------------------------------------------
    def _handle(self, device_id: str) -> NvmlHandle:
        self.device(device_id)
        return self._handles[device_id]

    def _supported_clocks(self, h: NvmlHandle) -> list[float]:
        n = self.nvml
        mems = self._optional(lambda: n.nvmlDeviceGetSupportedMemoryClocks(h)) or []
        if not mems:
            return []
        return list(self._optional(lambda: n.nvmlDeviceGetSupportedGraphicsClocks(h, max(mems))) or [])

    def _offset_api(self, device_id: str) -> str:
        """The per-pstate API (driver >= 555 with nvidia-ml-py >= 12.555), else the older whole-curve VF call."""
        if device_id not in self._api:
            n, h = self.nvml, self._handle(device_id)
            try:
                nvml_offsets.get_clock_offset(n, h, n.NVML_CLOCK_GRAPHICS, n.NVML_PSTATE_0)
                self._api[device_id] = OFFSET_API
            except AttributeError:
                # nvidia-ml-py < 12.555 lacks c_nvmlClockOffset_t / nvmlClockOffset_v1: use the older call.
                self._api[device_id] = VF_OFFSET_API
            except n.NVMLError as e:
                if not self._is(e, "NVML_ERROR_FUNCTION_NOT_FOUND"):
                    raise self._translate(e, "reading the clock offset") from None
                self._api[device_id] = VF_OFFSET_API
        return self._api[device_id]

    def applied_pstates(self, device_id: str) -> tuple[int, ...] | None:
        """The performance states an offset is applied at (every one the driver accepts a non-zero offset for,
        at least P0); None on the older API, whose one offset covers the whole V/F curve."""
        if self._offset_api(device_id) != OFFSET_API:
            return None
        if device_id not in self._pstates:
            n, h = self.nvml, self._handle(device_id)
            accepted = []
            for pstate in OFFSET_PSTATES:
                try:
                    off = nvml_offsets.get_clock_offset(n, h, n.NVML_CLOCK_GRAPHICS, pstate)
                except n.NVMLError as e:
                    if pstate == 0 or self._is(e, "NVML_ERROR_GPU_IS_LOST"):
                        raise self._translate(e, "reading the clock offset") from None
                    continue  # this pstate takes no offset on this card
                if pstate == 0 or (off.min_mhz, off.max_mhz) != (0, 0):
                    accepted.append(pstate)
            self._pstates[device_id] = tuple(accepted)
        return self._pstates[device_id]

    def _read_offsets(self, device_id: str) -> dict[int | None, tuple[int, int, int]]:
        """{pstate: (current, min, max)} as the driver reports them; key None on the older whole-curve API."""
        n, h = self.nvml, self._handle(device_id)
        pstates = self.applied_pstates(device_id)
        if pstates is None:
            current = self._nv(lambda: n.nvmlDeviceGetGpcClkVfOffset(h), "reading the clock offset")
            lo, hi = self._nv(
                lambda: n.nvmlDeviceGetGpcClkMinMaxVfOffset(h), "reading the clock offset range"
            )
            return {None: (int(current), int(lo), int(hi))}
        out: dict[int | None, tuple[int, int, int]] = {}
        for pstate in pstates:
            off = self._nv(
                functools.partial(nvml_offsets.get_clock_offset, n, h, n.NVML_CLOCK_GRAPHICS, pstate),
                "reading the clock offset",
            )
            out[pstate] = (off.current_mhz, off.min_mhz, off.max_mhz)
        return out

    def _write_offset(self, device_id: str, pstate: int | None, offset_mhz: int) -> None:
        n, h = self.nvml, self._handle(device_id)
        if pstate is None:
            self._nv(lambda: n.nvmlDeviceSetGpcClkVfOffset(h, offset_mhz), "setting the clock offset")
        else:
            self._nv(
                lambda: nvml_offsets.set_clock_offset(n, h, n.NVML_CLOCK_GRAPHICS, pstate, offset_mhz),
                f"setting the clock offset at P{pstate}",
            )

    def _record(self, device_id: str) -> dict:
        return card_records.load(card_records.APPLIED, self._record_key(device_id)) or {}

    def _record_key(self, device_id: str) -> str:
        return self.device(device_id).serial or device_id

    def _save_record(self, device_id: str, offset_mhz: int, lock_mhz: int | None) -> None:
        """Record the offset the tuner applied and the lock it applied it at (NVML cannot read locked clocks back:
        this record is the only memory of the lock); an offset of 0 clears it."""
        card_records.record_applied(self._record_key(device_id), device_id, offset_mhz, "MHz",
                                    {"offset_mhz": offset_mhz, "lock_clock_mhz": lock_mhz}, self._warn)

    def _recorded_offset(self, device_id: str) -> int:
        """The offset the tuner's record says it applied this boot; 0 without one, or for a value that is not a whole
        number (a damaged or hand-edited record is no record)."""
        offset = self._record(device_id).get("offset_mhz", 0)
        return offset if isinstance(offset, int) and not isinstance(offset, bool) else 0

    def _recorded_lock(self, device_id: str) -> int | None:
        """The lock the tuner's record says it put on the card with the offset it applied this boot, or None."""
        lock = self._record(device_id).get("lock_clock_mhz")
        return lock if isinstance(lock, int) and not isinstance(lock, bool) and lock > 0 else None

    def lock_clock_mhz(self, device_id: str) -> int | None:
        """The max graphics clock `apply` locks to: the one set in this process (measured under the stock
        baseline, --lock-mhz, or put back by a revert), else the one the card is locked at now by the tuner's
        record (so a new offset without --lock-mhz leaves the lock where it is, and a revert knows what to put
        back), else the card's max customer boost clock, else None (nothing known that caps anything)."""
        if device_id in self._lock_mhz:
            return self._lock_mhz[device_id]
        recorded = self._recorded_lock(device_id)
        if recorded is not None:
            return recorded
        if device_id not in self._boost_mhz:
            n, h = self.nvml, self._handle(device_id)
            boost = self._optional(lambda: n.nvmlDeviceGetMaxCustomerBoostClock(h, n.NVML_CLOCK_GRAPHICS))
            if not boost:
                return None
            self._boost_mhz[device_id] = int(boost)
        return self._boost_mhz[device_id]

    def set_lock_clock(self, device_id: str, mhz: int) -> None:
        """The max graphics clock the next `apply` locks to (default: the card's stock max boost)."""
        check_lock_mhz(mhz, *self._lock_range(device_id))
        self._lock_mhz[device_id] = mhz

    def _lock_range(self, device_id: str) -> tuple[int, int]:
        """The clocks a lock may be set at: the lowest supported one up to the card's max graphics clock."""
        n, h = self.nvml, self._handle(device_id)
        clocks = self._supported_clocks(h)
        lo = int(min(clocks)) if clocks else 1
        hi = self._nv(lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_GRAPHICS), "reading the max clock")
        return lo, hi

    def lock_at_measured_clock(self, device_id: str, clock_mhz: float) -> int | None:
        """Lock at the clock the card sustained under the stock baseline (its median SM clock), snapped down to
        a supported clock. The top of the V/F table caps nothing, so this is what makes an offset an undervolt."""
        clocks = sorted(self._supported_clocks(self._handle(device_id)))
        below = [c for c in clocks if c <= clock_mhz]
        mhz = int(below[-1] if below else (clocks[0] if clocks else round(clock_mhz)))
        self.set_lock_clock(device_id, mhz)
        return mhz

    def _lock(self, device_id: str, top: int | None = None) -> int:
        """Lock the max graphics clock at `top` (default: `lock_clock_mhz`); returns the lock set."""
        n, h = self.nvml, self._handle(device_id)
        top = self.lock_clock_mhz(device_id) if top is None else top
        if top is None:
            raise Unsupported(
                f"{device_id}: the driver reports no max customer boost clock, and the top of the clock table "
                "caps nothing (a positive offset would overclock)",
                "run a bisect (it locks at the clock measured under the stock baseline) or pass --lock-mhz",
            )
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
        self._nv(
            lambda: n.nvmlDeviceSetGpuLockedClocks(h, min(floor, top), top), "locking the graphics clock"
        )
        return top

    def _unlock_quietly(self, device_id: str) -> None:
        """Failure paths: release the lock whatever else went wrong (a lock without its offset caps the card,
        an offset without its lock overclocks it)."""
        with contextlib.suppress(TunerError, AttributeError):
            self._unlock(device_id)

    def _unlock(self, device_id: str) -> None:
        """Release the locked graphics clock (`nvmlDeviceResetGpuLockedClocks`). A card without locked clocks holds
        no lock to release: the NVML reference gives offsets "For Maxwell or newer" but locked clocks "For Volta or
        newer", so a Pascal card's reset answers NotSupported and is still done once its offsets are 0."""
        h = self._handle(device_id)
        with contextlib.suppress(Unsupported):
            self._nv(lambda: self.nvml.nvmlDeviceResetGpuLockedClocks(h), "unlocking the graphics clock")

    def foreign_state(self, device_id: str) -> str | None:
        """A description of a clock offset the tuner did not set (PenguinBurner checks that every offset reads 0
        before it starts), or None. Locked clocks cannot be read through NVML."""
        recorded = self._record(device_id).get("offset_mhz", 0)
        for pstate, (current, _, _) in self._read_offsets(device_id).items():
            if current not in (0, recorded):
                where = "" if pstate is None else f" at P{pstate}"
                return f"{device_id} carries a {current:+d} MHz clock offset{where} the tuner did not set"
        return None

    def persistence_off(self, device_id: str) -> bool:
        n, h = self.nvml, self._handle(device_id)
        return self._optional(lambda: n.nvmlDeviceGetPersistenceMode(h)) == getattr(
            n, "NVML_FEATURE_DISABLED", 0
        )

    def enable_persistence(self, device_id: str) -> None:
        """Turn persistence mode on (what `nvidia-smi -pm 1` does: nvmlDeviceSetPersistenceMode) and read it back.

        Without it a headless driver tears the GPU's state down when its last client exits, offsets and locks
        included, and a one-shot boot job is such a client (NVIDIA's Driver Persistence guide). nvml.h: "not
        persistent across reboots", so the boot service does it at every boot, for the cards it applies to. NVIDIA
        calls this mode legacy, to be replaced by the persistence daemon; where the driver refuses it, the remedy
        is that daemon. Raises Unsupported, PermissionDenied or NotApplied (nothing else is written)."""
        n, h = self.nvml, self._handle(device_id)
        enabled = getattr(n, "NVML_FEATURE_ENABLED", 1)
        remedy = ("enable NVIDIA's persistence daemon (`sudo systemctl enable --now nvidia-persistenced`), or run "
                  "`sudo nvidia-smi -pm 1`, then apply again")
        why = "without it the setting would vanish when the last NVML client exits"
        try:
            self._nv(lambda: n.nvmlDeviceSetPersistenceMode(h, enabled), "turning persistence mode on")
        except TunerError as e:
            raise type(e)(f"{device_id}: {e.message}; {why}", remedy) from None
        got = self._optional(lambda: n.nvmlDeviceGetPersistenceMode(h))
        if got != enabled:
            raise NotApplied(f"{device_id}: persistence mode reads {'off' if got == 0 else got} after turning it "
                             f"on; {why}", remedy)

    # --- Backend ----------------------------------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return list(self._infos)

    def knob(self, device_id: str) -> Knob:
        offsets = self._read_offsets(device_id)
        current, lo, hi = offsets[0] if 0 in offsets else offsets[None]  # P0's, or the whole curve's
        if current == 0:
            # some drivers read 0 for an applied offset: then the tuner's record of what it applied this boot says
            current = self._recorded_offset(device_id)
        step = offset_step_mhz(self._supported_clocks(self._handle(device_id)))
        return Knob.offset(KnobKind.CLOCK_OFFSET, current, lo, hi, step, lock_clock_mhz=self.lock_clock_mhz(device_id))

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        before = self.knob(device_id)
        before.validate(value, allow_overvolt=allow_overvolt)  # OutOfRange: nothing written
        state = self._snapshot(device_id, before)  # a failed apply puts exactly this back
        first = device_id not in self._found  # the first write of a change: what a revert of it puts back
        found = self._found.get(device_id, state)
        try:
            knob = self._apply(device_id, value, before, state)
        except BaseException:
            if first:  # the card is back where it was found (or could not be): no change in progress
                self._found.pop(device_id, None)
            raise
        self._found[device_id] = found  # after the write: a reset to stock forgets what came before it
        return knob

    def _apply(self, device_id: str, value: int, before: Knob, state: FoundState) -> Knob:
        if value == before.stock:
            return self.reset(device_id)
        lock: int | None = None
        try:
            lock = self._lock(device_id)
            # Recorded before the write: if the driver's read-back lies or the tuner dies, reset still knows.
            self._save_record(device_id, value, lock)
            for pstate in self._read_offsets(device_id):
                self._write_offset(device_id, pstate, value)
            self._verify(device_id, value, before.current, lock)
        except DeviceLost:
            self._unlock_quietly(device_id)
            raise
        except TunerError as e:
            if isinstance(e, PermissionDenied | Unsupported) and lock is None:
                # The lock, the first write, was refused (not root; a card without locked clocks), and so would
                # the restore's unlock be (NVML answers each setter alike): nothing was written, say why as it is.
                raise
            self._restore(device_id, state, e)
            raise
        if self.persistence_off(device_id):
            self._warn(
                "persistence mode is off: the setting vanishes when the driver unloads "
                "(run `sudo nvidia-smi -pm 1`)"
            )
        return self.knob(device_id)

    def _verify(self, device_id: str, value: int, previous: int, lock_mhz: int) -> None:
        unverified = []
        for pstate, (got, _, _) in self._read_offsets(device_id).items():
            where = "" if pstate is None else f" at P{pstate}"
            if got == value:
                continue
            if got == 0:
                unverified.append(where.strip() or "the V/F curve")
            elif 0 < got < value and value - got < SNAP_LIMIT_MHZ:
                # The driver snaps offsets to the increment the hardware supports (LACT issue #1202).
                self._warn(f"{device_id}: the driver snapped {value:+d} MHz to {got:+d} MHz{where}")
                self._save_record(device_id, got, lock_mhz)
            else:
                raise NotApplied(
                    f"{device_id}: wrote {value:+d} MHz{where} but NVML reads back {got:+d} MHz; "
                    f"restored {previous:+d} MHz",
                    "the driver may not support offsets on this card",
                )
        if unverified:
            self._warn(
                f"{device_id}: the driver reads back +0 MHz after writing {value:+d} MHz "
                f"({', '.join(unverified)}): unverified, not proven; the tuner keeps its own record and "
                "resets it as applied (check the sustained clock under load)"
            )

    def _snapshot(self, device_id: str, knob: Knob) -> FoundState:
        """The card's state now (`knob` is its reading): each pstate's offset, and the lock only where the tuner's
        record says the offset on the card is its own (NVML cannot read a lock; see FoundState)."""
        read = {pstate: current for pstate, (current, _, _) in self._read_offsets(device_id).items()}
        recorded = self._recorded_offset(device_id)
        own = recorded == knob.current != 0
        # the tuner writes its offset to every pstate it applies at; where a driver reads that back as 0 (issue 13)
        # its record is the only memory of it, as in `knob`
        offsets = {pstate: recorded if own and current == 0 else current for pstate, current in read.items()}
        return FoundState(offsets, read, knob.current, recorded if own else 0,
                          self._recorded_lock(device_id) if own else None)

    def _put_back(self, device_id: str, state: FoundState) -> None:
        """Write `state` back as it was, each pstate's own offset and its lock (none: unlocked), and read it back;
        NotApplied when the card reads otherwise."""
        self._save_record(device_id, state.record_offset_mhz, state.lock_mhz)  # before the writes, as apply does
        # offsets before the lock: releasing the lock first would leave the new offset on an unlocked card, an
        # overclock, however briefly
        for pstate, mhz in state.offsets_mhz.items():
            self._write_offset(device_id, pstate, mhz)
        if state.lock_mhz is None:
            self._unlock(device_id)
        else:
            self._lock(device_id, state.lock_mhz)
        now = {pstate: current for pstate, (current, _, _) in self._read_offsets(device_id).items()}
        if now != state.read_mhz:
            shown = ", ".join(f"{c:+d} MHz" + ("" if p is None else f" at P{p}") for p, c in now.items())
            raise NotApplied(f"{device_id}: after putting the previous offsets back NVML reads {shown}",
                             "run `sudo tuner reset` or `sudo nvidia-smi -rgc`")

    def _restore(self, device_id: str, state: FoundState, cause: TunerError) -> None:
        """A failed apply: put back the state before it (`_put_back`), else release the lock and say so."""
        try:
            self._put_back(device_id, state)
        except TunerError as e:
            self._unlock_quietly(device_id)
            raise NotApplied(
                f"{cause.message}; restoring {state.knob_mhz:+d} MHz also failed: {e.message}",
                "run `sudo tuner reset` or `sudo nvidia-smi -rgc`",
            ) from cause

    def revert(self, device_id: str, value: int) -> Knob:
        """Put back the state found before the change in progress (each pstate's offset, the lock or none), read
        back. Without a record of it (another process's change) or where the card's knob read otherwise then, the
        value, as every backend does."""
        found = self._found.pop(device_id, None)
        if found is None or found.knob_mhz != value:
            return super().revert(device_id, value)
        try:
            self._put_back(device_id, found)
        except DeviceLost:
            self._unlock_quietly(device_id)
            raise
        return self.knob(device_id)

    def found_state(self, device_id: str) -> dict[str, Any] | None:
        found = self._found.get(device_id) or self._snapshot(device_id, self.knob(device_id))
        return msgspec.to_builtins(_FoundRecord(list(found.offsets_mhz.items()), list(found.read_mhz.items()),
                                                found.knob_mhz, found.record_offset_mhz, found.lock_mhz))

    def adopt_found(self, device_id: str, found: dict[str, Any]) -> bool:
        try:
            record = msgspec.convert(found, _FoundRecord)
        except msgspec.ValidationError:
            return False
        offsets, read = dict(record.offsets_mhz), dict(record.read_mhz)
        ranges = self._read_offsets(device_id)
        # written back like any value: within each pstate's real range, to the pstates the card has now
        if offsets.keys() != ranges.keys() or read.keys() != ranges.keys():
            return False
        if any(not lo <= offsets[pstate] <= hi for pstate, (_, lo, hi) in ranges.items()):
            return False
        if record.lock_mhz is not None:
            lo, hi = self._lock_range(device_id)
            if not lo <= record.lock_mhz <= hi:
                return False
        self._found[device_id] = FoundState(offsets, read, record.knob_mhz, record.record_offset_mhz,
                                            record.lock_mhz)
        return True

    def keep(self, device_id: str) -> None:
        """The change in progress is kept: what it found is no longer what a revert puts back."""
        self._found.pop(device_id, None)

    def reset(self, device_id: str, *, force: bool = False) -> Knob:
        recorded = self._record(device_id).get("offset_mhz", 0)
        try:
            # Write 0 wherever the driver or the tuner's own record says non-zero (a driver may read 0).
            for pstate, (current, _, _) in self._read_offsets(device_id).items():
                if current != 0 or recorded != 0:
                    self._write_offset(device_id, pstate, 0)
        finally:
            self._unlock(device_id)
        left = {p: c for p, (c, _, _) in self._read_offsets(device_id).items() if c != 0}
        if left:
            shown = ", ".join(f"{c:+d} MHz" + ("" if p is None else f" at P{p}") for p, c in left.items())
            raise NotApplied(
                f"{device_id}: after reset NVML reads {shown}, not 0", "run `sudo nvidia-smi -rgc` or reboot"
            )
        self._save_record(device_id, 0, None)
        self._found.pop(device_id, None)  # at stock: a known state, nothing found before it to put back
        return self.knob(device_id)

    def telemetry(self, device_id: str) -> Telemetry:
        """One sample. Every figure is read on its own: NotSupported (a fanless board's fan), NoPermission or a
        call this nvidia-ml-py lacks leaves that figure None and the rest still read; only a lost GPU raises."""
        n, h = self.nvml, self._handle(device_id)
        opt = self._optional
        power_mw = opt(lambda: n.nvmlDeviceGetPowerUsage(h))
        energy_mj = opt(lambda: n.nvmlDeviceGetTotalEnergyConsumption(h))
        limit_mw = opt(lambda: n.nvmlDeviceGetEnforcedPowerLimit(h))  # milliwatts
        util = opt(lambda: n.nvmlDeviceGetUtilizationRates(h))
        pstate = opt(lambda: n.nvmlDeviceGetPerformanceState(h))
        fan = opt(lambda: n.nvmlDeviceGetFanSpeed(h))  # percent; NotSupported on passively cooled boards
        memory = opt(lambda: n.nvmlDeviceGetMemoryInfo(h))  # c_nvmlMemory_t: total/free/used in bytes
        reasons = opt(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
        if reasons is None:  # nvidia-ml-py or driver before the r535 rename
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
            throttle_reasons=reason_names(n, reasons) if isinstance(reasons, int) else None,  # None: not readable
            pstate=int(pstate) if isinstance(pstate, int) and 0 <= pstate <= 15 else None,  # 32 = unknown
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            fan_pct=float(fan) if isinstance(fan, int) else None,
            vram_used_mib=_mib(getattr(memory, "used", None)),
            vram_total_mib=_mib(getattr(memory, "total", None)),
        )

    def error_counters(self, device_id: str) -> ErrorCounters:
        """ECC error counts since the driver loaded (volatile: what a screen's before/after compares) and the
        row-remapping state (Ampere and later data-centre cards), read-only: `nvmlDeviceGetTotalEccErrors(h,
        NVML_MEMORY_ERROR_TYPE_{CORRECTED,UNCORRECTED}, NVML_VOLATILE_ECC)` and `nvmlDeviceGetRemappedRows(h)` ->
        (correctable rows, uncorrectable rows, pending, failure). A card without ECC (GeForce) answers
        NotSupported: none, with why; never a 0 it did not report."""
        n, h = self.nvml, self._handle(device_id)
        counts: list[tuple[str, int]] = []
        missing: list[str] = []
        for name, kind in (("ecc_corrected_volatile", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                           ("ecc_uncorrected_volatile", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            code, volatile = getattr(n, kind, None), getattr(n, "NVML_VOLATILE_ECC", None)
            value = None if code is None or volatile is None else self._optional(
                functools.partial(n.nvmlDeviceGetTotalEccErrors, h, code, volatile))
            if isinstance(value, int):
                counts.append((name, value))
            else:
                missing.append(name)
        rows = self._optional(lambda: n.nvmlDeviceGetRemappedRows(h))
        names = ("remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failure")
        if isinstance(rows, tuple | list) and len(rows) == 4:
            counts += [(name, int(v)) for name, v in zip(names, rows, strict=True)]
        else:
            missing += list(names)
        if not counts:
            return ErrorCounters(source="nvml", why="NVML reports no ECC or row-remapping counters for this card "
                                 "(no ECC memory, or ECC off)")
        return ErrorCounters(tuple(counts), "nvml", unreadable=tuple(missing))

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
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


def discover(nvml: Nvml | None = None) -> NvidiaBackend | None:
    """The NVIDIA cards NVML sees, or None when pynvml, libnvidia-ml or the driver is missing, or no card is found."""
    nvml = nvml or import_nvml()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:  # LibraryNotFound, DriverNotLoaded, ...
        return None
    with contextlib.suppress(nvml.NVMLError, TunerError):
        if nvml.nvmlDeviceGetCount() > 0:
            backend = NvidiaBackend(nvml)
            if backend.devices():
                return backend
    with contextlib.suppress(nvml.NVMLError):  # no card, or none usable: let go of the library
        nvml.nvmlShutdown()
    return None
