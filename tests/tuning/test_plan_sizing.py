"""Trial sizing and the bound (issue 26), property-based like the plan: screens far from any failure, one --trial
near one, a confirmation of exactly what the bound still needs; a pass never raises the bound's failure probability;
a failure is never overruled by a later pass at a deeper setting."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tuning.test_plan import STEP_S, mhz_knob, mv_knob, setups
from tuner.tuning.bound import steps_for_bound
from tuner.tuning.evidence import MIN_COMPARED_STEPS
from tuner.tuning.plan import (
    BASELINE,
    BOUND,
    COARSE,
    CONFIRM,
    DECIDE,
    MAX_CONFIRM_PASSES,
    MIN_CONFIRM_LOAD_S,
    REFINE,
    SCREEN,
    SCREEN_DIVISOR,
    STOCK_PHASES,
    BisectPlan,
    NextTrial,
    PlanParams,
    PlanResult,
    Recommend,
    Stop,
)


@st.composite
def sized_setups(draw):
    knob, params = draw(setups())
    bound_s = float(draw(st.integers(1, 4 * 3600)))
    trial_s = float(draw(st.integers(1, 3600)))
    return knob, PlanParams(step=params.step, resolution=params.resolution, margin=params.margin,
                            edge_margin=params.edge_margin, floor=params.floor, bound_s=bound_s, trial_s=trial_s)


def run_sized(plan: BisectPlan, oracle, *, max_trials=10_000):
    """Drive a sized plan with `oracle(k, phase, steps) -> steps run, or -fault step for a failure`. Returns
    (final decision, results, [(decision, results before it)])."""
    results: list[PlanResult] = []
    seen = []
    for _ in range(max_trials):
        decision = plan.decide(results)
        if not isinstance(decision, NextTrial):
            return decision, results, seen
        seen.append((decision, list(results)))
        k = plan.k_of(decision.setting)
        asked = decision.steps if decision.steps is not None else 1000
        ran = oracle(k, decision.phase, asked)
        ok = ran > 0
        results.append(PlanResult(decision.setting, decision.phase, "pass" if ok else "fail",
                                  None if ok else "mismatch", None, steps=abs(ran),
                                  step_s=STEP_S if decision.phase == BASELINE else None))
    raise AssertionError("the plan did not terminate")


def trial_steps(params: PlanParams) -> int:
    assert params.trial_s is not None
    return max(MIN_COMPARED_STEPS, round(params.trial_s / STEP_S))


def fail_k_of(plan: BisectPlan, results) -> int | None:
    return min([plan.k_of(r.setting) for r in results if r.verdict == "fail" and r.phase not in STOCK_PHASES]
               + plan.unsafe_k, default=None)


def rate(b) -> float:
    return 1.0 if b is None else b.rate


@settings(max_examples=200, deadline=None)
@given(sized_setups(), st.data())
def test_screens_far_from_failures_deciding_trials_near_them_and_a_confirmation_of_what_the_bound_needs(setup, data):
    knob, params = setup
    plan = BisectPlan(knob, params)
    answers = data.draw(st.lists(st.booleans(), min_size=plan.k_max + 1, max_size=plan.k_max + 1))
    answers[0] = True
    # a failure comes at any step (an early one is believed at once); a pass runs all it was asked for
    fault_at = data.draw(st.integers(1, 10**6))
    decision, _results, seen = run_sized(plan, lambda k, phase, steps: steps if answers[k] else -min(fault_at, steps))
    need = steps_for_bound(params.bound_s, STEP_S)
    least = max(MIN_COMPARED_STEPS, math.ceil(MIN_CONFIRM_LOAD_S / STEP_S))
    t = trial_steps(params)
    screen = max(MIN_COMPARED_STEPS, math.ceil(t / SCREEN_DIVISOR))
    for d, before in seen:
        if d.phase == BASELINE:
            assert d.steps is None and d.purpose is None  # one --trial, the driver's
            continue
        k = plan.k_of(d.setting)
        fail_k = fail_k_of(plan, before)
        assert d.duration_s == round(d.steps * STEP_S, 3)
        if d.phase == CONFIRM:
            assert d.purpose == BOUND and d.bound_s == params.bound_s and d.bound_steps == need
            have = plan.bound_at(d.setting, before)  # the bound at the answer: the value it confirms
            assert d.pooled_steps == (have.steps if have else 0)
            assert d.steps == max(need - d.pooled_steps, least)  # what the bound still needs, and no longer
        elif fail_k is not None and fail_k - k < plan.coarse_k:
            assert (d.purpose, d.steps) == (DECIDE, t)
        else:
            assert (d.purpose, d.steps) == (SCREEN, screen)  # a pass far from the edge is not over-bought
    assert isinstance(decision, Recommend)
    if decision.confirmed is not None:  # a confirmation passed with what it asked: the bound is reached
        assert decision.bound_met and decision.confirmed_bound is not None and decision.confirmed_bound.steps >= need
        last = next(d for d, _ in reversed(seen) if d.phase == CONFIRM)
        if last.steps > least:  # ...and no further than it needs
            assert decision.confirmed_bound.steps == need
        # the recommendation, shallower, pools at least as much
        assert decision.bound is not None and decision.bound.steps >= decision.confirmed_bound.steps
    else:
        assert decision.bound_met is False and decision.confirmed_bound is None


@settings(max_examples=150, deadline=None)
@given(sized_setups(), st.data())
def test_a_pass_never_raises_the_bounds_failure_probability(setup, data):
    knob, params = setup
    plan = BisectPlan(knob, params)
    answers = data.draw(st.lists(st.booleans(), min_size=plan.k_max + 1, max_size=plan.k_max + 1))
    answers[0] = True
    _decision, results, _seen = run_sized(plan, lambda k, phase, steps: steps if answers[k] else -1)
    results = results[:data.draw(st.integers(1, len(results)))]
    k = data.draw(st.integers(0, plan.k_max))
    phase = data.draw(st.sampled_from([COARSE, REFINE, CONFIRM]))
    more = [*results, PlanResult(plan.value(k), phase, "pass", steps=data.draw(st.integers(1, 10**6)))]
    for j in range(plan.k_max + 1):
        assert rate(plan.bound_at(plan.value(j), more)) <= rate(plan.bound_at(plan.value(j), results))


@settings(max_examples=150, deadline=None)
@given(sized_setups(), st.data())
def test_a_failure_is_never_overruled_by_a_later_pass_at_a_deeper_setting(setup, data):
    knob, params = setup
    plan = BisectPlan(knob, params)
    answers = data.draw(st.lists(st.booleans(), min_size=plan.k_max + 1, max_size=plan.k_max + 1))
    answers[0] = True
    _decision, results, _seen = run_sized(plan, lambda k, phase, steps: steps if answers[k] else -1)
    results = results[:data.draw(st.integers(1, len(results)))]
    fail_k = fail_k_of(plan, results)
    if fail_k is None or fail_k > plan.k_max:
        return
    # later passes at or beyond the failure, in any phase, however long
    extra = data.draw(st.lists(st.tuples(st.integers(fail_k, plan.k_max), st.sampled_from([COARSE, REFINE, CONFIRM]),
                                         st.integers(1, 10**7)), min_size=1, max_size=4))
    more = [*results, *(PlanResult(plan.value(k), ph, "pass", steps=n) for k, ph, n in extra)]
    for j in range(fail_k, plan.k_max + 1):
        assert plan.bound_at(plan.value(j), more) is None
    for j in range(fail_k):
        assert plan.bound_at(plan.value(j), more) == plan.bound_at(plan.value(j), results)
    d = plan.decide(more)
    if isinstance(d, NextTrial):
        assert plan.k_of(d.setting) < fail_k
    elif isinstance(d, Recommend):
        assert d.confirmed is None or plan.k_of(d.confirmed) < fail_k
        assert plan.k_of(d.setting) < fail_k


def test_the_documented_example_sized():
    """-52 mV card, --trial 5m, --bound 10m at 85 ms/step: 30 s screens down to the first failure, one 5 min
    trial between the neighbours, then a confirmation of what the bound at -40 mV still needs."""
    knob = mv_knob()
    plan = BisectPlan(knob, PlanParams.defaults_for(knob, bound_s=600.0, trial_s=300.0))
    decision, _results, seen = run_sized(plan, lambda k, phase, steps: steps if plan.value(k) >= -52 else -7)
    assert [(d.setting, d.phase, d.purpose, d.steps) for d, _ in seen] == [
        (0, BASELINE, None, None), (-10, COARSE, SCREEN, 353), (-20, COARSE, SCREEN, 353),
        (-30, COARSE, SCREEN, 353), (-40, COARSE, SCREEN, 353), (-50, COARSE, SCREEN, 353),
        (-60, COARSE, SCREEN, 353), (-55, REFINE, DECIDE, 3529), (-50, CONFIRM, BOUND, 21_145 - 353)]
    assert isinstance(decision, Recommend) and decision.setting == -40 and decision.confirmed == -50
    confirmed, at_rec = decision.confirmed_bound, decision.bound
    assert decision.bound_met and confirmed is not None and confirmed.steps == 21_145
    assert confirmed.text() == "at most one fault per 10m00s of this load (95%; 21,145 steps with no fault)"
    assert at_rec is not None and at_rec.steps == 21_145 + 353  # -40 mV also has its own screen
    assert at_rec.provenance("mV") == "-50 mV coarse 353 + -50 mV confirm 20,792 + -40 mV coarse 353"


def test_a_short_confirmation_is_topped_up_and_never_loops():
    knob = mv_knob()
    plan = BisectPlan(knob, PlanParams.defaults_for(knob, bound_s=600.0, trial_s=300.0))
    head = [PlanResult(0, BASELINE, "pass", steps=3529, step_s=STEP_S), PlanResult(-10, COARSE, "pass", steps=353),
            PlanResult(-20, COARSE, "fail", "mismatch", steps=3), PlanResult(-15, REFINE, "fail", "mismatch", steps=9)]
    first = plan.decide(head)
    assert isinstance(first, NextTrial) and first.phase == CONFIRM and first.setting == -10
    assert first.steps == 21_145 - 353
    short = [*head, PlanResult(-10, CONFIRM, "pass", steps=10_000)]  # ran fewer steps than asked
    again = plan.decide(short)
    assert isinstance(again, NextTrial) and (again.setting, again.phase) == (-10, CONFIRM)
    assert again.steps == 21_145 - 10_353 and again.pooled_steps == 10_353  # the rest, no second minimum
    results = short
    for _ in range(MAX_CONFIRM_PASSES - 1):
        results = [*results, PlanResult(-10, CONFIRM, "pass", steps=100)]
    done = plan.decide(results)
    assert isinstance(done, Recommend) and done.confirmed == -10 and done.bound_met is False  # said, not hidden
    unknown = plan.decide([*head, PlanResult(-10, CONFIRM, "pass")])  # a pass that did not say its steps
    assert isinstance(unknown, Recommend) and unknown.bound_met is False
    failed = plan.decide([*short, PlanResult(-10, CONFIRM, "fail", "mismatch", steps=5)])  # the top-up failed
    assert isinstance(failed, NextTrial) and (failed.setting, failed.phase) == (-5, CONFIRM)  # one step back
    assert failed.pooled_steps == 0 and failed.steps == 21_145  # nothing at -10 counts any more


def test_a_sized_plan_needs_the_baselines_step_time():
    knob = mv_knob()
    plan = BisectPlan(knob, PlanParams.defaults_for(knob, bound_s=600.0, trial_s=300.0))
    stop = plan.decide([PlanResult(0, BASELINE, "pass", steps=3529)])
    assert isinstance(stop, Stop) and stop.kind == "error" and "step time" in stop.reason
    rec = PlanResult.from_record({"setting": 0, "phase": "baseline", "verdict": "pass", "steps": 3600,
                                  "warmup_steps": 20, "duration_s": 330.0, "median_step_ms": 85.0})
    assert rec.steps == 3580 and rec.step_s == 0.085  # compared steps; the median, never duration / steps
    assert PlanResult.from_record({"setting": 0, "phase": "baseline", "verdict": "pass", "steps": 3600,
                                   "duration_s": 330.0}).step_s is None


def test_without_a_bound_nothing_is_sized_and_mhz_knobs_size_alike():
    knob = mv_knob()
    plan = BisectPlan(knob, PlanParams.defaults_for(knob))
    d = plan.decide([PlanResult(0, BASELINE, "pass", steps=3529, step_s=STEP_S)])
    assert d == NextTrial(-10, COARSE) and d.steps is None and d.duration_s is None
    mhz = mhz_knob(max_mhz=300, step=15)
    sized = BisectPlan(mhz, PlanParams.defaults_for(mhz, bound_s=600.0, trial_s=300.0))
    d = sized.decide([PlanResult(0, BASELINE, "pass", steps=3529, step_s=STEP_S)])
    assert isinstance(d, NextTrial) and (d.setting, d.purpose, d.steps) == (30, SCREEN, 353)
