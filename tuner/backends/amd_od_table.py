"""Pure parser and encoders for amdgpu's `pp_od_clk_voltage` (no I/O).

The kernel prints a different table per generation; the format is detected from the sections present, never from
the PCI id (control.md §2.3-2.4). Real files contain NUL padding between sections, `Mhz`/`MHz` and `mV`/`mv`
mixed, and varying column widths; all of that is accepted. Anything else raises `OdParseError`.

>>> t = parse_od_table("OD_VDDGFX_OFFSET:\\n-10mV\\nOD_RANGE:\\nSCLK: 500Mhz 3000Mhz\\n")
>>> t.format, t.vddgfx_offset_mv, t.range("VDDGFX_OFFSET")
('rdna2', -10, None)
>>> encode_vo(-50), encode_vc(2, 2100, 1100), encode_state("s", 7, 1366, 1100), COMMIT, RESET
('vo -50', 'vc 2 2100 1100', 's 7 1366 1100', 'c', 'r')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from tuner.core.errors import Unsupported


class OdParseError(Unsupported):
    """The table is not one the tuner understands; nothing was written (exit 4)."""


# Format names (stored in DeviceInfo.od_format and profiles).
RDNA4 = "rdna4"  # OD_SCLK_OFFSET + OD_VDDGFX_OFFSET, write `vo`
RDNA3 = "rdna3"  # OD_VDDGFX_OFFSET with a VDDGFX_OFFSET range, write `vo`
RDNA2 = "rdna2"  # OD_VDDGFX_OFFSET, no range printed (the kernel checks none), write `vo`
RDNA3_EARLY = "rdna3-early"  # six OD_VDDC_CURVE anchors "N: Xmv", write `vc <anchor> <mV>`
NAVI1X = "vega20-navi1x"  # three-point OD_VDDC_CURVE "N: MHz mV", write `vc <pt> <MHz> <mV>`
GCN = "gcn"  # Polaris/Vega10 OD_SCLK/OD_MCLK states with mV, write `s|m <lvl> <MHz> <mV>`
APU = "apu"  # OD_SCLK (and CCLK on Van Gogh) only: no voltage knob
CLOCKS_ONLY = "clocks-only"  # a dGPU table without any voltage section: no voltage knob
VO_FORMATS = (RDNA4, RDNA3, RDNA2)
CURVE_FORMATS = (NAVI1X, GCN)

COMMIT, RESET = "c", "r"
MAX_COMMAND_BYTES = 127  # the kernel rejects writes of 0 or more than 127 bytes

# RDNA2 prints no VDDGFX_OFFSET range and checks none; this is the tuner's own, deliberately narrow one (the
# range the newest kernels enforce on RDNA4). Shown as range_source="built-in".
RDNA2_BUILTIN_RANGE_MV = (-200, 0)


@dataclass(frozen=True)
class Level:
    """One indexed line: `index: [MHz] [mV]`. `mhz`/`mv` are None when the line has no such column."""

    index: int
    mhz: int | None = None
    mv: int | None = None


@dataclass(frozen=True)
class Range:
    """One OD_RANGE line, e.g. `VDDGFX_OFFSET: -450mv 0mv` -> Range("VDDGFX_OFFSET", -450, 0, "mV")."""

    name: str
    lo: int
    hi: int
    unit: str  # "MHz" or "mV"


@dataclass(frozen=True)
class OdTable:
    format: str
    sclk: tuple[Level, ...] = ()
    mclk: tuple[Level, ...] = ()
    sclk_offset_mhz: int | None = None
    # Kernels before the 2025-03 smu_v14_0_2 fix print the SKU's offset limits as `0: <min>` / `1: <max>` under
    # OD_SCLK_OFFSET (OverDriveLimitsBasicMin/Max.GfxclkFoffset), not the current offset, which is then unknown.
    sclk_offset_limits_mhz: tuple[int, int] | None = None
    vddgfx_offset_mv: int | None = None
    vddc_curve: tuple[Level, ...] = ()
    ranges: tuple[Range, ...] = ()
    other_sections: tuple[str, ...] = field(default=())  # sections the tuner does not use (CCLK_RANGE ...)

    def range(self, name: str) -> Range | None:
        return next((r for r in self.ranges if r.name == name), None)

    @property
    def voltage_points(self) -> tuple[Level, ...]:
        """The points an offset moves on curve formats: the Navi1x curve, or the GCN sclk states."""
        if self.format == NAVI1X:
            return self.vddc_curve
        if self.format == GCN:
            return self.sclk
        return ()


# --- parsing ------------------------------------------------------------------------------------------------------

_HEADER = re.compile(r"([A-Z][A-Z0-9_]*(?: in Core\d+)?):")
_VALUE = re.compile(r"([+-]?\d+)\s*(mhz|mv)", re.IGNORECASE)
_INDEXED = re.compile(r"(\d+):\s*(.*)")
_RANGE_LINE = re.compile(r"([A-Z][A-Z0-9_]*(?:\[\d+\])?):\s*(.*)")
_UNITS = {"mhz": "MHz", "mv": "mV"}


def _number(digits: str, line: str) -> int:
    """`int(digits)`; a number longer than int() converts (4300 digits: only a planted file, the kernel prints %d)
    is an OdParseError like any other text the tuner does not expect."""
    try:
        return int(digits)
    except ValueError:
        raise OdParseError(f"number too long in pp_od_clk_voltage line {line[:40]!r}...") from None


def _values(text: str, line: str) -> list[tuple[int, str]]:
    """`"  852Mhz   800mV"` -> [(852, "MHz"), (800, "mV")]; anything else in the text is an error."""
    out, pos = [], 0
    text = text.strip()
    for m in _VALUE.finditer(text):
        if text[pos : m.start()].strip():
            raise OdParseError(f"unexpected text in pp_od_clk_voltage line {line!r}")
        out.append((_number(m.group(1), line), _UNITS[m.group(2).lower()]))
        pos = m.end()
    if text[pos:].strip() or not out:
        raise OdParseError(f"unexpected text in pp_od_clk_voltage line {line!r}")
    return out


def _level(index: int, values: list[tuple[int, str]], line: str) -> Level:
    mhz = [v for v, u in values if u == "MHz"]
    mv = [v for v, u in values if u == "mV"]
    if len(mhz) > 1 or len(mv) > 1 or (mhz and mv and values[0][1] != "MHz"):
        raise OdParseError(f"unexpected values in pp_od_clk_voltage line {line!r}")
    return Level(index, mhz[0] if mhz else None, mv[0] if mv else None)


def _sections(text: str) -> list[tuple[str, list[str]]]:
    # NULs pad sections in real files; treat them as line breaks so a header glued after them still starts a line.
    lines = [ln.strip() for ln in text.replace("\0", "\n").splitlines()]
    sections: list[tuple[str, list[str]]] = []
    for line in lines:
        if not line:
            continue
        m = _HEADER.fullmatch(line)
        if m:
            sections.append((m.group(1), []))
        elif not sections:
            raise OdParseError(f"pp_od_clk_voltage does not start with a section header: {line!r}")
        else:
            sections[-1][1].append(line)
    if not sections:
        # The kernel prints just "\n" when the board has no overdrive table (e.g. OD disabled in the pptable).
        raise OdParseError(
            "pp_od_clk_voltage holds no overdrive table (the driver printed nothing): "
            "this board offers no Overdrive through this kernel"
        )
    names = [name for name, _ in sections]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise OdParseError(f"pp_od_clk_voltage repeats section {sorted(dup)[0]}")
    return sections


def _indexed(lines: list[str], section: str) -> tuple[Level, ...]:
    levels = []
    for line in lines:
        m = _INDEXED.fullmatch(line)
        if not m:
            raise OdParseError(f"unexpected line in {section}: {line!r}")
        levels.append(_level(_number(m.group(1), line), _values(m.group(2), line), line))
    if len({lv.index for lv in levels}) != len(levels):
        raise OdParseError(f"{section} repeats an index")
    return tuple(levels)


def _single(lines: list[str], section: str, unit: str) -> int:
    if len(lines) != 1:
        raise OdParseError(f"{section} should hold one value, found {len(lines)} lines")
    values = _values(lines[0], lines[0])
    if len(values) != 1 or values[0][1] != unit:
        raise OdParseError(f"{section} should hold one value in {unit}: {lines[0]!r}")
    return values[0][0]


def _sclk_offset(lines: list[str]) -> tuple[int | None, tuple[int, int] | None]:
    """RDNA4's clock offset and limits: one value (the offset), or, on kernels before the 2025-03
    smu_v14_0_2_print_clk_levels fix, `0: <min>` / `1: <max>` lines, which are the limits (offset unknown)."""
    if lines and all(_INDEXED.fullmatch(line) for line in lines):
        levels = {lv.index: lv.mhz for lv in _indexed(lines, "OD_SCLK_OFFSET")}
        lo_mhz, hi_mhz = levels.get(0), levels.get(1)
        if set(levels) != {0, 1} or lo_mhz is None or hi_mhz is None:
            raise OdParseError("OD_SCLK_OFFSET should list its limits as `0: <min>Mhz` and `1: <max>Mhz`")
        return None, (lo_mhz, hi_mhz)
    return _single(lines, "OD_SCLK_OFFSET", "MHz"), None


def _ranges(lines: list[str]) -> tuple[Range, ...]:
    out = []
    for line in lines:
        m = _RANGE_LINE.fullmatch(line)
        if not m:
            raise OdParseError(f"unexpected line in OD_RANGE: {line!r}")
        values = _values(m.group(2), line)
        if len(values) != 2 or values[0][1] != values[1][1]:
            raise OdParseError(f"OD_RANGE line should hold two values in one unit: {line!r}")
        out.append(Range(m.group(1), values[0][0], values[1][0], values[0][1]))
    if len({r.name for r in out}) != len(out):
        raise OdParseError("OD_RANGE repeats a name")
    return tuple(out)


def parse_od_table(text: str | bytes) -> OdTable:
    """Parse the whole file. Raises OdParseError (and nothing else) on anything it does not recognise."""
    if isinstance(text, bytes):
        text = text.decode("ascii", errors="replace")
    sections = dict(_sections(text))
    sclk = _indexed(sections["OD_SCLK"], "OD_SCLK") if "OD_SCLK" in sections else ()
    mclk = _indexed(sections["OD_MCLK"], "OD_MCLK") if "OD_MCLK" in sections else ()
    curve = _indexed(sections["OD_VDDC_CURVE"], "OD_VDDC_CURVE") if "OD_VDDC_CURVE" in sections else ()
    sclk_offset, sclk_limits = (
        _sclk_offset(sections["OD_SCLK_OFFSET"]) if "OD_SCLK_OFFSET" in sections else (None, None)
    )
    vo = (
        _single(sections["OD_VDDGFX_OFFSET"], "OD_VDDGFX_OFFSET", "mV")
        if "OD_VDDGFX_OFFSET" in sections
        else None
    )
    ranges = _ranges(sections["OD_RANGE"]) if "OD_RANGE" in sections else ()
    known = {"OD_SCLK", "OD_MCLK", "OD_VDDC_CURVE", "OD_SCLK_OFFSET", "OD_VDDGFX_OFFSET", "OD_RANGE"}
    table = OdTable(
        format="",
        sclk=sclk,
        mclk=mclk,
        sclk_offset_mhz=sclk_offset,
        sclk_offset_limits_mhz=sclk_limits,
        vddgfx_offset_mv=vo,
        vddc_curve=curve,
        ranges=ranges,
        other_sections=tuple(n for n in sections if n not in known),
    )
    return replace(table, format=detect_format(table))


def detect_format(t: OdTable) -> str:
    """The generation, from the sections present (control.md §2.4), checking each one is self-consistent."""
    names = {r.name for r in t.ranges}
    if t.sclk_offset_mhz is not None or t.sclk_offset_limits_mhz is not None:
        return RDNA4
    if t.vddgfx_offset_mv is not None:
        return RDNA3 if "VDDGFX_OFFSET" in names else RDNA2
    if t.vddc_curve:
        if all(p.mhz is not None and p.mv is not None for p in t.vddc_curve):
            return NAVI1X
        if all(p.mhz is None and p.mv is not None for p in t.vddc_curve):
            return RDNA3_EARLY
        raise OdParseError("OD_VDDC_CURVE mixes anchor and clock/voltage points")
    if t.sclk and all(s.mhz is not None and s.mv is not None for s in t.sclk):
        return GCN
    if t.sclk and all(s.mhz is not None and s.mv is None for s in t.sclk):
        return CLOCKS_ONLY if t.mclk else APU
    if not t.sclk and not t.mclk and not t.ranges:
        raise OdParseError("pp_od_clk_voltage has no section the tuner knows")
    return CLOCKS_ONLY


# --- encoders: one kernel command each, without the newline the writer adds ---------------------------------------


def _check(cmd: str) -> str:
    if len(cmd) + 1 > MAX_COMMAND_BYTES:
        raise ValueError(f"command too long for the kernel: {cmd!r}")
    return cmd


def encode_vo(offset_mv: int) -> str:
    return _check(f"vo {int(offset_mv)}")


def encode_vc(point: int, mhz: int, mv: int) -> str:
    return _check(f"vc {int(point)} {int(mhz)} {int(mv)}")


def encode_anchor(anchor: int, offset_mv: int) -> str:
    """Early RDNA3 (pre-2023-08 SMU13 kernels): `vc <anchor 0-5> <offset mV>`."""
    return _check(f"vc {int(anchor)} {int(offset_mv)}")


def encode_state(kind: str, level: int, mhz: int, mv: int) -> str:
    """GCN (Polaris/Vega10): `s|m <level> <MHz> <mV>`."""
    if kind not in ("s", "m"):
        raise ValueError(kind)
    return _check(f"{kind} {int(level)} {int(mhz)} {int(mv)}")


# --- voltage offsets on curve formats --------------------------------------------------------------------------------


def point_volt_range(t: OdTable, index: int) -> tuple[int, int] | None:
    """The allowed mV of one point: `VDDC_CURVE_VOLT[i]` (Navi1x) or `VDDC` (GCN)."""
    r = t.range(f"VDDC_CURVE_VOLT[{index}]") if t.format == NAVI1X else t.range("VDDC")
    return (r.lo, r.hi) if r else None


def clamp_point_mhz(t: OdTable, index: int, mhz: int) -> int:
    """`mhz` moved into the point's printed clock range (`VDDC_CURVE_SCLK[i]` on Navi1x, `SCLK` on GCN). The
    kernel range-checks the clock of every `vc`/`s` write before its voltage (navi10_od_setting_check_range,
    vega20_odn_edit_dpm_table), and stock tables can hold points outside it (an RX 5500 XT: point 0 at 500 MHz
    against 800-2200 MHz): such a point cannot be written back unchanged. amdgpu-sysfs-rs normalises the curve
    into the range the same way.

    >>> t = OdTable(NAVI1X, ranges=(Range("VDDC_CURVE_SCLK[0]", 800, 2200, "MHz"),))
    >>> clamp_point_mhz(t, 0, 500), clamp_point_mhz(t, 0, 1000), clamp_point_mhz(t, 1, 500)
    (800, 1000, 500)
    """
    r = t.range(f"VDDC_CURVE_SCLK[{index}]") if t.format == NAVI1X else t.range("SCLK")
    return mhz if r is None else min(max(mhz, r.lo), r.hi)


def clamp_point_mv(t: OdTable, index: int, mv: int) -> int:
    """`mv` moved into the point's printed voltage range."""
    r = point_volt_range(t, index)
    return mv if r is None else min(max(mv, r[0]), r[1])


