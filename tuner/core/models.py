"""The vocabulary every part of the tuner shares: a device, its undervolt knob, a telemetry sample.

Plain dataclasses, no I/O. Units live in field names (`offset_mv`, `power_w`, `temp_edge_c`).
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass, field
from enum import Enum, StrEnum

from tuner.core.errors import OutOfRange


class KnobKind(str, Enum):
    VOLTAGE_OFFSET = "voltage_offset"  # AMD: a vddgfx offset in mV; more negative is more aggressive
    CLOCK_OFFSET = "clock_offset"  # NVIDIA: a positive graphics clock offset in MHz at a locked max clock


# each knob kind's unit, declared once (a knob, a profile's setting, the root helper's imported entries)
KIND_UNITS = {KnobKind.VOLTAGE_OFFSET.value: "mV", KnobKind.CLOCK_OFFSET.value: "MHz"}


class Mode(StrEnum):
    """The stress engine's workload (its `--mode`)."""

    TRAIN = "train"
    GEMM = "gemm"
    MIXED = "mixed"


class Phase(StrEnum):
    """Which part of a bisect a trial belongs to; `manual` is a stress run started by hand."""

    BASELINE = "baseline"
    REPLAY = "replay"  # the baseline replayed at stock in a second engine process (repeatability proof)
    COARSE = "coarse"
    REFINE = "refine"
    CONFIRM = "confirm"
    CONTROL = "control"  # a stock run against the same reference after a mismatch/canary failure
    MANUAL = "manual"


