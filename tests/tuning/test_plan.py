"""The bisect state machine, property-based: any limit, any oracle, both knob directions, with and without trial
sizing (a bound asked for: tests/tuning/test_plan_sizing.py has the sizing's own rules)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.core.errors import UsageError
from tuner.core.models import Knob, KnobKind
from tuner.core.unsafe_rule import blocking_setting
from tuner.tuning.plan import (
    BASELINE,
    COARSE,
    CONFIRM,
    REFINE,
    BisectPlan,
    NextTrial,
    PlanParams,
    PlanResult,
    Recommend,
    Stop,
)


def mv_knob(min_mv=-200, stock=0, step=5) -> Knob:
    return Knob(KnobKind.VOLTAGE_OFFSET, "mV", stock=stock, current=stock, min=min_mv, max=max(0, stock),
                step=step, aggressive_direction=-1)


def mhz_knob(max_mhz=1000, step=15) -> Knob:
    return Knob(KnobKind.CLOCK_OFFSET, "MHz", stock=0, current=0, min=0, max=max_mhz, step=step,
                aggressive_direction=+1, lock_clock_mhz=2500)


@st.composite
def setups(draw):
    if draw(st.booleans()):
        knob = mv_knob(min_mv=-5 * draw(st.integers(4, 60)))
    else:
        step = draw(st.sampled_from([15, 30]))
        knob = mhz_knob(max_mhz=step * draw(st.integers(4, 60)), step=step)
    res = knob.step * draw(st.integers(1, 3))
    step = res * draw(st.integers(1, 4))
    margin = knob.step * draw(st.integers(0, 4))
    edge_margin = margin + knob.step * draw(st.integers(0, 2))
    floor = None
    if draw(st.booleans()):
        span = (knob.max - knob.min) // knob.step
        floor = knob.shifted(knob.stock, draw(st.integers(1, span)))
    bound_s = trial_s = None
    if draw(st.booleans()):  # trials sized by a bound: every rule below holds all the same
        bound_s = float(draw(st.integers(1, 4 * 3600)))
        trial_s = float(draw(st.integers(1, 3600)))
    return knob, PlanParams(step=step, resolution=res, margin=margin, edge_margin=edge_margin, floor=floor,
                            bound_s=bound_s, trial_s=trial_s)


STEP_S = 0.085  # the baseline's median step time when the plan sizes trials (the R9700's small preset)


def run_plan(plan: BisectPlan, oracle, *, kind="mismatch", max_trials=10_000):
    """Drive the plan with `oracle(k, phase) -> bool`; returns (decision, results, proposed k values). A pass runs
    the steps the plan asked for (the baseline: 1,000); a failure stops at its first fault."""
    results: list[PlanResult] = []
    proposed = []
    for _ in range(max_trials):
        decision = plan.decide(results)
        if not isinstance(decision, NextTrial):
            return decision, results, proposed
        k = plan.k_of(decision.setting)
        failed = [plan.k_of(r.setting) for r in results if r.verdict == "fail"] + plan.unsafe_k
        assert all(k < f for f in failed), f"tried {k} beyond a failure {failed}"
        assert 0 <= k <= plan.k_max
        assert decision.setting not in [plan.value(u) for u in plan.unsafe_k]
        assert (decision.phase == BASELINE) == (k == 0 and not results)
        proposed.append((k, decision.phase))
        ok = oracle(k, decision.phase)
        # distinct fault steps per setting: a noise-free hardware oracle never fails at the same step twice
        steps = decision.steps if decision.steps is not None else 1000
        results.append(PlanResult(decision.setting, decision.phase, "pass" if ok else "fail",
                                  None if ok else kind, None if ok else 1000 + k, steps=steps if ok else 1,
                                  step_s=STEP_S if decision.phase == BASELINE else None))
    raise AssertionError("the plan did not terminate")


def bound(plan: BisectPlan) -> int:
    coarse = math.ceil(plan.k_max / plan.coarse_k) if plan.k_max else 0
    refine = math.ceil(math.log2(plan.coarse_k // plan.res_k + 1))
    return 1 + coarse + refine + 1


@settings(max_examples=300, deadline=None)
@given(setups(), st.integers(-1, 400))
def test_noise_free_limit_gives_lowest_pass_plus_margin(setup, limit_k):
    knob, params = setup
    plan = BisectPlan(knob, params)
    decision, _results, proposed = run_plan(plan, lambda k, phase: k <= limit_k)
    if limit_k < 0:  # even stock fails
        assert isinstance(decision, Stop) and decision.kind == "baseline-failed"
        return
    assert isinstance(decision, Recommend)
    lowest = plan.k_max if limit_k >= plan.k_max else limit_k // plan.res_k * plan.res_k
    margin_k = params.margin // knob.step
    assert decision.setting == plan.value(max(0, lowest - margin_k))
    assert decision.confirmed == (None if lowest == 0 else plan.value(lowest))
    assert decision.margin == params.margin and not decision.edge
    assert len(proposed) <= bound(plan)
    assert sum(1 for _, phase in proposed if phase == CONFIRM) <= 1
    # never an overvolt, never past the range
    assert not knob.is_overvolt(decision.setting)
    knob.validate(decision.setting)


@settings(max_examples=300, deadline=None)
@given(setups(), st.data())
def test_any_oracle_never_tests_beyond_a_failure_and_terminates(setup, data):
    knob, params = setup
    plan = BisectPlan(knob, params)
    answers = data.draw(st.lists(st.booleans(), min_size=plan.k_max + 1, max_size=plan.k_max + 1))
    confirm_answers = data.draw(st.lists(st.booleans(), min_size=plan.k_max + 1, max_size=plan.k_max + 1))
    answers[0] = True

    def oracle(k, phase):
        return (confirm_answers if phase == CONFIRM else answers)[k]

    decision, _results, proposed = run_plan(plan, oracle)
    assert isinstance(decision, Recommend)
    confirms = [k for k, phase in proposed if phase == CONFIRM]
    assert len(confirms) == len(set(confirms)), "a value was confirmed twice"
    assert len(proposed) <= bound(plan) + plan.k_max // plan.res_k + 1
    if decision.confirmed is not None:
        c = plan.k_of(decision.confirmed)
        assert (c, CONFIRM) in proposed and confirm_answers[c]
        assert decision.setting == plan.value(max(0, c - params.margin // knob.step))


@settings(max_examples=200, deadline=None)
@given(setups(), st.integers(0, 400), st.lists(st.integers(1, 400), max_size=4), st.booleans())
def test_unsafe_values_are_never_proposed(setup, limit_k, unsafe_k, edge):
    knob, params = setup
    unsafe = [knob.shifted(knob.stock, k) for k in unsafe_k]
    plan = BisectPlan(knob, params, unsafe=unsafe, unsafe_edge=edge and bool(unsafe_k))
    effective = min([limit_k] + [k - 1 for k in plan.unsafe_k])
    decision, _results, proposed = run_plan(plan, lambda k, phase: k <= limit_k)
    assert isinstance(decision, Recommend)
    assert not set(plan.unsafe_k) & {k for k, _ in proposed}
    lowest = plan.k_max if effective >= plan.k_max else (effective // plan.res_k) * plan.res_k
    assert decision.confirmed == (None if lowest == 0 else plan.value(lowest))
    margin = params.edge_margin if (edge and unsafe_k) else params.margin
    assert decision.setting == plan.value(max(0, lowest - margin // knob.step))


@settings(max_examples=200, deadline=None)
@given(setups(), st.integers(0, 400), st.integers(1, 2000))
def test_an_off_grid_unsafe_value_blocks_everything_at_or_beyond_it(setup, limit_k, depth):
    # a hand-edited list, or one written with another step, can hold a value between two grid points; one between
    # stock and the first step was dropped (rounded to stock) and the search went on past it (-3 mV listed, -10
    # tried on a 5 mV card), where `set` and the root helper refuse it (tuner.core.unsafe_rule)
    knob, params = setup
    unsafe = knob.stock + depth * knob.aggressive_direction
    plan = BisectPlan(knob, params, unsafe=[unsafe])
    _decision, _results, proposed = run_plan(plan, lambda k, phase: k <= limit_k)
    tried = [plan.value(k) for k, _ in proposed]
    assert [v for v in tried if blocking_setting(knob, v, [unsafe]) is not None] == []


@settings(max_examples=100, deadline=None)
@given(setups(), st.integers(0, 400))
def test_a_hang_uses_the_edge_margin(setup, limit_k):
    knob, params = setup
    plan = BisectPlan(knob, params)
    decision, results, _proposed = run_plan(plan, lambda k, phase: k <= limit_k, kind="hang")
    assert isinstance(decision, Recommend)
    failed = any(r.verdict == "fail" for r in results)
    assert decision.edge == failed
    assert decision.margin == (params.edge_margin if failed else params.margin)


def test_the_documented_example_minus_52_recommends_minus_40():
    knob = mv_knob()
    plan = BisectPlan(knob, PlanParams.defaults_for(knob))
    decision, _results, proposed = run_plan(plan, lambda k, phase: plan.value(k) >= -52)
    assert [(plan.value(k), p) for k, p in proposed] == [
        (0, BASELINE), (-10, COARSE), (-20, COARSE), (-30, COARSE), (-40, COARSE), (-50, COARSE), (-60, COARSE),
        (-55, REFINE), (-50, CONFIRM)]
    assert decision == Recommend(setting=-40, confirmed=-50, lowest_pass=-50, first_failure=-55, margin=10,
                                 edge=False, bound=decision.bound, confirmed_bound=decision.confirmed_bound)
    # the bound at -40 mV pools the passes at -40 and -50 (1,000 steps each here), nothing from -55 or deeper
    assert decision.bound is not None and decision.bound.steps == 3000 and decision.bound_s is None
    assert decision.confirmed_bound is not None and decision.confirmed_bound.steps == 2000  # -50 mV's own two
    assert decision.bound_met is None  # no bound was asked for
    assert [(c.setting, c.phase) for c in decision.bound.contributions] == [(-50, COARSE), (-50, CONFIRM),
                                                                             (-40, COARSE)]


def test_nvidia_clock_offsets_step_upward():
    knob = mhz_knob(max_mhz=300, step=15)
    plan = BisectPlan(knob, PlanParams.defaults_for(knob))
    decision, _results, proposed = run_plan(plan, lambda k, phase: plan.value(k) <= 100)
    assert [plan.value(k) for k, _ in proposed][:4] == [0, 30, 60, 90]
    assert decision.confirmed == 90 and decision.setting == 60 and decision.first_failure == 105


def test_confirm_failure_steps_back_one_resolution_step():
    knob = mv_knob()
    plan = BisectPlan(knob, PlanParams.defaults_for(knob))
    decision, _results, proposed = run_plan(
        plan, lambda k, phase: plan.value(k) >= (-45 if phase == CONFIRM else -52))
    assert [(plan.value(k), p) for k, p in proposed][-2:] == [(-50, CONFIRM), (-45, CONFIRM)]
    assert decision.confirmed == -45 and decision.setting == -35


def test_same_fault_step_at_two_settings_is_a_software_fault():
    knob = mv_knob()
    plan = BisectPlan(knob, PlanParams.defaults_for(knob))
    results = [PlanResult(0, BASELINE, "pass"), PlanResult(-10, COARSE, "pass"),
               PlanResult(-20, COARSE, "fail", "nonfinite", 284)]
    assert plan.decide(results) == NextTrial(-15, REFINE)
    results.append(PlanResult(-15, REFINE, "fail", "nonfinite", 284))
    decision = plan.decide(results)
    assert isinstance(decision, Stop) and decision.kind == "software-fault" and "284" in decision.reason


def test_the_same_step_rule_keys_on_the_reference_step_and_ignores_injected_faults():
    knob = mv_knob()
    plan = BisectPlan(knob, PlanParams.defaults_for(knob))
    base = {"setting": 0, "phase": BASELINE, "verdict": "pass"}

    def fail(setting, phase, step, ref_step=None, **extra):
        return {"setting": setting, "phase": phase, "verdict": "fail", "kind": "mismatch", "fault_step": step,
                "reference_step": ref_step, **extra}

    looped = [base, fail(-10, COARSE, 1284, 284), fail(-5, REFINE, 284, 284)]
    decision = plan.decide([PlanResult.from_record(r) for r in looped])
    assert isinstance(decision, Stop) and decision.kind == "software-fault" and "step 284" in decision.reason
    other_pass = [base, fail(-10, COARSE, 1284, 284), fail(-5, REFINE, 1284, 84)]
    assert not isinstance(plan.decide([PlanResult.from_record(r) for r in other_pass]), Stop)
    # records from before the loop have no reference step: their step is the reference's
    old = [base, fail(-10, COARSE, 284), fail(-5, REFINE, 1284, 284)]
    assert plan.decide([PlanResult.from_record(r) for r in old]).kind == "software-fault"
    injected = [base, fail(-10, COARSE, 284, 284, injected=True), fail(-5, REFINE, 284, 284, injected=True)]
    assert not isinstance(plan.decide([PlanResult.from_record(r) for r in injected]), Stop)


def test_setup_error_stops_and_baseline_failure_stops():
    knob = mv_knob()
    plan = BisectPlan(knob, PlanParams.defaults_for(knob))
    assert plan.decide([PlanResult(0, BASELINE, "fail", "nonfinite", 3)]).kind == "baseline-failed"
    assert plan.decide([PlanResult(0, BASELINE, "error")]).kind == "error"
    assert plan.decide([PlanResult(0, BASELINE, "pass"), PlanResult(-10, COARSE, "error")]).kind == "error"


def test_floor_limits_the_descent():
    knob = mv_knob()
    plan = BisectPlan(knob, PlanParams.defaults_for(knob, floor=-25))
    decision, _results, proposed = run_plan(plan, lambda k, phase: True)
    assert [plan.value(k) for k, _ in proposed] == [0, -10, -20, -25, -25]
    assert decision.confirmed == -25 and decision.setting == -15


@pytest.mark.parametrize("kwargs", [{"step": 7}, {"resolution": 0}, {"step": 15, "resolution": 10},
                                    {"margin": 3}, {"floor": 10}, {"floor": -500},
                                    {"bound_s": 0.0, "trial_s": 300.0}, {"bound_s": math.nan, "trial_s": 300.0},
                                    {"bound_s": 600.0}, {"bound_s": 600.0, "trial_s": 0.5}])
def test_bad_parameters_are_usage_errors(kwargs):
    knob = mv_knob()
    with pytest.raises(UsageError):
        BisectPlan(knob, PlanParams.defaults_for(knob, **kwargs))