def clamp_report(t: OdTable, stock: tuple[Level, ...], offset_mv: int) -> tuple[str, ...]:
    """One line per point whose achieved offset differs from the one asked, or whose clock had to move into the
    printed range, read from table `t` against the stock points.

    >>> stock = (Level(0, 500, 710), Level(1, 1162, 794), Level(2, 1825, 1115))
    >>> now = OdTable(NAVI1X, vddc_curve=(Level(0, 800, 700), Level(1, 1162, 700), Level(2, 1825, 1015)))
    >>> clamp_report(now, stock, -100)
    ('point 0: clock 500->800 MHz (moved into OD_RANGE), -10 mV', 'point 1: -94 mV of -100 mV asked')
    """
    now = {p.index: p for p in t.voltage_points}
    lowest = min((p.index for p in stock), default=0)
    lines = []
    for p in sorted(stock, key=lambda p: p.index):
        cur = now.get(p.index)
        if cur is None or cur.mv is None or p.mv is None:
            continue
        achieved = cur.mv - p.mv
        moved = cur.mhz != p.mhz
        if moved:
            lines.append(
                f"point {p.index}: clock {p.mhz}->{cur.mhz} MHz (moved into OD_RANGE), {achieved:+d} mV"
            )
        elif p.index != lowest and achieved != offset_mv:
            lines.append(f"point {p.index}: {achieved:+d} mV of {offset_mv:+d} mV asked")
    return tuple(lines)