class Verdict(StrEnum):
    """A trial's outcome. The values are written to journals and profiles: never rename them."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    STOPPED = "stopped"
    INCONCLUSIVE = "inconclusive"  # too short, the tool died, the engine was killed from outside: re-run


def printable(text: str) -> str:
    """`text` with control and format characters (Unicode Cc, Cf: ESC, CR, BEL, bidi overrides) escaped.

    >>> printable("RX 9070\\x1b[2J\\u202e")
    'RX 9070\\\\x1b[2J\\\\u202e'
    """
    return "".join(ch if unicodedata.category(ch) not in ("Cc", "Cf") else
                   (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}") for ch in text)


# What drivers and libraries print for a serial they cannot read: amdsmi "N/A" (ROCm/rocm-systems PR #3041), older
# amdsmi a hex placeholder (all f, PR #2269, or all zeros), amdgpu's serial_number an empty line or zeros (unique_id
# 0). Every card without a serial prints the same one, so taken as a serial it would make them one card.
SERIAL_PLACEHOLDERS = frozenset({"n/a", "na", "none", "null", "unknown", "not available", "not supported"})


def known_serial(raw: object) -> str | None:
    """The serial a driver reported, or None when it is none or a placeholder (the rule every backend uses).

    >>> known_serial(" 0x1a2b "), known_serial("GPU-8f2c"), known_serial("N/A"), known_serial("0xFFFFFFFFFFFFFFFF")
    ('0x1a2b', 'GPU-8f2c', None, None)
    >>> known_serial("0000000000000000"), known_serial(""), known_serial(None)
    (None, None, None)
    """
    serial = str(raw).strip() if raw is not None else ""
    digits = serial.lower().removeprefix("0x")
    if not digits or serial.lower() in SERIAL_PLACEHOLDERS or set(digits) in ({"0"}, {"f"}):
        return None
    return serial


def same_serial(a: str | None, b: str | None) -> bool | None:
    """Are two recorded serials the same card's? None when either is unknown (a placeholder included: it never counts
    as a difference or as a match); the one rule for a profile's card (tuner.profiles.identity) and a journal's.

    A hexadecimal serial is compared as a number: amdsmi prints a card's unique_id without the kernel's leading zeros.

    >>> same_serial("GPU-8F2C", "gpu-8f2c"), same_serial("0x1a", "0x1b"), same_serial("N/A", "0x1a")
    (True, False, None)
    >>> same_serial("0a0b3c4d6e7f8091", "a0b3c4d6e7f8091")
    True
    """
    a, b = known_serial(a), known_serial(b)
    return None if a is None or b is None else _serial_text(a) == _serial_text(b)


def _serial_text(serial: str) -> str:
    text = serial.lower()
    digits = text.removeprefix("0x")
    return digits.lstrip("0") if all(c in "0123456789abcdef" for c in digits) else text


@dataclass(frozen=True)
class DeviceInfo:
    """Who a card is. `id` is its PCI slot (`0000:03:00.0`) for real cards, `simN` for simulated ones."""

    id: str
    vendor: str  # "amd", "nvidia" or "simulated"
    name: str
    pci_id: str | None = None  # vendor:device, e.g. "1002:7550"
    subsystem_id: str | None = None  # subsystem vendor:device
    pci_slot: str | None = None
    vbios: str | None = None
    driver_version: str | None = None
    serial: str | None = None  # serial number or NVIDIA UUID, when the driver tells
    od_format: str | None = None  # AMD overdrive table format ("rdna4", "navi1x", ...), NVML API, "simulated"
    simulated: bool = False

    @property
    def label(self) -> str:
        """Name as shown to people: a simulated card always says so. The name comes from the driver (or a planted
        sysfs file): control and format characters are escaped so it cannot move the cursor, clear the screen or
        reorder text on the terminal."""
        name = printable(self.name)
        return f"{name} [SIMULATED]" if self.simulated else name

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Knob:
    """What "undervolt" means on one device, with its real range.

    `aggressive_direction` is -1 when lower values undervolt harder (mV offsets) and +1 when higher values do
    (NVIDIA clock offsets). Values are integers in `unit`.
    """

    kind: KnobKind
    unit: str  # "mV" or "MHz"
    stock: int
    current: int
    min: int
    max: int
    step: int
    aggressive_direction: int
    lock_clock_mhz: int | None = None  # NVIDIA: the max graphics clock the offset is applied at
    range_source: str = "driver"  # "driver" when read from the device, "built-in" when imposed by the tuner
    # AMD curve formats: one line per point the driver's range forced away from the asked offset (the offset
    # actually achieved at that point, or a clock moved into OD_RANGE). Empty when every point got what was asked.
    clamped: tuple[str, ...] = ()

    @classmethod
    def offset(cls, kind: KnobKind, current: int, lo: int, hi: int, step: int, *, lock_clock_mhz: int | None = None,
               range_source: str = "driver", clamped: tuple[str, ...] = ()) -> Knob:
        """A driver's offset knob: stock is no offset, and the range `lo`..`hi` read from the driver is widened to
        take stock in; the unit and the aggressive direction are the kind's (mV lower, MHz higher)."""
        unit, direction = KIND_UNITS[kind.value], (-1 if kind is KnobKind.VOLTAGE_OFFSET else 1)
        return cls(kind, unit, 0, current, min(lo, 0), max(hi, 0), step, direction, lock_clock_mhz=lock_clock_mhz,
                   range_source=range_source, clamped=clamped)

    def is_overvolt(self, value: int) -> bool:
        """True when `value` is on the less efficient side of stock (more voltage than stock at a clock)."""
        return (value - self.stock) * self.aggressive_direction < 0

    def more_aggressive(self, a: int, b: int) -> bool:
        """True when `a` undervolts harder than `b`."""
        return (a - b) * self.aggressive_direction > 0

    def shifted(self, value: int, steps: int) -> int:
        """`value` moved by `steps` steps in the aggressive direction (negative steps back off)."""
        return value + steps * self.step * self.aggressive_direction

    def validate(self, value: int, *, allow_overvolt: bool = False) -> int:
        """Return `value` if it may be written to this device, else raise OutOfRange with a remedy."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise OutOfRange(f"setting must be a whole number of {self.unit}, got {value!r}")
        if not self.min <= value <= self.max:
            raise OutOfRange(
                f"{value:+d} {self.unit} is outside this card's range {self.min:+d}..{self.max:+d} {self.unit}",
                f"pick a value between {self.min:+d} and {self.max:+d}",
            )
        if (value - self.stock) % self.step:
            below = value - (value - self.stock) % self.step
            raise OutOfRange(
                f"{value:+d} {self.unit} is not on this card's {self.step} {self.unit} step",
                f"use {below:+d} or {below + self.step:+d}",
            )
        if self.is_overvolt(value) and not allow_overvolt:
            raise OutOfRange(
                f"{value:+d} {self.unit} would raise the voltage above stock (overvolt)",
                "pass --allow-overvolt if you really mean it",
            )
        return value

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kind"] = self.kind.value
        if self.clamped:  # present only when something was clamped (keeps the usual document unchanged)
            d["clamped"] = list(self.clamped)
        else:
            del d["clamped"]
        return d


@dataclass(frozen=True)
class Telemetry:
    """One sample. `None` means the device does not report that figure (never a made-up 0)."""

    time_s: float  # time.time() of the sample
    power_w: float | None = None
    temp_edge_c: float | None = None
    temp_hotspot_c: float | None = None
    temp_mem_c: float | None = None
    core_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    voltage_mv: float | None = None
    util_pct: float | None = None
    fan_rpm: float | None = None
    energy_j: float | None = None  # a monotonically increasing counter, when the device has one
    # clock-limit reasons the driver reports now; None: this backend cannot read them (AMD without amdsmi: they
    # exist only in the binary gpu_metrics), which is not the same as () "none active"
    throttle_reasons: tuple[str, ...] | None = ()
    pstate: int | None = None  # NVIDIA performance state (0 = P0), when the driver reports it
    fan_pct: float | None = None  # fan speed as a share of its maximum, when the device reports it
    vram_used_mib: float | None = None
    vram_total_mib: float | None = None
    power_limit_w: float | None = None  # the board power limit the driver enforces now, when it says

    def to_dict(self) -> dict:
        d = asdict(self)
        d["throttle_reasons"] = None if self.throttle_reasons is None else list(self.throttle_reasons)
        return d


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do on one device; the UI greys out what is missing instead of failing."""

    can_apply: bool
    can_read_voltage: bool
    can_read_energy: bool
    needs_root: bool
    notes: tuple[str, ...] = ()


