"""The NVIDIA-style simulated card (`--sim-kind nvidia`): a positive clock offset in MHz with a 15 MHz step at a
locked max clock, and the same hidden-limit fault model as the AMD-style card, in MHz."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.backends.simulated import (
    NVIDIA,
    SimulatedBackend,
    draw_limit,
    fault_rate_at_depth,
    fault_rate_per_step,
)
from tuner.core.errors import OutOfRange, UsageError
from tuner.core.models import KnobKind


class FrozenClock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def nv(tmp_path, **kw):
    kw.setdefault("state_path", tmp_path / "nv.json")
    kw.setdefault("clock", FrozenClock())
    return SimulatedBackend(kind="nvidia", **kw)


def test_the_knob_is_a_positive_clock_offset_in_15_mhz_steps_at_a_locked_clock(tmp_path):
    b = nv(tmp_path)
    knob = b.knob("sim0")
    assert (knob.kind, knob.unit, knob.stock, knob.step, knob.aggressive_direction) == (
        KnobKind.CLOCK_OFFSET, "MHz", 0, 15, 1)
    assert knob.min < 0 < knob.max and knob.lock_clock_mhz == 2505
    assert knob.more_aggressive(30, 15) and knob.is_overvolt(-15)
    device = b.device("sim0")
    assert device.simulated and "[SIMULATED]" in device.label and "NVIDIA" in device.label
    with pytest.raises(OutOfRange, match="15 MHz step"):
        b.apply("sim0", 40)
    with pytest.raises(OutOfRange, match="overvolt"):
        b.apply("sim0", -30)
    assert b.apply("sim0", -30, allow_overvolt=True).current == -30
    assert b.reset("sim0").current == 0


def test_the_amd_curve_is_the_same_function_of_depth():
    assert fault_rate_per_step(-55, -52) == fault_rate_at_depth(3) == 0.21


def test_limits_are_drawn_in_mhz_and_sim_vmin_sets_sim0_in_mhz(tmp_path):
    draws = [draw_limit(NVIDIA, seed, i) for seed in range(40) for i in range(3)]
    assert all(60 <= d <= 240 for d in draws) and len(set(draws)) > 20
    b = nv(tmp_path, gpus=2, seed=5, vmin_mv=150)
    assert (b.limit("sim0"), b.limit("sim1")) == (150, draw_limit(NVIDIA, 5, 1))
    for bad in (600, 0, -50, 1000):
        with pytest.raises(UsageError, match="MHz"):
            nv(tmp_path, vmin_mv=bad)


@given(limit=st.integers(60, 240), steps=st.integers(-20, 40))
def test_the_same_fault_model_past_the_limit_in_mhz(tmp_path_factory, limit, steps):
    b = nv(tmp_path_factory.mktemp("nv"), vmin_mv=limit)
    setting = steps * 15
    b.apply("sim0", setting, allow_overvolt=True)
    target = b.stress_target("sim0")
    assert target.simulated and target.torch_device == "cpu"
    if setting <= limit:
        assert target.fault_rate == 0.0 and not target.hang
    else:
        assert 1 - (1 - 0.88 * target.fault_rate) ** 50 >= 0.99  # a fault within 50 steps, near certain
        # 3 MHz of offset weigh as 1 mV: the AMD card's curve, scaled
        assert target.fault_rate == fault_rate_at_depth((setting - limit) / 3) > 0
    assert target.hang == (setting >= limit + 120)


def test_lock_clock_is_validated_and_held_by_this_process_only(tmp_path):
    """As tuner.backends.nvidia: the lock is what the next apply locks to, kept in the process."""
    b = nv(tmp_path)
    b.set_lock_clock("sim0", 2400)
    assert b.apply("sim0", 30).lock_clock_mhz == 2400 and b.reset("sim0").lock_clock_mhz == 2400
    assert nv(tmp_path).knob("sim0").lock_clock_mhz == 2505  # a new process starts at the stock max boost
    for bad in (100, 3000, True):
        with pytest.raises(UsageError, match="--lock-mhz"):
            b.set_lock_clock("sim0", bad)
    assert b.knob("sim0").lock_clock_mhz == 2400  # a refused lock changes nothing
    amd = SimulatedBackend(state_path=tmp_path / "amd.json")
    assert amd.knob("sim0").lock_clock_mhz is None
    with pytest.raises(UsageError, match="only to NVIDIA"):
        amd.set_lock_clock("sim0", 2400)


def test_the_bisect_hooks_of_the_nvml_backend(tmp_path):
    b = nv(tmp_path)
    assert b.lock_at_measured_clock("sim0", 2291.7) == 2280 and b.knob("sim0").lock_clock_mhz == 2280
    assert b.lock_at_measured_clock("sim0", 50.0) == 210
    assert b.applied_pstates("sim0") == (0, 2) and b.foreign_state("sim0") is None
    b.note_load("sim0", True)
    assert b.telemetry("sim0").pstate == 2
    amd = SimulatedBackend(state_path=tmp_path / "amd.json")
    assert amd.lock_at_measured_clock("sim0", 2000.0) is None and amd.applied_pstates("sim0") is None
    assert amd.telemetry("sim0").pstate is None


def test_telemetry_follows_the_offset_and_the_lock(tmp_path):
    b = nv(tmp_path)
    b.note_load("sim0", True)
    stock = b.telemetry("sim0")
    b.set_lock_clock("sim0", 2205)
    locked_stock = b.telemetry("sim0")
    b.apply("sim0", 150)
    tuned = b.telemetry("sim0")
    assert tuned.core_clock_mhz == locked_stock.core_clock_mhz == 2205 and tuned.power_w < locked_stock.power_w
    assert stock.voltage_mv is tuned.voltage_mv is None and not b.capabilities("sim0").can_read_voltage


def test_under_a_training_load_it_is_power_limited_below_its_table_top(tmp_path):
    """As real cards are (issue 23): at stock it sustains a clock below the 2505 MHz top, held by the power cap,
    so a profile's lock (the baseline's sustained clock) is below the top and a dropped lock can be told from a
    kept one; an undervolt lets the same cap hold a higher clock."""
    b = nv(tmp_path)
    b.note_load("sim0", True)
    stock = b.telemetry("sim0")
    assert 2100 < stock.core_clock_mhz < 2505 and stock.throttle_reasons == ("power cap",)
    assert stock.power_w <= 300.0
    b.apply("sim0", 150)
    assert b.telemetry("sim0").core_clock_mhz > stock.core_clock_mhz
    assert b.lock_at_measured_clock("sim0", stock.core_clock_mhz) < 2505
    b.note_load("sim0", False)
    assert b.telemetry("sim0").core_clock_mhz < 1000  # idle


def test_the_two_kinds_keep_separate_cards(tmp_path):
    nv_card = SimulatedBackend(kind="nvidia")
    amd_card = SimulatedBackend()
    nv_card.apply("sim0", 45)
    assert amd_card.knob("sim0").current == 0 and SimulatedBackend(kind="nvidia").knob("sim0").current == 45
    assert nv_card.state_path != amd_card.state_path


def test_an_unknown_kind_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="--sim-kind"):
        SimulatedBackend(kind="intel", state_path=tmp_path / "x.json")


def test_at_its_lock_a_higher_offset_is_the_same_work_for_less_power(tmp_path):
    b = nv(tmp_path)
    b.note_load("sim0", True)
    b.lock_at_measured_clock("sim0", b.telemetry("sim0").core_clock_mhz)  # what a bisect's baseline does
    figures = []
    for offset in (0, 60, 150):
        b.apply("sim0", offset)
        figures.append((b.work_rate_tok_s("sim0"), b.telemetry("sim0").power_w))
    assert figures[0][0] == figures[1][0] == figures[2][0] > 0  # locked: the same clock, the same work
    assert figures[0][1] > figures[1][1] > figures[2][1]
