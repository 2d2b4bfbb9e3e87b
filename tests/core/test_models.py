import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.core.errors import OutOfRange
from tuner.core.models import Knob, KnobKind

MV = Knob(KnobKind.VOLTAGE_OFFSET, "mV", stock=0, current=0, min=-200, max=0, step=5, aggressive_direction=-1)
MHZ = Knob(KnobKind.CLOCK_OFFSET, "MHz", stock=0, current=0, min=-300, max=1000, step=15, aggressive_direction=1,
           lock_clock_mhz=2520)


def test_validate_accepts_in_range_on_step():
    assert MV.validate(-50) == -50
    assert MHZ.validate(150) == 150


@pytest.mark.parametrize("value, fragment", [(-205, "outside"), (-52, "step"), (3.0, "whole number"),
                                              (True, "whole number")])
def test_validate_rejects_with_remedy(value, fragment):
    with pytest.raises(OutOfRange) as e:
        MV.validate(value)
    assert fragment in e.value.message


def test_off_step_remedy_names_neighbours():
    with pytest.raises(OutOfRange) as e:
        MV.validate(-52)
    assert e.value.remedy == "use -55 or -50"


def test_overvolt_needs_explicit_permission():
    knob = Knob(KnobKind.VOLTAGE_OFFSET, "mV", 0, 0, -200, 50, 5, -1)
    with pytest.raises(OutOfRange, match="overvolt"):
        knob.validate(25)
    assert knob.validate(25, allow_overvolt=True) == 25
    # a negative clock offset on NVIDIA raises the voltage at a given clock: the same rule applies
    with pytest.raises(OutOfRange, match="overvolt"):
        MHZ.validate(-150)


@given(st.integers(-40, 40))
def test_shifted_moves_in_the_aggressive_direction(steps):
    for knob in (MV, MHZ):
        moved = knob.shifted(knob.stock, steps)
        assert (moved - knob.stock) == steps * knob.step * knob.aggressive_direction
        if steps > 0:
            assert knob.more_aggressive(moved, knob.stock)
            assert not knob.is_overvolt(moved)
        elif steps < 0:
            assert knob.is_overvolt(moved)


def test_simulated_label():
    from tuner.core.models import DeviceInfo

    assert DeviceInfo("sim0", "simulated", "X", simulated=True).label == "X [SIMULATED]"
    assert DeviceInfo("0000:03:00.0", "amd", "RX 9070 XT").label == "RX 9070 XT"


def test_mode_phase_verdict_serialise_as_their_old_strings():
    """The enums replaced plain strings that journals and profiles hold: their written form must not change."""
    import json

    import tomli_w

    from tuner.core.models import Mode, Phase, Verdict

    assert [m.value for m in Mode] == ["train", "gemm", "mixed"]
    assert [p.value for p in Phase] == ["baseline", "replay", "coarse", "refine", "confirm", "control", "manual"]
    assert [v.value for v in Verdict] == ["pass", "fail", "error", "stopped", "inconclusive"]
    doc = {"phase": Phase.CONFIRM, "verdict": Verdict.FAIL, "mode": Mode.GEMM}
    assert json.loads(json.dumps(doc)) == {"phase": "confirm", "verdict": "fail", "mode": "gemm"}
    assert tomli_w.dumps(doc) == 'phase = "confirm"\nverdict = "fail"\nmode = "gemm"\n'
    assert f"{Phase.REFINE} {Verdict.PASS.upper()}" == "refine PASS"
    assert Verdict("pass") is Verdict.PASS and Verdict.PASS == "pass"
