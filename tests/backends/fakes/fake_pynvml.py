"""A fake `pynvml` module: the names the NVIDIA backend uses, a per-device state, a log of every call, pointer
checks where NVML takes a struct pointer, and injectable errors (NoPermission, NotSupported, FunctionNotFound,
GpuIsLost, library missing).

Strictness copied from the real thing:
- Offsets are per performance state (`nvmlDeviceSetClockOffsets` takes a pstate; LACT PR #461 "nvidia per-pstate
  clock offset"); some pstates only accept 0 (LACT PR #918: P8 reports min = max = 0) and P0/P2 can be linked
  (PR #918, Maxwell). CUDA work often runs in P2 on GeForce cards: `pstate` is what
  `nvmlDeviceGetPerformanceState` returns.
- `readback_zero`: the driver applies offsets but reports 0 for them (issue 13; LACT keeps its own record).
- `snap_mhz`: the driver snaps an offset to the increment the hardware supports (LACT issue #1202: "the Nvidia
  driver automatically snaps the offset values").
- `max_boost_mhz=None`: `nvmlDeviceGetMaxCustomerBoostClock` is NotSupported ("N/A" on many GeForce cards).
- `version="12.535"`: nvidia-ml-py before 12.555 has no `c_nvmlClockOffset_t` / `nvmlClockOffset_v1`
  (added with the 555 driver API), so touching them raises AttributeError.
- `nvmlDeviceGetGpcClkVfOffset` (driver >= 520) is one offset for the whole V/F curve, not per pstate.
- `nvmlDeviceGetEnforcedPowerLimit` answers in milliwatts (nvml.h), like `nvmlDeviceGetPowerUsage`.
- Persistence mode (nvml.h, nvmlDeviceSetPersistenceMode: "For Linux only. Requires root/admin permissions ...
  takes effect immediately. It is not persistent across reboots"; NVIDIA's Driver Persistence guide, "Linux": on
  a headless system "the kernel mode driver will initialize and deinitialize the target GPU each time a target GPU
  application starts and stops", and state set before is lost): with `persistence=0` and no other client keeping
  the GPU up (`kept_alive`, an X server), `nvmlShutdown` by the last client puts every offset and lock back to
  stock. `persistence_settable=False`: the setter answers NotSupported (the legacy mode is "near end-of-life and
  will be eventually deprecated in favor of the Persistence Daemon", persistence-mode-legacy.html); a mode other
  than 0/1 is InvalidArgument; `fail={"nvmlDeviceSetPersistenceMode": NO_PERMISSION}` is a non-root caller.
  `persistence_readback`: what the getter reports after a set (a driver that accepts and ignores it). The calls'
  shapes are pynvml.py's (nvidia-ml-py 13.615.71): `nvmlDeviceGetPersistenceMode(handle)` returns `c_state.value`
  (0 or 1), `nvmlDeviceSetPersistenceMode(handle, mode)` returns None; a refusal is an NVMLError subclass.
- Dashboard figures, as pynvml.py (nvidia-ml-py 13.615.71) returns them:
  * `nvmlDeviceGetFanSpeed` is a percentage (`c_uint`); fanless, passively cooled boards (data-centre cards such
    as the H200) answer NVML_ERROR_NOT_SUPPORTED: `fan_pct=None`.
  * `nvmlDeviceGetMemoryInfo(handle, version=None)` returns `c_nvmlMemory_t` with `total`, `free`, `used` in
    bytes (`_fmt_ = {'<default>': "%d B"}`).
  * `nvmlDeviceGetCurrentClocksEventReasons` / the deprecated `nvmlDeviceGetCurrentClocksThrottleReasons` return
    a `c_ulonglong` bitmask, decoded with the module's `nvmlClocksEventReason*` / `nvmlClocksThrottleReason*`
    constants. The "event" names came with the r535 API rename: `version` below 12.535 has neither the call nor
    those constants (AttributeError, like any name a module lacks); a driver older than 535 under a newer
    nvidia-ml-py answers FunctionNotFound (`missing`). `BoardLimit` (0x200) and `Reliability` (0x400) exist only
    as `nvmlClocksThrottleReason*` names, and only from 13.615 (NVML change log v610 -> v615).
  * Any of them may answer NotSupported or NoPermission (`fail`).
- `root=False`: a caller without root. The NVML reference, "Device Commands" (the chapter of every setter the
  backend uses: nvmlDeviceSetGpuLockedClocks, nvmlDeviceResetGpuLockedClocks, nvmlDeviceSetClockOffsets,
  nvmlDeviceSetGpcClkVfOffset, nvmlDeviceSetPersistenceMode; docs.nvidia.com/deploy/nvml-api/
  group__nvmlDeviceCommands.html): "Each of these requires root/admin access. Non-admin users will see an
  NVML_ERROR_NO_PERMISSION error code when invoking any of these methods": every one of them answers
  NoPermission, the reset of the locked clocks too, while the getters still answer.
- `locks_supported=False`: a card without locked clocks. The NVML reference documents nvmlDeviceSetGpuLockedClocks
  and nvmlDeviceResetGpuLockedClocks "For Volta or newer fully supported devices", NVML_ERROR_NOT_SUPPORTED "if the
  device does not support this feature": the reset is refused like the set, not a no-op.
- Error counters, read-only, as pynvml.py (nvidia-ml-py 13.615.71) returns them: `nvmlDeviceGetTotalEccErrors(h,
  errorType, counterType)` a `c_ulonglong` count (NVML_MEMORY_ERROR_TYPE_CORRECTED 0 / UNCORRECTED 1,
  NVML_VOLATILE_ECC 0 / NVML_AGGREGATE_ECC 1); `nvmlDeviceGetRemappedRows(h)` the tuple (correctable rows,
  uncorrectable rows, pending, failure occurred). A card without ECC memory (GeForce) answers NotSupported to both
  (`ecc=None`, `remapped_rows=None`); row remapping is Ampere data-centre and later only.
"""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass, field
from typing import ClassVar

