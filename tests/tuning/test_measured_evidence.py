"""Issue 13 on the tuning side: the measured voltage drop (item 5), the active performance state (item 7), the
lock at the baseline's sustained clock (item 8) and refusing a card in a state the tuner did not set (item 10)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.tuning.fake_engine import FakeEngine
from tuner.backends.simulated import SimulatedBackend
from tuner.core.errors import UsageError
from tuner.core.models import Telemetry
from tuner.tuning.events import TrialFinished, TrialWarning
from tuner.tuning.job import BisectJob, BisectParams
from tuner.tuning.sampler import pstate_problem, summarize, voltage_effect


class Card(SimulatedBackend):
    """The simulated card with one real-hardware trait switched on per test."""

    def __init__(self, *, foreign=None, pstate=None, applied=None, flat_voltage=False, **kw):
        super().__init__(**kw)
        self.foreign, self.pstate, self.applied, self.flat_voltage = foreign, pstate, applied, flat_voltage
        self.locks: list[float] = []

    def foreign_state(self, device_id):
        return self.foreign

    def applied_pstates(self, device_id):
        return self.applied

    def lock_at_measured_clock(self, device_id, clock_mhz):
        self.locks.append(clock_mhz)
        return int(clock_mhz)

    def telemetry(self, device_id):
        t = super().telemetry(device_id)
        if self.flat_voltage:  # like GCN with AVFS off: the written offset does not reach the core voltage
            t = replace(t, voltage_mv=1000.0)
        return replace(t, pstate=self.pstate, core_clock_mhz=1900.0)


def _job(backend, events):
    return BisectJob(backend, "sim0", BisectParams(trial_s=1, confirm_s=1), events.append, engine_factory=FakeEngine())


def test_voltage_effect_and_pstate_rules():
    assert voltage_effect(-100, 1100.0, 1049.0) == (51.0, True)
    assert voltage_effect(-100, 1100.0, 1051.0) == (49.0, False)
    assert pstate_problem((0, 2), (0, 2)) is None and "P5" in pstate_problem((5,), (0, 2))
    samples = [(1800, 2), (1900, 2), (2500, 0)]
    s = summarize([Telemetry(time_s=i, core_clock_mhz=c, pstate=p) for i, (c, p) in enumerate(samples)])
    assert (s.median_core_clock_mhz, s.pstates) == (1900, (2, 0))


def test_a_card_carrying_a_setting_the_tuner_did_not_set_is_refused_untouched(boot):
    backend = Card(foreign="sim0 carries a -35 mV voltage offset the tuner did not set", vmin_mv=-52)
    backend.apply("sim0", -35)
    with pytest.raises(UsageError) as e:
        _job(backend, []).run()
    assert "tuner reset" in e.value.remedy and backend.knob("sim0").current == -35


def test_a_trial_whose_active_pstate_had_no_offset_is_an_error(boot):
    events: list = []
    _job(Card(pstate=5, applied=(0, 2), vmin_mv=-52), events).run()
    trials = [e.result for e in events if isinstance(e, TrialFinished)]
    assert trials[0].phase == "baseline" and trials[0].verdict == "pass"
    first = next(t for t in trials if t.phase == "coarse")  # after the baseline and its replay, at stock
    assert first.verdict == "error" and first.kind == "pstate" and "P5" in first.reason
    assert first.pstates == (5,)


def test_the_lock_follows_the_baselines_sustained_clock(boot):
    backend = Card(vmin_mv=-52)
    _job(backend, []).run()
    assert backend.locks and set(backend.locks) == {1900.0}


def test_measured_drop_is_recorded_and_an_ineffective_undervolt_says_so(boot):
    events: list = []
    _job(Card(vmin_mv=-52), events).run()
    trials = [e.result for e in events if isinstance(e, TrialFinished)]
    tried = next(t for t in trials if t.setting == -30)
    assert 15 <= tried.voltage_drop_mv <= 31 and tried.effective is True  # measured, so not exactly 30
    assert "voltage_drop_mv" in tried.profile_trial()
    events.clear()
    _job(Card(flat_voltage=True, vmin_mv=-52), events).run()
    trials = [e.result for e in events if isinstance(e, TrialFinished)]
    flat = next(t for t in trials if t.setting == -30)
    assert flat.effective is False and flat.voltage_drop_mv == 0
    assert any(isinstance(e, TrialWarning) and e.message.startswith("not effective") for e in events)


def test_profile_trials_carry_the_evidence_and_old_trials_still_load():
    from tests.profiles.helpers import sim_profile
    from tuner.profiles import Profile, ProfileError

    trials = [
        {"setting": 0, "phase": "baseline", "verdict": "pass"},  # an older trial: no evidence keys
        {"setting": -50, "phase": "coarse", "verdict": "pass", "voltage_mv": 1012.5, "voltage_drop_mv": 18.0,
         "effective": False, "pstates": [0, 2], "clamped": ["point 1: -44 mV of -50 mV asked"]},
    ]
    profile = sim_profile("evidence", tuning={"lowest_pass": -50, "trials": trials})
    again = Profile.from_toml(profile.to_toml())
    assert again.to_dict() == profile.to_dict()
    assert again.tuning.trials[1].effective is False and again.tuning.trials[1].pstates == (0, 2)
    assert again.tuning.trials[1].clamped == ("point 1: -44 mV of -50 mV asked",)
    with pytest.raises(ProfileError):
        sim_profile("bad", tuning={"trials": [{**trials[1], "pstates": [99]}]})


def test_clamped_curve_points_reach_the_profile_trial():
    from tuner.tuning.events import TrialResult

    r = TrialResult(setting=-100, unit="mV", phase="coarse", verdict="pass",
                    warnings=("clamped: point 0: clock 500->800 MHz (moved into OD_RANGE), -10 mV", "other"))
    assert r.profile_trial()["clamped"] == ["point 0: clock 500->800 MHz (moved into OD_RANGE), -10 mV"]
