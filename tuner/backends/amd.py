"""AMD cards through amdgpu sysfs (`pp_od_clk_voltage`), with amdsmi as an optional source of names and energy.

The undervolt knob is a voltage offset in mV. `vo` formats (RDNA2/3/4) take it directly; the early-RDNA3 anchors
take it per anchor; curve formats (Vega20/Navi1x `vc`, Polaris/Vega10 `s`) express it relative to the stock points
recorded at first contact (per card and boot, in the state directory): every point above the lowest moves by the
offset, floored at its own minimum, and the curve stays monotonic; a point whose clock lies outside the printed
range is moved into it (the kernel range-checks every `vc` write) and reported in `Knob.clamped`.

Writes: the edit commands, then `c`. Reset touches only the voltage: `vo 0` (RDNA2/3/4; `r` would restore the
whole table, fan curve and memory clock included, and is only a last resort), the anchors to 0 (early RDNA3), the
recorded stock points (Vega20, whose `r` re-reads the firmware's current table), `r` (Navi1x, GCN). Every write is
read back; a mismatch restores the previous value and raises. EPERM as root means the GPU is busy or resetting:
reads and not-yet-staged writes are retried a bounded number of times.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from tuner.backends import amd_od_table as od
from tuner.backends import card_records
from tuner.backends.amd_sysfs import (
    OVERDRIVE_OFF,
    DeviceBusy,
    NotAnAttribute,
    SysfsIO,
    amd_card_dirs,
    hwmon_dir,
    hwmon_telemetry,
    overdrive_missing,
    pci_pair,
    pci_slot,
    read_value,
)
from tuner.backends.amd_throttle import throttle_reasons
from tuner.backends.base import Backend, warn_on_stderr
from tuner.core import paths
from tuner.core.errors import DeviceLost, NoOffsetAllowed, NotApplied, PermissionDenied, TunerError, Unsupported
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

OD_FILE = "pp_od_clk_voltage"
STEP_MV = 1  # the kernel takes any whole mV
BUSY_RETRIES = 5  # EPERM as root (GPU resetting): tries before it counts as lost
BUSY_WAIT_S = 1.0

# amdsmi ships no type information: the module (or a fake) and its processor handles are Any.
Amdsmi = Any
AmdsmiHandle = Any
T = TypeVar("T")
# Vega20 (Radeon VII, MI50/MI60): PCI device ids 0x66a0-0x66af (amdgpu_drv.c pciidlist, CHIP_VEGA20).
VEGA20_DEVICE_IDS = range(0x66A0, 0x66B0)


def is_vega20(pci_id: str | None) -> bool:
    """True for a Vega20 PCI id, whose `r` is not stock.

    >>> is_vega20("1002:66af"), is_vega20("1002:731f"), is_vega20(None)
    (True, False, False)
    """
    try:
        vendor, device = (int(x, 16) for x in (pci_id or "").split(":"))
    except ValueError:
        return False
    return vendor == 0x1002 and device in VEGA20_DEVICE_IDS


def energy_joules(energy: object) -> float | None:
    """amdsmi's energy count in J: the counter key is `energy_accumulator` in most versions and `power` in 6.2.

    >>> energy_joules({"power": 2_000_000, "counter_resolution": 15.3}), energy_joules({"x": 1})
    (30.6, None)
    """
    if not isinstance(energy, dict) or "counter_resolution" not in energy:
        return None
    counter = energy.get("energy_accumulator", energy.get("power"))
    if not isinstance(counter, (int, float)):
        return None
    return round(counter * energy["counter_resolution"] / 1e6, 3)  # resolution is in µJ


def _first_word(path: Path) -> str | None:
    """A sysfs attribute's first word, as amdsmi reads `unique_id` (fscanf "%s"): amdgpu prints it "%016llx\\n",
    and nothing at all while the id is 0 (drivers/gpu/drm/amd/pm/amdgpu_pm.c, amdgpu_get_unique_id)."""
    words = (read_value(path) or "").split()
    return words[0] if words else None


def import_amdsmi() -> Amdsmi | None:
    """amdsmi, or None. Without ROCm's libamd_smi.so the import prints to stdout and raises KeyError (control.md
    §4); stdout is captured so it cannot corrupt a terminal UI."""
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            import amdsmi
        except (KeyError, OSError, ImportError):
            return None
    return amdsmi


@dataclass
class _Card:
    dir: Path
    info: DeviceInfo
    index: int  # position among this backend's cards (the engine's cuda:N with PCI bus ordering)
    stock_points: tuple[od.Level, ...] | None = None  # curve formats: the stock voltage points
    amdsmi_handle: AmdsmiHandle | None = None
    vega20: bool = False  # `r` re-reads the firmware's table: reset writes the recorded stock points instead


def parse_ras_count(text: str | None) -> dict[str, int] | None:
    """One `ras/*_err_count` file: {"ue": N, "ce": N[, "de": N]}; None when unreadable or not in that form.

    >>> parse_ras_count("ue: 0\\nce: 3\\n"), parse_ras_count("Query currently inaccessible\\n")
    ({'ue': 0, 'ce': 3}, None)
    """
    if not text:
        return None
    out: dict[str, int] = {}
    for line in text.strip().splitlines():
        key, sep, value = line.partition(":")
        if not sep or key.strip() not in ("ue", "ce", "de") or not value.strip().isdigit():
            return None
        out[key.strip()] = int(value.strip())
    return out or None


def recorded_points(record: dict) -> tuple[od.Level, ...] | None:
    """A stock record's points, or None when it is damaged or hand-edited: not a non-empty list of
    [index, MHz, mV] whole numbers (JSON may hold anything there: Infinity, strings, a dict).

    >>> recorded_points({"points": [[0, 800, 711], [2, 2100, 1191]]})
    (Level(index=0, mhz=800, mv=711), Level(index=2, mhz=2100, mv=1191))
    >>> recorded_points({"points": {"012": 0}}), recorded_points({"points": [[0, 800, 1e999]]})
    (None, None)
    """
    points = record.get("points")
    if not isinstance(points, list) or not points or not all(
        isinstance(p, list) and len(p) == 3 and all(isinstance(v, int) and not isinstance(v, bool) for v in p)
        for p in points
    ):
        return None
    return tuple(od.Level(i, mhz, mv) for i, mhz, mv in points)


class AmdBackend(Backend):
    name = "amd"

    def __init__(
        self,
        card_dirs: list[Path],
        *,
        root: Path | None = None,
        sysfs: SysfsIO | None = None,
        amdsmi: Amdsmi | None = None,
        clock: Callable[[], float] = time.time,
        warn: Callable[[str], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.root = Path(root) if root is not None else paths.sysfs_root()
        self.io = sysfs or SysfsIO()
        self._amdsmi = amdsmi
        self._clock = clock
        self._warn = warn or warn_on_stderr
        self._sleep = sleep
        self._cards: dict[str, _Card] = {}
        handles = self._amdsmi_handles()
        for i, d in enumerate(card_dirs):
            info = self._identify(d, handles)
            self._cards[info.id] = _Card(d, info, i, amdsmi_handle=handles.get(info.id), vega20=is_vega20(info.pci_id))
        for card in self._cards.values():  # learn each curve's stock points now, before anything is written
            with contextlib.suppress(TunerError):
                self._stock_points(card, self._table(card))

    # --- identity -------------------------------------------------------------------------------------------------
    def _amdsmi_handles(self) -> dict[str, AmdsmiHandle]:
        if self._amdsmi is None:
            return {}
        smi = self._amdsmi
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
            return {str(smi.amdsmi_get_gpu_device_bdf(h)).lower(): h for h in smi.amdsmi_get_processor_handles()}
        except Exception:  # noqa: BLE001 - amdsmi is optional; any failure means "no enrichment"
            self._amdsmi = None
            return {}

    def _smi(self, fn: str, handle: AmdsmiHandle | None, *args: object) -> Any:
        if self._amdsmi is None or handle is None:
            return None
        try:
            return getattr(self._amdsmi, fn)(handle, *args)
        except Exception:  # noqa: BLE001 - optional enrichment never breaks the sysfs path
            return None

    def _identify(self, device_dir: Path, handles: dict[str, AmdsmiHandle]) -> DeviceInfo:
        slot = pci_slot(device_dir) or device_dir.parent.name
        pci_id = pci_pair(device_dir, "vendor", "device")
        handle = handles.get(slot)
        asic = self._smi("amdsmi_get_gpu_asic_info", handle) or {}
        vbios_info = self._smi("amdsmi_get_gpu_vbios_info", handle) or {}
        name = asic.get("market_name") or read_value(device_dir / "product_name") or f"AMD GPU {pci_id or slot}"
        # One card, one serial, with or without amdsmi and whatever its version: the kernel's `unique_id` text first
        # (amdgpu prints it "%016llx"). amdsmi's asic_serial is that same number, but printed "%lu" by old releases
        # and as unpadded hex by newer ones (ROCm/amdsmi src/amd_smi/amd_smi.cc, amdsmi_get_gpu_asic_info), so it
        # counts only where sysfs has none; then the board's FRU `serial_number` (amdgpu_fru_eeprom.c; some server
        # boards only). A placeholder ("N/A", all f) is no serial: with none the card is known by its slot.
        serial = (known_serial(_first_word(device_dir / "unique_id")) or known_serial(asic.get("asic_serial"))
                  or known_serial(read_value(device_dir / "serial_number")))
        kernel = read_value(self.root / "proc/sys/kernel/osrelease")
        od_format = None
        with contextlib.suppress(TunerError):
            od_format = od.parse_od_table(self.io.read_text(device_dir / OD_FILE)).format
        return DeviceInfo(
            id=slot,
            vendor="amd",
            name=str(name),
            pci_id=pci_id,
            subsystem_id=pci_pair(device_dir, "subsystem_vendor", "subsystem_device"),
            pci_slot=slot,
            vbios=vbios_info.get("version") or read_value(device_dir / "vbios_version"),
            driver_version=f"amdgpu (kernel {kernel})" if kernel else "amdgpu",
            serial=serial,
            od_format=od_format,
        )

    def former_serials(self, device_id: str) -> tuple[str, ...]:
        """Before one card had one serial (`_identify`), it was amdsmi's asic_serial text where amdsmi was installed,
        else its FRU `serial_number`."""
        card = self._card(device_id)
        asic = self._smi("amdsmi_get_gpu_asic_info", card.amdsmi_handle) or {}
        found = (known_serial(asic.get("asic_serial")), known_serial(read_value(card.dir / "serial_number")))
        return tuple(dict.fromkeys(s for s in found if s is not None and s != card.info.serial))

    # --- the OD table ---------------------------------------------------------------------------------------------
    def _card(self, device_id: str) -> _Card:
        self.device(device_id)  # UnknownDevice with the list of ids
        return self._cards[device_id]

    def _busy_retry(self, fn: Callable[[], T]) -> T:
        """Run `fn`, retrying while the GPU answers EPERM-as-root with nothing staged (busy, resetting)."""
        for attempt in range(BUSY_RETRIES):
            try:
                return fn()
            except DeviceBusy as e:
                if e.sent or attempt == BUSY_RETRIES - 1:
                    raise
                self._sleep(BUSY_WAIT_S)
        raise AssertionError("unreachable")

    def _table(self, card: _Card) -> od.OdTable:
        try:
            text = self._busy_retry(lambda: self.io.read_text(card.dir / OD_FILE))
        except NotAnAttribute:
            raise
        except Unsupported as e:
            why, remedy = overdrive_missing(self.root)
            if why == OVERDRIVE_OFF:  # the driver allows no offset: the card runs at stock
                stock = Knob.offset(KnobKind.VOLTAGE_OFFSET, 0, 0, 0, 1, range_source="overdrive off")
                raise NoOffsetAllowed(f"{card.info.id}: {OD_FILE} is missing: {why}", remedy, stock) from e
            raise Unsupported(f"{card.info.id}: {OD_FILE} is missing: {why}", remedy) from e
        return od.parse_od_table(text)

    def _stock_points(self, card: _Card, table: od.OdTable) -> tuple[od.Level, ...]:
        """Curve formats: the points at first contact this boot, from the state directory when an earlier run
        recorded them (the card may be undervolted now), else the table as read now, recorded."""
        if card.stock_points is None and table.format in od.CURVE_FORMATS:
            record = card_records.load(card_records.STOCK, card.info.id)
            # its points written as "stock" on another card in the slot would be an overvolt there
            identity = self._record_owner(card)
            points = None
            if record and record.get("format") == table.format and record.get("card") == identity:
                points = recorded_points(record)  # None for a damaged record: read the table
            if points is None:
                points = table.voltage_points
                with contextlib.suppress(OSError):  # an unwritable state dir only loses the cross-run memory
                    card_records.save(
                        card_records.STOCK,
                        card.info.id,
                        {"format": table.format, "card": identity, "points": [[p.index, p.mhz, p.mv] for p in points]},
                    )
            card.stock_points = points
        return card.stock_points or ()

    @staticmethod
    def _record_owner(card: _Card) -> list[str | None]:
        """The card a per-card record belongs to. Records are named by slot, and another card can be in that slot
        this boot (an eGPU swapped, PCIe hot plug): a record counts only for the card it names."""
        return [card.info.pci_id, card.info.serial]

    @staticmethod
    def _floors(table: od.OdTable, points: tuple[od.Level, ...]) -> dict[int, int]:
        ranges = {p.index: od.point_volt_range(table, p.index) for p in points}
        return {index: r[0] for index, r in ranges.items() if r is not None}

    @staticmethod
    def _voltage_format(card: _Card, table: od.OdTable) -> str:
        """The table's format when it has a voltage the tuner can set, else Unsupported (nothing is written)."""
        fmt = table.format
        if fmt in od.VO_FORMATS and table.vddgfx_offset_mv is None:
            raise Unsupported(f"{card.info.id}: this board exposes no voltage offset (no OD_VDDGFX_OFFSET)")
        if fmt not in (*od.VO_FORMATS, od.RDNA3_EARLY, *od.CURVE_FORMATS):
            raise Unsupported(
                f"{card.info.id}: the {fmt} overdrive table has no voltage control",
                "APUs and boards without a voltage section can only change clocks",
            )
        return fmt

    def _knob_from(self, card: _Card, table: od.OdTable) -> Knob:
        fmt, source = self._voltage_format(card, table), "driver"
        if fmt in od.VO_FORMATS or fmt == od.RDNA3_EARLY:
            if fmt == od.RDNA3_EARLY:
                r, current = table.range("VDDC_CURVE"), min(od.point_mv(p) for p in table.vddc_curve)
            else:
                assert table.vddgfx_offset_mv is not None  # always: _voltage_format refused a table without it
                r, current = table.range("VDDGFX_OFFSET"), table.vddgfx_offset_mv
            lo, hi = (r.lo, r.hi) if r else od.RDNA2_BUILTIN_RANGE_MV
            source = "driver" if r else "built-in"
        elif fmt in od.CURVE_FORMATS:
            stock = self._stock_points(card, table)
            top = max(stock, key=lambda p: p.index)
            top_mv = od.point_mv(top)
            volt_range = od.point_volt_range(table, top.index)
            if volt_range is None:  # no range printed: allow undervolting only, by at most 200 mV
                lo, hi, source = top_mv - 200, top_mv, "built-in"
            else:
                lo, hi = volt_range
            lo, hi = lo - top_mv, hi - top_mv
            current = od.offset_of(stock, table.voltage_points)
        clamped: tuple[str, ...] = ()
        if fmt in od.CURVE_FORMATS and current != 0:
            clamped = od.clamp_report(table, self._stock_points(card, table), current)
        return Knob.offset(KnobKind.VOLTAGE_OFFSET, current, lo, hi, STEP_MV, range_source=source, clamped=clamped)

    def _commands(self, card: _Card, table: od.OdTable, value: int, *, every_point: bool = False) -> list[str]:
        """The edit commands that put `value` in place (without the commit). Curve points are written only where
        they change, unless `every_point` (after a refused commit the kernel's staged table is unknown)."""
        if table.format in od.VO_FORMATS:
            return [od.encode_vo(value)]
        if table.format == od.RDNA3_EARLY:
            return [od.encode_anchor(p.index, value) for p in table.vddc_curve]
        stock = self._stock_points(card, table)
        target = od.curve_with_offset(stock, value, self._floors(table, stock))
        now = {p.index: p for p in table.voltage_points}
        stock_mv = {p.index: od.point_mv(p) for p in stock}
        cmds = []
        for p in target:
            cur = now.get(p.index)
            if cur is not None and cur.mv == p.mv and not every_point:
                continue
            # The kernel checks the clock before the voltage: a stock point outside OD_RANGE must move into it.
            mhz = od.clamp_point_mhz(table, p.index, od.point_mhz(cur if cur is not None else p))
            mv = od.clamp_point_mv(table, p.index, od.point_mv(p))
            if mv > od.point_mv(p) and mv > stock_mv.get(p.index, mv):
                # a stock voltage below the range cannot be written back; the clamp raising it would overvolt
                # (an overvolt asked for with allow_overvolt is the target itself, not a clamp, and is written)
                continue
            if table.format == od.NAVI1X:
                cmds.append(od.encode_vc(p.index, mhz, mv))
            else:
                cmds.append(od.encode_state("s", p.index, mhz, mv))
        return cmds

    def _matches(self, card: _Card, table: od.OdTable, value: int) -> bool:
        if table.format in od.VO_FORMATS:
            return table.vddgfx_offset_mv == value
        if table.format == od.RDNA3_EARLY:
            return all(p.mv == value for p in table.vddc_curve)
        stock = self._stock_points(card, table)
        want = {p.index: p.mv for p in od.curve_with_offset(stock, value, self._floors(table, stock))}
        return {p.index: p.mv for p in table.voltage_points} == want

    def _write(self, card: _Card, commands: list[str]) -> None:
        self._busy_retry(lambda: self.io.write_commands(card.dir / OD_FILE, commands))

    # --- Backend ----------------------------------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return [c.info for c in self._cards.values()]

    def knob(self, device_id: str) -> Knob:
        card = self._card(device_id)
        return self._knob_from(card, self._table(card))

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        card = self._card(device_id)
        table = self._table(card)
        before = self._knob_from(card, table)
        before.validate(value, allow_overvolt=allow_overvolt)  # OutOfRange: nothing written
        try:
            self._write(card, [*self._commands(card, table, value), od.COMMIT])
        except (PermissionDenied, Unsupported):
            raise  # the file could not be opened: nothing was written
        except TunerError as e:
            # Some commands may have been staged before the failure (EPERM mid-sequence, EINVAL on `c`).
            self._restore(card, before.current, e)
            raise
        try:
            after = self._table(card)
            if not self._matches(card, after, value):
                got = self._knob_from(card, after).current
                raise NotApplied(
                    f"{device_id}: wrote {value:+d} mV but the card reads back {got:+d} mV; "
                    f"restored {before.current:+d} mV",
                    "see `sudo dmesg | tail`; the firmware may clamp this value",
                )
        except TunerError as e:
            # The write went through but the read-back is wrong or unreadable: never leave it unverified.
            self._restore(card, before.current, e)
            raise
        self._record(card, value)
        return self.knob(device_id)

    def _record(self, card: _Card, value: int) -> None:
        # the record is a second opinion; the read-back is the proof here
        card_records.record_applied(card.info.id, card.info.id, value, "mV",
                                    {"offset_mv": value, "card": self._record_owner(card)}, self._warn)

    def foreign_state(self, device_id: str) -> str | None:
        """A description of a voltage offset the tuner did not set (another tool, an earlier boot service), or
        None when the card is at stock or holds what the tuner recorded applying."""
        current = self.knob(device_id).current
        if current == 0:
            return None
        record = card_records.load(card_records.APPLIED, device_id) or {}
        if record.get("offset_mv") == current and record.get("card") == self._record_owner(self._card(device_id)):
            return None
        return f"{device_id} carries a {current:+d} mV voltage offset the tuner did not set"

    def _voltage_commands(self, card: _Card, table: od.OdTable, value: int) -> list[str]:
        """Commands (commit included) that set only the voltage to `value`, whatever the kernel has staged. A table
        without a voltage is Unsupported: its `r` would only wipe the user's own clock settings."""
        fmt = self._voltage_format(card, table)
        if fmt in od.VO_FORMATS or fmt == od.RDNA3_EARLY:
            # `vo`/anchors only: `r` would also restore the fan curve and memory clock (SMU13/14 restore the whole
            # overdrive table), undoing the user's other settings.
            return [*self._commands(card, table, value), od.COMMIT]
        stock = self._stock_points(card, table)
        if card.vega20:
            # Vega20's `r` re-reads the firmware's current table: write every recorded stock point instead.
            stock_table = replace(table, vddc_curve=stock)
            return [*self._commands(card, stock_table, value, every_point=True), od.COMMIT]
        # Navi1x / GCN: `r` restores the boot table (navi10 boot_overdrive_table, smu7 golden table); staged
        # edits of a refused commit go with it.
        after_r = replace(table, vddc_curve=stock) if fmt == od.NAVI1X else replace(table, sclk=stock)
        return [od.RESET, *(self._commands(card, after_r, value) if value else []), od.COMMIT]

    def _restore(self, card: _Card, previous: int, cause: TunerError) -> None:
        try:
            self._write(card, self._voltage_commands(card, self._table(card), previous))
            # read back like every write: `r` (Navi1x, GCN) puts the kernel's boot table back, which is not always
            # the stock the tuner recorded
            got = self._knob_from(card, self._table(card)).current
            if got != previous:
                raise NotApplied(f"the card reads back {got:+d} mV")
        except TunerError as e:
            # Keep the cause's type: a lost device must still read as lost to the trial runner.
            error_type = DeviceLost if isinstance(cause, DeviceLost) else NotApplied
            said = cause.message.removesuffix(f"; restored {previous:+d} mV")  # apply's read-back said it ahead
            raise error_type(
                f"{said}; restoring {previous:+d} mV also failed: {e.message}",
                "run `sudo tuner reset` or reboot",
            ) from cause

    def reset(self, device_id: str, *, force: bool = False) -> Knob:
        card = self._card(device_id)
        self._write(card, self._voltage_commands(card, self._table(card), 0))
        knob = self._knob_from(card, self._table(card))
        if knob.current != knob.stock and self._table(card).format in od.VO_FORMATS:
            # Last resort: `r` restores the whole overdrive table (fan curve, memory clock) and commits.
            self._warn(
                f"{device_id}: `vo 0` did not take; restoring the whole overdrive table with `r` "
                "(your fan curve and memory clock settings go back to stock too)"
            )
            self._write(card, [od.RESET, od.COMMIT])
            knob = self._knob_from(card, self._table(card))
        if knob.current != knob.stock:
            raise NotApplied(
                f"{device_id}: after reset the card reads {knob.current:+d} mV, not stock",
                "see `sudo dmesg | tail`; reboot to be sure",
            )
        self._record(card, 0)
        return knob

    def error_counters(self, device_id: str) -> ErrorCounters:
        """amdgpu's RAS error counts, read-only: `device/ras/<block>_err_count`, lines "ue: N" and "ce: N" (UMC also
        "de: N" on newer kernels; amdgpu_ras.c, amdgpu_ras_sysfs_read). Cards without RAS (consumer Radeons) have
        no `ras` directory: none, with why. A block that answers "Query currently inaccessible" is unreadable."""
        ras = self._card(device_id).dir / "ras"
        try:
            files = sorted(f for f in os.listdir(ras) if f.endswith("_err_count"))
        except OSError:
            return ErrorCounters(source="amdgpu ras", why="this card has no RAS error counters (no device/ras)")
        counts: list[tuple[str, int]] = []
        unreadable: list[str] = []
        for name in files[:64]:
            block = name.removesuffix("_err_count")
            parsed = parse_ras_count(self.io.read_attr(ras / name))
            if parsed is None:
                unreadable.append(f"ras_{block}")
            else:
                counts += [(f"ras_{block}_{kind}", value) for kind, value in parsed.items()]
        if not counts:
            return ErrorCounters(source="amdgpu ras", unreadable=tuple(unreadable),
                                 why="amdgpu's RAS counters could not be read now" if unreadable
                                 else "this card reports no RAS error counters")
        return ErrorCounters(tuple(counts), "amdgpu ras", unreadable=tuple(unreadable))

    def telemetry(self, device_id: str) -> Telemetry:
        card = self._card(device_id)
        sample = hwmon_telemetry(card.dir, self._clock(), self.io)
        joules = energy_joules(self._smi("amdsmi_get_energy_count", card.amdsmi_handle))
        if joules is not None:
            sample = replace(sample, energy_j=joules)
        # the reasons live only in the binary gpu_metrics table: amdsmi reads it (None without amdsmi: unknown)
        metrics = self._smi("amdsmi_get_gpu_metrics_info", card.amdsmi_handle)
        return replace(sample, throttle_reasons=throttle_reasons(metrics))

    def capabilities(self, device_id: str) -> Capabilities:
        card = self._card(device_id)
        notes: list[str] = []
        try:
            knob = self.knob(device_id)
            can_apply = True
            notes.append(f"overdrive format {self._table(card).format}")
            if card.vega20:
                notes.append("Vega20: its `r` is not stock; reset writes the stock table recorded at first contact")
            if knob.range_source == "built-in":
                notes.append(f"the driver prints no range; the tuner limits it to {knob.min:+d}..{knob.max:+d} mV")
        except TunerError as e:
            can_apply = False
            notes.append(e.one_line())
        hw = hwmon_dir(card.dir)
        return Capabilities(
            can_apply=can_apply,
            can_read_voltage=hw is not None and (hw / "in0_input").exists(),
            can_read_energy=card.amdsmi_handle is not None,
            needs_root=os.geteuid() != 0 if hasattr(os, "geteuid") else True,
            notes=tuple(notes),
        )

    def stress_target(self, device_id: str) -> StressTarget:
        card = self._card(device_id)
        return StressTarget(
            torch_device=f"cuda:{card.index}",  # ROCm builds of torch expose AMD cards as cuda devices
            pci_bus_id=card.info.pci_slot,
            env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        )

    def close(self) -> None:
        if self._amdsmi is not None:
            with contextlib.suppress(Exception):
                self._amdsmi.amdsmi_shut_down()
            self._amdsmi = None


def discover(root: Path | None = None, sysfs: SysfsIO | None = None) -> AmdBackend | None:
    """Every amdgpu card under the sysfs root, or None when there is none."""
    root = Path(root) if root is not None else paths.sysfs_root()
    dirs = amd_card_dirs(root)
    if not dirs:
        return None
    # amdsmi talks to the real hardware: never mix it with a fake tree.
    smi = import_amdsmi() if root.resolve() == Path("/") else None
    return AmdBackend(dirs, root=root, sysfs=sysfs, amdsmi=smi)