NVML_SUCCESS = 0
CODES = {
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": 25,
    # nvml.h: "An internal driver error occurred"; the NVML reference gives it for nvmlDeviceGetCount ("on any
    # unexpected error") and nearly every other call, after nvmlInit has succeeded
    "NVML_ERROR_UNKNOWN": 999,
}
_BYREF_TYPE = type(ctypes.byref(ctypes.c_int()))


class NVMLError(Exception):
    _by_code: ClassVar[dict[int, type]] = {}

    def __new__(cls, value):
        sub = NVMLError._by_code.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(sub)
        obj.value = value
        return obj

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return f"NVML error {self.value}"


for _name, _code in CODES.items():
    _cls_name = "NVMLError_" + "".join(w.capitalize() for w in _name.removeprefix("NVML_ERROR_").split("_"))
    NVMLError._by_code[_code] = type(_cls_name, (NVMLError,), {})


class c_nvmlClockOffset_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("type", ctypes.c_uint),
        ("pstate", ctypes.c_uint),
        ("clockOffsetMHz", ctypes.c_int),
        ("minClockOffsetMHz", ctypes.c_int),
        ("maxClockOffsetMHz", ctypes.c_int),
    ]


@dataclass
class FakeGpu:
    bus_id: bytes = b"00000000:2B:00.0"
    name: str = "NVIDIA GeForce RTX 4090 (fake)"
    offsets: dict[int, int] = field(default_factory=lambda: {0: 0, 2: 0, 8: 0})  # per pstate, as applied
    offset_range: tuple[int, int] = (-1000, 1000)
    zero_only_pstates: frozenset[int] = frozenset({8})  # min = max = 0 there (LACT PR #918)
    vf_offset_mhz: int = 0  # the older whole-curve GpcClkVfOffset
    locked: tuple[int, int] | None = None
    graphics_clocks: list[int] = field(default_factory=lambda: list(range(3105, 195, -15)))
    max_boost_mhz: int | None = 2520  # None: NotSupported
    sm_clock_mhz: int = 2520  # what nvmlDeviceGetClockInfo(GRAPHICS) reports now
    pstate: int = 0  # what nvmlDeviceGetPerformanceState reports now
    persistence: int = 1
    persistence_settable: bool = True  # False: nvmlDeviceSetPersistenceMode answers NotSupported
    persistence_readback: int | None = None  # not None: the getter reports this whatever was set
    kept_alive: bool = False  # another client (an X server) keeps the GPU initialised with persistence off
    lost: bool = False
    locks_supported: bool = True  # False: Set/ResetGpuLockedClocks answer NotSupported (before Volta)
    ignore_offsets: bool = False  # the driver accepts offsets but they do not stick (read-back stays put)
    readback_zero: bool = False  # offsets stick but the driver reports 0 for them
    snap_mhz: int | None = None  # the driver rounds offsets down to this increment
    fan_pct: int | None = 30  # nvmlDeviceGetFanSpeed; None: NotSupported (a fanless, passively cooled board)
    memory_total_bytes: int = 25_757_220_864  # an RTX 4090's 24 GiB as nvmlDeviceGetMemoryInfo reports it
    memory_used_bytes: int = 1_610_612_736  # 1.5 GiB
    reasons: int = 0x4  # clock event reasons bitmask (0x4 = SW power cap)
    ecc: dict[tuple[int, int], int] | None = None  # (error type, counter type) -> count; None: no ECC (NotSupported)
    remapped_rows: tuple[int, int, int, int] | None = None  # None: NotSupported

    @property
    def offset_mhz(self) -> int:
        """The P0 offset (or the whole-curve one on the older API)."""
        return self.offsets.get(0, 0) or self.vf_offset_mhz

    def __repr__(self) -> str:
        return f"<gpu {self.bus_id.decode()}>"

    def store(self, pstate: int | None, mhz: int) -> None:
        if self.ignore_offsets:
            return
        if self.snap_mhz:
            mhz = int(mhz / self.snap_mhz) * self.snap_mhz
        if pstate is None:
            self.vf_offset_mhz = mhz
        else:
            self.offsets[pstate] = mhz

    def report(self, value: int) -> int:
        return 0 if self.readback_zero else value


