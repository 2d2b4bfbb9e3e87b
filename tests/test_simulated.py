import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.backends.simulated import (
    AMD,
    HANG_DEPTH_MV,
    KNOB_MAX_MV,
    KNOB_MIN_MV,
    VMIN_RANGE_MV,
    SimulatedBackend,
    draw_vmin_mv,
    fault_rate_per_step,
)
from tuner.core.errors import OutOfRange, StateError, UnknownDevice, UsageError


class FrozenClock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def make(tmp_path, **kw):
    kw.setdefault("state_path", tmp_path / "sim.json")
    kw.setdefault("clock", FrozenClock())
    return SimulatedBackend(**kw)


def test_vmin_is_deterministic_and_in_range():
    draws = [draw_vmin_mv(seed, i) for seed in range(50) for i in range(4)]
    assert draws == [draw_vmin_mv(seed, i) for seed in range(50) for i in range(4)]
    assert all(VMIN_RANGE_MV[0] <= v <= VMIN_RANGE_MV[1] for v in draws)
    assert len(set(draws)) > 20  # actually spread, not a constant


def test_sim_vmin_overrides_sim0_only(tmp_path):
    b = make(tmp_path, gpus=2, seed=3, vmin_mv=-52)
    assert b.limit("sim0") == -52
    assert b.limit("sim1") == draw_vmin_mv(3, 1)


@given(vmin=st.integers(*VMIN_RANGE_MV), offset=st.integers(KNOB_MIN_MV, KNOB_MAX_MV))
def test_fault_rate_shape(vmin, offset):
    rate = fault_rate_per_step(offset, vmin)
    if offset >= vmin:
        assert rate == 0.0
    else:
        # any offset below the limit faults within 50 steps with probability >= 99 %, and still does when only
        # the 88 % of flips that the engine catches on their own step count (bench/engine_detection.py)
        assert 1 - (1 - rate) ** 50 >= 0.99
        assert 1 - (1 - 0.88 * rate) ** 50 >= 0.99
        assert rate >= fault_rate_per_step(offset + 1, vmin)  # deeper is never safer
    assert (AMD.depth_mv(offset, vmin) >= HANG_DEPTH_MV) == (offset <= vmin - 40)  # stress_target's hang rule


def test_stress_target_carries_the_fault_rate(tmp_path):
    b = make(tmp_path, vmin_mv=-52)
    assert b.stress_target("sim0").fault_rate == 0.0
    b.apply("sim0", -55)
    target = b.stress_target("sim0")
    assert target.fault_rate > 0.08 and not target.hang and target.simulated and target.torch_device == "cpu"
    b.apply("sim0", -95)
    assert b.stress_target("sim0").hang


def test_apply_validates_and_persists_across_instances(tmp_path):
    b = make(tmp_path)
    with pytest.raises(OutOfRange):
        b.apply("sim0", -52)
    with pytest.raises(OutOfRange):
        b.apply("sim0", 10)  # overvolt
    assert b.apply("sim0", -50).current == -50
    assert make(tmp_path).knob("sim0").current == -50
    b.reset("sim0")
    assert make(tmp_path).knob("sim0").current == 0


def test_unknown_device_lists_known_ones(tmp_path):
    with pytest.raises(UnknownDevice) as e:
        make(tmp_path, gpus=2).knob("sim7")
    assert "sim0, sim1" in e.value.remedy


@pytest.mark.parametrize("kw", [{"gpus": 0}, {"gpus": 17}, {"vmin_mv": 0}, {"vmin_mv": -250}])
def test_bad_construction_is_usage_error(tmp_path, kw):
    with pytest.raises(UsageError):
        make(tmp_path, **kw)


def test_corrupt_state_is_reported_and_reset(tmp_path):
    card = tmp_path / "sim.json" / "sim0.json"
    card.parent.mkdir()
    card.write_text("{not json")
    warnings = []
    b = make(tmp_path, warn=warnings.append)
    assert b.knob("sim0").current == 0
    assert warnings and "corrupt" in warnings[0]
    b.apply("sim0", -10)  # written again: a good record
    assert json.loads(card.read_text()) == {"offset_mv": -10}


def test_unreadable_state_is_a_state_error(tmp_path):
    (tmp_path / "sim.json" / "sim0.json").mkdir(parents=True)  # a directory where the card's file should be
    with pytest.raises(StateError, match="not a regular file"):
        make(tmp_path).knob("sim0")


def test_telemetry_is_deterministic_and_responds_to_load_and_offset(tmp_path):
    clock = FrozenClock()
    a = make(tmp_path, clock=clock)
    idle = a.telemetry("sim0")
    assert idle == make(tmp_path / "other", clock=FrozenClock()).telemetry("sim0")
    a.note_load("sim0", True)
    clock.t += 1
    loaded_stock = a.telemetry("sim0")
    assert loaded_stock.power_w > 5 * idle.power_w and loaded_stock.util_pct > 90
    # temperature lags power: one second after load starts it has barely moved
    assert loaded_stock.temp_edge_c < idle.temp_edge_c + 10
    clock.t += 600
    hot = a.telemetry("sim0")
    assert hot.temp_edge_c > loaded_stock.temp_edge_c + 20
    a.apply("sim0", -50)
    clock.t += 1
    undervolted = a.telemetry("sim0")
    assert undervolted.power_w < hot.power_w * 0.95  # ~V^2
    assert undervolted.voltage_mv < hot.voltage_mv - 40
    assert undervolted.energy_j > hot.energy_j > 0
    a.note_load("sim0", False)
    assert a.telemetry("sim0").util_pct < 5


@settings(max_examples=20)
@given(seed=st.integers(0, 10_000))
def test_every_seed_gives_a_consistent_card(tmp_path_factory, seed):
    b = make(tmp_path_factory.mktemp("s"), seed=seed)
    knob = b.knob("sim0")
    assert (knob.min, knob.max, knob.step, knob.stock) == (-200, 0, 5, 0)
    assert b.devices()[0].simulated and "SIMULATED" in b.devices()[0].label


def test_efficiency_is_a_function_of_the_setting_and_load_alone(tmp_path):
    """Issue 24: three identical simulated cards reported +64.6 %, +75.1 % and -9.2 % tok/J, and one result said
    undervolting cost 10 %. The card's own model: at equal work, less power at a lower voltage; the same figure
    for every identical card, every sample and every run; more efficient the lower the setting."""
    def tok_per_j(card: SimulatedBackend, device_id: str, offset_mv: int) -> float:
        card.apply(device_id, offset_mv)
        sample = card.telemetry(device_id)
        return card.work_rate_tok_s(device_id) / sample.power_w

    rig = make(tmp_path, gpus=3)
    figures = {}
    for device_id in ("sim0", "sim1", "sim2"):
        rig.note_load(device_id, True)
        figures[device_id] = [tok_per_j(rig, device_id, mv) for mv in (0, -20, -25, -50, -20)]
    assert figures["sim0"] == figures["sim1"] == figures["sim2"]  # identical cards, identical figures
    stock, at_20, at_25, at_50, again_20 = figures["sim0"]
    assert stock < at_20 < at_25 < at_50 and at_20 == again_20
    assert 1.05 < at_50 / stock < 1.15  # about +9 % at -50 mV: plausible for an undervolt at equal clock
    rig.note_load("sim0", False)
    assert rig.work_rate_tok_s("sim0") == 0.0