def same_bus_id(a: str, b: str) -> bool:
    """Two PCI addresses name one slot: `0000:03:00.0` matches `03:00.0` (no domain: domain 0000) and
    `00000000:03:00.0` (NVML's long domain), never `0001:03:00.0`. Text that is no address matches only itself."""
    def norm(s: str) -> tuple[int, ...]:
        parts = s.lower().replace(".", ":").split(":")
        nums = [int(x, 16) for x in parts if x]
        return tuple(nums[-3:]) + ((nums[-4],) if len(nums) >= 4 else (0,))
    try:
        return norm(a) == norm(b)
    except ValueError:
        return a.lower() == b.lower()


@dataclass(frozen=True)
class StressTarget:
    """How to stress one device: the engine's `--device` string, and the faults a simulated card injects."""

    torch_device: str  # "cuda:0", "cpu", ...
    pci_bus_id: str | None  # the slot the engine must report, so we know we stress the card we tune
    fault_rate: float = 0.0  # simulated cards only: per-step probability of a silent bit flip
    hang: bool = False  # simulated cards only: the card "hangs" at this setting
    simulated: bool = False
    env: dict[str, str] = field(default_factory=dict)  # e.g. CUDA_DEVICE_ORDER=PCI_BUS_ID
    # simulated cards only: platform flaws, as engine option fields (sim_nondeterministic, sim_contention_at)
    engine_options: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class ErrorCounters:
    """A card's hardware error counters, read-only, at one moment: (name, count) pairs as the driver reports them
    (NVML ECC and row remapping, amdgpu `ras/*_err_count`). No pairs, with `why`: this card or backend has none to
    read; never a made-up 0. A counter that could not be read this time is absent, and named in `unreadable`."""

    counts: tuple[tuple[str, int], ...] = ()
    source: str | None = None  # "nvml", "amdgpu ras"
    why: str | None = None
    unreadable: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        return bool(self.counts)

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)
