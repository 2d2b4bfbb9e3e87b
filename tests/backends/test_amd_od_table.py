"""The pp_od_clk_voltage parser and encoders: every format from hand-written text, plus properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.backends import amd_od_table as od
from tuner.core.errors import TunerError

from .fakes.fake_kernel import render_od_table
from .fakes.trees import OD_TEXT

EXPECTED = {
    "rdna4": {"vddgfx_offset_mv": 0, "sclk_offset_mhz": 0},
    "rdna3": {"vddgfx_offset_mv": 0},
    "rdna2": {"vddgfx_offset_mv": 0},
    "rdna3-early": {"vddgfx_offset_mv": None},
    "vega20-navi1x": {"vddgfx_offset_mv": None},
    "gcn": {"vddgfx_offset_mv": None},
    "apu": {"vddgfx_offset_mv": None},
}


@pytest.mark.parametrize("fmt", list(OD_TEXT))
def test_each_format_is_detected_from_its_sections(fmt):
    table = od.parse_od_table(OD_TEXT[fmt])
    assert table.format == fmt
    for attr, value in EXPECTED[fmt].items():
        assert getattr(table, attr) == value


def test_rdna3_range_mixed_units_and_nul_padding():
    t = od.parse_od_table(OD_TEXT["rdna3"])
    assert t.range("VDDGFX_OFFSET") == od.Range("VDDGFX_OFFSET", -400, 0, "mV")
    assert t.range("MCLK") == od.Range("MCLK", 97, 1400, "MHz")
    assert "\0" in OD_TEXT["rdna3"]


def test_rdna2_has_no_range_so_none_is_reported():
    assert od.parse_od_table(OD_TEXT["rdna2"]).range("VDDGFX_OFFSET") is None


def test_navi1x_curve_and_per_point_ranges():
    t = od.parse_od_table(OD_TEXT["vega20-navi1x"])
    assert t.vddc_curve == (od.Level(0, 700, 720), od.Level(1, 1400, 820), od.Level(2, 2000, 1150))
    assert od.point_volt_range(t, 2) == (730, 1180)


def test_gcn_states_carry_voltages():
    t = od.parse_od_table(OD_TEXT["gcn"])
    assert t.sclk[-1] == od.Level(7, 1350, 1160) and t.mclk[1] == od.Level(1, 1750, 950)
    assert od.point_volt_range(t, 3) == (740, 1200)


def test_early_rdna3_anchors_without_final_newline():
    t = od.parse_od_table(OD_TEXT["rdna3-early"])
    assert [p.mv for p in t.vddc_curve] == [0] * 6 and all(p.mhz is None for p in t.vddc_curve)
    assert t.range("VDDC_CURVE") == od.Range("VDDC_CURVE", -300, 0, "mV")


def test_legacy_rdna4_sclk_offset_lines_are_limits_not_the_offset():
    """smu_v14_0_2_print_clk_levels before the 2025-03 fix printed OverDriveLimitsBasicMin/Max.GfxclkFoffset as
    `0:`/`1:`: the limits. The current clock offset is unknown then, never the maximum."""
    t = od.parse_od_table("OD_SCLK_OFFSET:\n0: -400Mhz\n1: 50Mhz\nOD_VDDGFX_OFFSET:\n-20mV\n")
    assert (t.format, t.sclk_offset_mhz, t.sclk_offset_limits_mhz, t.vddgfx_offset_mv) == (
        "rdna4",
        None,
        (-400, 50),
        -20,
    )
    assert od.parse_od_table(render_od_table(t)) == t


def test_a_table_that_is_only_a_newline_means_no_overdrive_table():
    with pytest.raises(od.OdParseError) as e:
        od.parse_od_table("\n")
    assert "no overdrive table" in e.value.message and "empty" not in e.value.message


def test_van_gogh_extra_sections_are_tolerated():
    t = od.parse_od_table(
        "OD_SCLK:\n0:  1600Mhz\n1:  1600Mhz\nOD_RANGE:\nSCLK:  200Mhz  1600Mhz\n"
        "CCLK:  1400Mhz  3500Mhz\nCCLK_RANGE in Core0:\n0:  1400Mhz\n1:  3500Mhz"
    )
    assert t.format == "apu" and t.other_sections == ("CCLK_RANGE in Core0",)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\0\0\0",
        "hello",
        "OD_SCLK:\n0: 5GHz\n",
        "0: 500Mhz\n",
        "OD_VDDGFX_OFFSET:\n-10\n",
        "OD_RANGE:\nSCLK: 1Mhz\n",
        "OD_VDDC_CURVE:\n0: 0mv\n1: 800MHz 700mV\n",
        "OD_SCLK:\nOD_SCLK:\n",
        # longer than int() converts (4300 digits): a planted file under TUNER_SYSFS_ROOT; the kernel prints %d
        "OD_VDDGFX_OFFSET:\n" + "1" * 5000 + "mV\n",
        "OD_SCLK:\n" + "9" * 5000 + ": 500Mhz\n",
    ],
)
def test_garbage_raises_a_typed_parse_error(text):
    with pytest.raises(od.OdParseError):
        od.parse_od_table(text)


def test_encoders_and_length_limit():
    assert od.encode_vo(-50) == "vo -50"
    assert od.encode_vc(1, 1400, 780) == "vc 1 1400 780"
    assert od.encode_anchor(5, -30) == "vc 5 -30"
    assert od.encode_state("s", 7, 1350, 1100) == "s 7 1350 1100"
    with pytest.raises(ValueError):
        od.encode_state("x", 0, 1, 1)
    with pytest.raises(ValueError):
        od.encode_vo(10**130)


def test_curve_offset_floors_and_stays_monotonic():
    pts = (od.Level(0, 700, 720), od.Level(1, 1400, 820), od.Level(2, 2000, 1150))
    assert [p.mv for p in od.curve_with_offset(pts, -100, {0: 730, 1: 730, 2: 730})] == [720, 730, 1050]
    assert od.offset_of(pts, od.curve_with_offset(pts, -100, {})) == -100


# --- properties ---------------------------------------------------------------------------------------------------

mhz = st.integers(0, 5000)
mv = st.integers(-500, 1500)


def _levels(draw, n, with_mhz, with_mv):
    return tuple(
        od.Level(i, draw(mhz) if with_mhz else None, draw(mv) if with_mv else None) for i in range(n)
    )


@st.composite
def tables(draw):
    fmt = draw(st.sampled_from(["rdna4", "rdna3", "rdna2", "rdna3-early", "vega20-navi1x", "gcn", "apu"]))
    rng = lambda name, unit: od.Range(name, draw(st.integers(-500, 0)), draw(st.integers(0, 5000)), unit)  # noqa: E731
    t = od.OdTable(format=fmt)
    if fmt == "rdna4":
        t = od.OdTable(
            fmt,
            mclk=_levels(draw, 2, True, False),
            sclk_offset_mhz=draw(st.integers(-500, 1000)),
            vddgfx_offset_mv=draw(mv),
            ranges=(rng("SCLK_OFFSET", "MHz"), rng("VDDGFX_OFFSET", "mV")),
        )
    elif fmt in ("rdna3", "rdna2"):
        ranges = (rng("SCLK", "MHz"),) + ((rng("VDDGFX_OFFSET", "mV"),) if fmt == "rdna3" else ())
        t = od.OdTable(
            fmt,
            sclk=_levels(draw, 2, True, False),
            mclk=_levels(draw, 2, True, False),
            vddgfx_offset_mv=draw(mv),
            ranges=ranges,
        )
    elif fmt == "rdna3-early":
        t = od.OdTable(
            fmt,
            sclk=_levels(draw, 2, True, False),
            vddc_curve=_levels(draw, 6, False, True),
            ranges=(rng("VDDC_CURVE", "mV"),),
        )
    elif fmt == "vega20-navi1x":
        t = od.OdTable(
            fmt,
            sclk=_levels(draw, 2, True, False),
            vddc_curve=_levels(draw, 3, True, True),
            ranges=tuple(rng(f"VDDC_CURVE_VOLT[{i}]", "mV") for i in range(3)),
        )
    elif fmt == "gcn":
        t = od.OdTable(
            fmt,
            sclk=_levels(draw, draw(st.integers(1, 8)), True, True),
            mclk=_levels(draw, 2, True, True),
            ranges=(rng("VDDC", "mV"),),
        )
    else:
        t = od.OdTable(fmt, sclk=_levels(draw, 2, True, False), ranges=(rng("SCLK", "MHz"),))
    return t


@settings(max_examples=150, deadline=None)
@given(tables(), st.sampled_from(["", "\0" * 9, "  "]))
def test_parse_render_round_trip(table, padding):
    text = render_od_table(table).replace("OD_RANGE:", padding + "OD_RANGE:")
    assert od.parse_od_table(text) == table


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300), st.text(alphabet="OD_SCLKMVRANGE:0123456789 -mhzv\n\0[]", max_size=200)
    )
)
def test_garbage_never_raises_anything_but_a_typed_error(blob):
    try:
        od.parse_od_table(blob)
    except od.OdParseError as e:
        assert isinstance(e, TunerError) and e.message


def test_a_curve_point_without_a_voltage_or_clock_is_a_parse_error_not_a_type_error():
    """Found by mypy: a point lacking its mV (or MHz) column reached `+`/`int()` and raised TypeError."""
    pts = (od.Level(0, 800, 711), od.Level(1, 1450, None), od.Level(2, 2100, 1191))
    with pytest.raises(od.OdParseError, match="point 1 has no mV"):
        od.curve_with_offset(pts, -100, {})
    with pytest.raises(od.OdParseError, match="point 2 has no MHz"):
        od.point_mhz(od.Level(2, None, 1191))
    with pytest.raises(od.OdParseError, match="lost its top point"):
        od.offset_of(pts, (od.Level(0, 800, 711), od.Level(2, 2100, None)))