def make_fake_nvml(
    gpus: list[FakeGpu] | None = None,
    *,
    driver: str = "560.35.03",
    library: bool = True,
    missing: set[str] | None = None,
    fail: dict[str, int] | None = None,
    version: str = "13.580",
    root: bool = True,
):
    """A module object standing in for pynvml. `missing`: NVML functions this driver lacks (FunctionNotFound);
    `fail`: function name -> NVML error code to return. `m.calls` logs (name, args) of every call."""
    m = types.ModuleType("pynvml")
    m.gpus = gpus if gpus is not None else [FakeGpu()]
    m.calls = []
    m.missing = set(missing or ())
    m.fail = dict(fail or {})
    m.root = root
    m.NVMLError = NVMLError
    for name, cls in ((c.__name__, c) for c in NVMLError._by_code.values()):
        setattr(m, name, cls)
    m.NVML_SUCCESS = NVML_SUCCESS
    for name, code in CODES.items():
        setattr(m, name, code)
    m.NVML_CLOCK_GRAPHICS, m.NVML_CLOCK_MEM = 0, 2
    for n in range(16):
        setattr(m, f"NVML_PSTATE_{n}", n)
    m.NVML_PSTATE_UNKNOWN = 32
    m.NVML_TEMPERATURE_GPU, m.NVML_FEATURE_DISABLED, m.NVML_FEATURE_ENABLED = 0, 0, 1
    m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    m.NVML_VOLATILE_ECC, m.NVML_AGGREGATE_ECC = 0, 1
    py_version = tuple(int(x) for x in version.split(".")[:2])
    reason_bits = {"GpuIdle": 0x1, "ApplicationsClocksSetting": 0x2, "SwPowerCap": 0x4, "HwSlowdown": 0x8,
                   "SyncBoost": 0x10, "SwThermalSlowdown": 0x20, "HwThermalSlowdown": 0x40,
                   "HwPowerBrakeSlowdown": 0x80, "DisplayClockSetting": 0x100}
    for name, bit in reason_bits.items():
        setattr(m, "nvmlClocksThrottleReason" + name, bit)
        if py_version >= (12, 535):
            setattr(m, "nvmlClocksEventReason" + name, bit)
    if py_version >= (13, 615):
        m.nvmlClocksThrottleReasonBoardLimit, m.nvmlClocksThrottleReasonReliability = 0x200, 0x400
    if tuple(int(x) for x in version.split(".")[:2]) >= (12, 555):
        m.c_nvmlClockOffset_t = c_nvmlClockOffset_t
        m.nvmlClockOffset_v1 = 0x1000018
    m.initialised = False

    def _nvmlCheckReturn(ret):
        if ret != NVML_SUCCESS:
            raise NVMLError(ret)
        return ret

    m._nvmlCheckReturn = _nvmlCheckReturn

    def gpu(handle) -> FakeGpu:
        if not m.initialised:
            raise NVMLError(1)  # Uninitialized
        return handle

    def api(fn):
        """Log the call, honour `missing`/`fail`, refuse a lost GPU."""
        name = fn.__name__

        def wrapper(*args):
            m.calls.append((name, args))
            if name in m.missing:
                raise NVMLError(CODES["NVML_ERROR_FUNCTION_NOT_FOUND"])
            if name in m.fail:
                raise NVMLError(m.fail[name])
            if not m.root and ("Set" in name or "Reset" in name):
                raise NVMLError(CODES["NVML_ERROR_NO_PERMISSION"])
            if args and isinstance(args[0], FakeGpu) and args[0].lost:
                raise NVMLError(CODES["NVML_ERROR_GPU_IS_LOST"])
            return fn(*args)

        wrapper.__name__ = name
        setattr(m, name, wrapper)
        return wrapper

    @api
    def nvmlInit():
        if not library:
            raise NVMLError(CODES["NVML_ERROR_LIBRARY_NOT_FOUND"])
        m.initialised = True

    @api
    def nvmlShutdown():
        m.initialised = False
        for g in m.gpus:  # the last client is gone: without persistence the driver tears the GPU's state down
            if not g.persistence and not g.kept_alive:
                g.offsets = dict.fromkeys(g.offsets, 0)
                g.vf_offset_mhz = 0
                g.locked = None

    @api
    def nvmlSystemGetDriverVersion():
        return driver

    @api
    def nvmlDeviceGetCount():
        return len(m.gpus)

    @api
    def nvmlDeviceGetHandleByIndex(i):
        return m.gpus[i]

    @api
    def nvmlDeviceGetPciInfo(h):
        return types.SimpleNamespace(busId=gpu(h).bus_id, pciDeviceId=0x268410DE, pciSubSystemId=0x889F1043)

    @api
    def nvmlDeviceGetName(h):
        return gpu(h).name

    @api
    def nvmlDeviceGetUUID(h):
        return "GPU-00000000-fake"

    @api
    def nvmlDeviceGetVbiosVersion(h):
        return "95.02.18.80.FAKE"

    @api
    def nvmlDeviceGetSupportedMemoryClocks(h):
        return [10501, 5001, 810, 405]

    @api
    def nvmlDeviceGetSupportedGraphicsClocks(h, mem):
        return list(gpu(h).graphics_clocks)

    @api
    def nvmlDeviceGetMaxCustomerBoostClock(h, kind):
        if gpu(h).max_boost_mhz is None:
            raise NVMLError(CODES["NVML_ERROR_NOT_SUPPORTED"])
        return gpu(h).max_boost_mhz

    @api
    def nvmlDeviceGetPerformanceState(h):
        return gpu(h).pstate

    @api
    def nvmlDeviceGetMaxClockInfo(h, kind):
        return max(gpu(h).graphics_clocks or [3105])

    @api
    def nvmlDeviceGetMinMaxClockOfPState(h, kind, pstate):
        clocks = gpu(h).graphics_clocks or [210, 3105]
        return min(clocks), max(clocks)

    @api
    def nvmlDeviceSetGpuLockedClocks(h, lo, hi):
        if not gpu(h).locks_supported:
            raise NVMLError(CODES["NVML_ERROR_NOT_SUPPORTED"])
        if lo > hi:
            raise NVMLError(CODES["NVML_ERROR_INVALID_ARGUMENT"])
        gpu(h).locked = (lo, hi)

    @api
    def nvmlDeviceResetGpuLockedClocks(h):
        if not gpu(h).locks_supported:
            raise NVMLError(CODES["NVML_ERROR_NOT_SUPPORTED"])
        gpu(h).locked = None

    @api
    def nvmlDeviceGetGpcClkVfOffset(h):
        return gpu(h).report(gpu(h).vf_offset_mhz)

    @api
    def nvmlDeviceGetGpcClkMinMaxVfOffset(h):
        return gpu(h).offset_range

    @api
    def nvmlDeviceSetGpcClkVfOffset(h, mhz):
        g = gpu(h)
        if not g.offset_range[0] <= mhz <= g.offset_range[1]:
            raise NVMLError(CODES["NVML_ERROR_INVALID_ARGUMENT"])
        g.store(None, mhz)

    @api
    def nvmlDeviceGetPersistenceMode(h):
        g = gpu(h)
        return g.persistence if g.persistence_readback is None else g.persistence_readback

    @api
    def nvmlDeviceSetPersistenceMode(h, mode):
        g = gpu(h)
        if mode not in (0, 1):
            raise NVMLError(CODES["NVML_ERROR_INVALID_ARGUMENT"])
        if not g.persistence_settable:
            raise NVMLError(CODES["NVML_ERROR_NOT_SUPPORTED"])
        g.persistence = mode

    @api
    def nvmlDeviceGetTotalEccErrors(h, error_type, counter_type):
        g = gpu(h)
        if g.ecc is None:
            raise NVMLError(CODES["NVML_ERROR_NOT_SUPPORTED"])
        return g.ecc.get((error_type, counter_type), 0)

    @api
    def nvmlDeviceGetRemappedRows(h):
        g = gpu(h)
        if g.remapped_rows is None:
            raise NVMLError(CODES["NVML_ERROR_NOT_SUPPORTED"])
        return g.remapped_rows

    @api
    def nvmlDeviceGetPowerUsage(h):
        return 287_500

    @api
    def nvmlDeviceGetEnforcedPowerLimit(h):
        # NVML reference: "the effective power limit that the driver enforces after taking into account all
        # limiters", in milliwatts (nvml.h, nvmlDeviceGetEnforcedPowerLimit)
        return 350_000

    @api
    def nvmlDeviceGetTotalEnergyConsumption(h):
        return 9_000_000

    @api
    def nvmlDeviceGetTemperature(h, sensor):
        return 64

    @api
    def nvmlDeviceGetClockInfo(h, kind):
        return gpu(h).sm_clock_mhz if kind == 0 else 10501

    @api
    def nvmlDeviceGetUtilizationRates(h):
        return types.SimpleNamespace(gpu=98, memory=40)

    @api
    def nvmlDeviceGetCurrentClocksEventReasons(h):
        return gpu(h).reasons

    @api
    def nvmlDeviceGetCurrentClocksThrottleReasons(h):
        return gpu(h).reasons

    @api
    def nvmlDeviceGetFanSpeed(h):
        if gpu(h).fan_pct is None:
            raise NVMLError(CODES["NVML_ERROR_NOT_SUPPORTED"])
        return gpu(h).fan_pct

    @api
    def nvmlDeviceGetMemoryInfo(h, version=None):
        g = gpu(h)
        return types.SimpleNamespace(total=g.memory_total_bytes, used=g.memory_used_bytes,
                                     free=g.memory_total_bytes - g.memory_used_bytes)

    if py_version < (12, 535):
        del m.nvmlDeviceGetCurrentClocksEventReasons

    # --- raw C entry points, reached through _nvmlGetFunctionPointer ---------------------------------------------
    def _struct(name, arg):
        if not isinstance(arg, _BYREF_TYPE):  # a Structure by value hands NVML a garbage pointer
            m.calls.append((name + ":NOT-A-POINTER", (arg,)))
            return None, CODES["NVML_ERROR_INVALID_ARGUMENT"]
        info = arg._obj
        if info.version != m.nvmlClockOffset_v1:
            return None, CODES["NVML_ERROR_ARGUMENT_VERSION_MISMATCH"]
        return info, NVML_SUCCESS

    def c_get_clock_offsets(h, arg):
        info, ret = _struct("nvmlDeviceGetClockOffsets", arg)
        m.calls.append(("nvmlDeviceGetClockOffsets", (h, info and (info.type, info.pstate))))
        if ret or "nvmlDeviceGetClockOffsets" in m.fail:
            return ret or m.fail["nvmlDeviceGetClockOffsets"]
        if h.lost:
            return CODES["NVML_ERROR_GPU_IS_LOST"]
        if info.pstate not in h.offsets:
            return CODES["NVML_ERROR_INVALID_ARGUMENT"]
        lo, hi = (0, 0) if info.pstate in h.zero_only_pstates else h.offset_range
        info.clockOffsetMHz, info.minClockOffsetMHz, info.maxClockOffsetMHz = (
            h.report(h.offsets[info.pstate]),
            lo,
            hi,
        )
        return NVML_SUCCESS

    def c_set_clock_offsets(h, arg):
        info, ret = _struct("nvmlDeviceSetClockOffsets", arg)
        m.calls.append(
            ("nvmlDeviceSetClockOffsets", (h, info and (info.type, info.pstate, info.clockOffsetMHz)))
        )
        if ret or "nvmlDeviceSetClockOffsets" in m.fail:
            return ret or m.fail["nvmlDeviceSetClockOffsets"]
        if not m.root:
            return CODES["NVML_ERROR_NO_PERMISSION"]
        if h.lost:
            return CODES["NVML_ERROR_GPU_IS_LOST"]
        if info.pstate not in h.offsets:
            return CODES["NVML_ERROR_INVALID_ARGUMENT"]
        lo, hi = (0, 0) if info.pstate in h.zero_only_pstates else h.offset_range
        if not lo <= info.clockOffsetMHz <= hi:
            return CODES["NVML_ERROR_INVALID_ARGUMENT"]
        h.store(info.pstate, info.clockOffsetMHz)
        return NVML_SUCCESS

    c_functions = {
        "nvmlDeviceGetClockOffsets": c_get_clock_offsets,
        "nvmlDeviceSetClockOffsets": c_set_clock_offsets,
    }

    def _nvmlGetFunctionPointer(name):
        if name in m.missing or name not in c_functions:
            raise NVMLError(CODES["NVML_ERROR_FUNCTION_NOT_FOUND"])
        return c_functions[name]

    m._nvmlGetFunctionPointer = _nvmlGetFunctionPointer

    def nvmlDeviceSetClockOffsets(device, info):
        m.calls.append(("BUGGY pynvml.nvmlDeviceSetClockOffsets", (device,)))
        _nvmlGetFunctionPointer("nvmlDeviceSetClockOffsets")(device, info)
        return NVML_SUCCESS

    m.nvmlDeviceSetClockOffsets = nvmlDeviceSetClockOffsets
    return m


def call_names(m, *, setters_only: bool = False) -> list[str]:
    names = [name for name, _ in m.calls]
    if setters_only:
        names = [n for n in names if "Set" in n or "Reset" in n]
    return names
