"""AMD cards through amdgpu sysfs (`pp_od_clk_voltage`), with amdsmi as an optional source of names and energy.

The undervolt knob is a voltage offset in mV. `vo` formats (RDNA2/3/4) take it directly; the early-RDNA3 anchors
take it per anchor; curve formats (Vega20/Navi1x `vc`, Polaris/Vega10 `s`) express it relative to the stock points
read at start-up (or after the last reset): every point above the lowest moves by the offset, floored at its own
minimum, and the curve stays monotonic. Writes: the edit commands, then `c`; reset: `r`, then `c`. Every write is
read back; a mismatch restores the previous value and raises.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.core import paths
from tuner.backends import amd_od_table as od
from tuner.backends.amd_sysfs import (
    SysfsIO,
    amd_card_dirs,
    hwmon_dir,
    hwmon_telemetry,
    overdrive_remedy,
    pci_pair,
    pci_slot,
    read_value,
)
from tuner.backends.base import Backend
from tuner.core.errors import DeviceLost, NotApplied, PermissionDenied, TunerError, Unsupported
from tuner.core.models import Capabilities, DeviceInfo, Knob, KnobKind, StressTarget, Telemetry

OD_FILE = "pp_od_clk_voltage"
STEP_MV = 1  # the kernel takes any whole mV


def import_amdsmi():
    """amdsmi, or None. Without ROCm's libamd_smi.so the import prints to stdout and raises KeyError (control.md
    §4); stdout is captured so it cannot corrupt a terminal UI."""
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            import amdsmi  # type: ignore[import-not-found]
        except (KeyError, OSError, ImportError):
            return None
    return amdsmi


@dataclass
class _Card:
    dir: Path
    info: DeviceInfo
    index: int  # position among this backend's cards (the engine's cuda:N with PCI bus ordering)
    stock_points: tuple[od.Level, ...] | None = None  # curve formats: the stock voltage points
    amdsmi_handle: object | None = None


class AmdBackend(Backend):
    name = "amd"

    def __init__(
        self,
        card_dirs: list[Path],
        *,
        root: Path | None = None,
        sysfs: SysfsIO | None = None,
        amdsmi=None,
        clock: Callable[[], float] = time.time,
    ):
        self.root = Path(root) if root is not None else paths.sysfs_root()
        self.io = sysfs or SysfsIO()
        self._amdsmi = amdsmi
        self._clock = clock
        self._cards: dict[str, _Card] = {}
        handles = self._amdsmi_handles()
        for i, d in enumerate(card_dirs):
            info = self._identify(d, handles)
            self._cards[info.id] = _Card(d, info, i, amdsmi_handle=handles.get(info.id))
        for card in self._cards.values():  # learn each curve's stock points now, before anything is written
            with contextlib.suppress(TunerError):
                self._stock_points(card, self._table(card))

    # --- identity -------------------------------------------------------------------------------------------------
    def _amdsmi_handles(self) -> dict[str, object]:
        if self._amdsmi is None:
            return {}
        smi = self._amdsmi
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
            return {
                str(smi.amdsmi_get_gpu_device_bdf(h)).lower(): h for h in smi.amdsmi_get_processor_handles()
            }
        except Exception:  # noqa: BLE001 - amdsmi is optional; any failure means "no enrichment"
            self._amdsmi = None
            return {}

    def _smi(self, fn: str, handle, *args):
        if self._amdsmi is None or handle is None:
            return None
        try:
            return getattr(self._amdsmi, fn)(handle, *args)
        except Exception:  # noqa: BLE001 - optional enrichment never breaks the sysfs path
            return None

    def _identify(self, device_dir: Path, handles: dict[str, object]) -> DeviceInfo:
        slot = pci_slot(device_dir) or device_dir.parent.name
        pci_id = pci_pair(device_dir, "vendor", "device")
        handle = handles.get(slot)
        asic = self._smi("amdsmi_get_gpu_asic_info", handle) or {}
        vbios_info = self._smi("amdsmi_get_gpu_vbios_info", handle) or {}
        name = (
            asic.get("market_name") or read_value(device_dir / "product_name") or f"AMD GPU {pci_id or slot}"
        )
        serial = asic.get("asic_serial") or read_value(device_dir / "serial_number")
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
            serial=str(serial) if serial else None,
            od_format=od_format,
        )

    # --- the OD table ---------------------------------------------------------------------------------------------
    def _card(self, device_id: str) -> _Card:
        self.device(device_id)  # UnknownDevice with the list of ids
        return self._cards[device_id]

    def _od_path(self, card: _Card) -> Path:
        return card.dir / OD_FILE

    def _table(self, card: _Card) -> od.OdTable:
        try:
            text = self.io.read_text(self._od_path(card))
        except Unsupported as e:
            raise Unsupported(
                f"{card.info.id}: {OD_FILE} is missing, so Overdrive is off", overdrive_remedy(self.root)
            ) from e
        return od.parse_od_table(text)

    def _stock_points(self, card: _Card, table: od.OdTable) -> tuple[od.Level, ...]:
        if card.stock_points is None and table.format in od.CURVE_FORMATS:
            card.stock_points = table.voltage_points
        return card.stock_points or ()

    @staticmethod
    def _floors(table: od.OdTable, points: tuple[od.Level, ...]) -> dict[int, int]:
        floors = {}
        for p in points:
            r = od.point_volt_range(table, p.index)
            if r is not None:
                floors[p.index] = r[0]
        return floors

    def _knob_from(self, card: _Card, table: od.OdTable) -> Knob:
        fmt, source = table.format, "driver"
        if fmt in od.VO_FORMATS:
            if table.vddgfx_offset_mv is None:
                raise Unsupported(
                    f"{card.info.id}: this board exposes no voltage offset (no OD_VDDGFX_OFFSET)"
                )
            r = table.range("VDDGFX_OFFSET")
            lo, hi = (r.lo, r.hi) if r else od.RDNA2_BUILTIN_RANGE_MV
            source = "driver" if r else "built-in"
            current = table.vddgfx_offset_mv
        elif fmt == od.RDNA3_EARLY:
            r = table.range("VDDC_CURVE")
            lo, hi = (r.lo, r.hi) if r else od.RDNA2_BUILTIN_RANGE_MV
            source = "driver" if r else "built-in"
            current = min(p.mv for p in table.vddc_curve)
        elif fmt in od.CURVE_FORMATS:
            stock = self._stock_points(card, table)
            top = max(stock, key=lambda p: p.index)
            r = od.point_volt_range(table, top.index)
            if r is None:  # no range printed: allow undervolting only, by at most 200 mV
                lo, hi, source = top.mv - 200, top.mv, "built-in"
            else:
                lo, hi = r
            lo, hi = lo - top.mv, hi - top.mv
            current = od.offset_of(stock, table.voltage_points)
        else:
            raise Unsupported(
                f"{card.info.id}: the {fmt} overdrive table has no voltage control",
                "APUs and boards without a voltage section can only change clocks",
            )
        return Knob(
            kind=KnobKind.VOLTAGE_OFFSET,
            unit="mV",
            stock=0,
            current=current,
            min=min(lo, 0),
            max=max(hi, 0),
            step=STEP_MV,
            aggressive_direction=-1,
            range_source=source,
        )

    def _commands(self, card: _Card, table: od.OdTable, value: int) -> list[str]:
        """The edit commands that put `value` in place (without the commit)."""
        if table.format in od.VO_FORMATS:
            return [od.encode_vo(value)]
        if table.format == od.RDNA3_EARLY:
            return [od.encode_anchor(p.index, value) for p in table.vddc_curve]
        stock = self._stock_points(card, table)
        target = od.curve_with_offset(stock, value, self._floors(table, stock))
        now = {p.index: p for p in table.voltage_points}
        cmds = []
        for p in target:
            cur = now.get(p.index)
            if cur is not None and cur.mv == p.mv:
                continue
            mhz = cur.mhz if cur is not None else p.mhz
            if table.format == od.NAVI1X:
                cmds.append(od.encode_vc(p.index, mhz, p.mv))
            else:
                cmds.append(od.encode_state("s", p.index, mhz, p.mv))
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
        self.io.write_commands(self._od_path(card), commands)

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
        return self.knob(device_id)

    def _restore(self, card: _Card, previous: int, cause: TunerError) -> None:
        # Start with `r`: a rejected `c` leaves the edits staged in the kernel, and the next `c` would commit them.
        try:
            commands = [od.RESET]
            if previous != 0:
                table = self._table(card)
                if table.format in od.CURVE_FORMATS:  # after `r` the card holds its stock points
                    stock = self._stock_points(card, table)
                    table = (
                        replace(table, vddc_curve=stock)
                        if table.format == od.NAVI1X
                        else replace(table, sclk=stock)
                    )
                commands += self._commands(card, table, previous)
            self._write(card, [*commands, od.COMMIT])
        except TunerError as e:
            # Keep the cause's type: a lost device must still read as lost to the trial runner.
            error_type = DeviceLost if isinstance(cause, DeviceLost) else NotApplied
            raise error_type(
                f"{cause.message}; restoring {previous:+d} mV also failed: {e.message}",
                "run `sudo tuner reset` or reboot",
            ) from cause

    def reset(self, device_id: str) -> Knob:
        card = self._card(device_id)
        self._write(card, [od.RESET, od.COMMIT])
        table = self._table(card)
        if table.format in od.CURVE_FORMATS:
            card.stock_points = (
                table.voltage_points
            )  # `r` restores the boot table: these are the true stock points
        knob = self._knob_from(card, table)
        if knob.current != knob.stock:
            raise NotApplied(
                f"{device_id}: after reset the card reads {knob.current:+d} mV, not stock",
                "see `sudo dmesg | tail`; reboot to be sure",
            )
        return knob

    def telemetry(self, device_id: str) -> Telemetry:
        card = self._card(device_id)
        sample = hwmon_telemetry(card.dir, self._clock())
        energy = self._smi("amdsmi_get_energy_count", card.amdsmi_handle)
        if isinstance(energy, dict) and "energy_accumulator" in energy and "counter_resolution" in energy:
            joules = energy["energy_accumulator"] * energy["counter_resolution"] / 1e6  # resolution is in µJ
            sample = replace(sample, energy_j=round(joules, 3))
        return sample

    def capabilities(self, device_id: str) -> Capabilities:
        card = self._card(device_id)
        notes: list[str] = []
        try:
            knob = self.knob(device_id)
            can_apply = True
            notes.append(f"overdrive format {self._table(card).format}")
            if knob.range_source == "built-in":
                notes.append(
                    f"the driver prints no range; the tuner limits it to {knob.min:+d}..{knob.max:+d} mV"
                )
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