def point_mhz(point: Level) -> int:
    """A curve point's MHz: a point without one cannot be written back (`vc`/`s` take both columns)."""
    if point.mhz is None:
        raise OdParseError(f"voltage curve point {point.index} has no MHz value")
    return point.mhz


def point_mv(point: Level) -> int:
    """A voltage-curve point's mV: a point without one cannot be moved, so the table is unusable."""
    if point.mv is None:
        raise OdParseError(f"voltage curve point {point.index} has no mV value")
    return point.mv


def curve_with_offset(
    stock: tuple[Level, ...], offset_mv: int, floor_mv: dict[int, int]
) -> tuple[Level, ...]:
    """The stock points with every point above the lowest moved by `offset_mv` (each floored at its own minimum),
    then lower points pulled down where needed so the curve never rises towards lower clocks.

    >>> pts = (Level(0, 800, 711), Level(1, 1450, 801), Level(2, 2100, 1191))
    >>> [p.mv for p in curve_with_offset(pts, -100, {0: 750, 1: 750, 2: 750})]
    [711, 750, 1091]
    >>> [p.mv for p in curve_with_offset(pts, -500, {})]
    [301, 301, 691]
    """
    if not stock:
        return ()
    ordered = sorted(stock, key=lambda p: p.index)
    new = [point_mv(p) for p in ordered]
    for i, p in enumerate(ordered):
        if i == 0:
            continue
        target = new[i] + offset_mv
        floor = floor_mv.get(p.index)
        if offset_mv < 0 and floor is not None:
            target = max(
                target, min(floor, new[i])
            )  # never below the minimum, nor raise a point already below it
        new[i] = target
    for i in range(len(new) - 2, -1, -1):
        new[i] = min(new[i], new[i + 1])
    return tuple(Level(p.index, p.mhz, mv) for p, mv in zip(ordered, new, strict=True))


def offset_of(stock: tuple[Level, ...], current: tuple[Level, ...]) -> int:
    """The offset a curve shows: how far its top point sits from the stock top point."""
    top = max(stock, key=lambda p: p.index)
    now_mv = {p.index: p.mv for p in current}.get(top.index)
    if now_mv is None or top.mv is None:
        raise OdParseError("the voltage curve lost its top point")
    return now_mv - top.mv
