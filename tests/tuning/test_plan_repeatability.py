"""The state machine's repeatability rules (issue 12): the baseline's replay, the stock control after a mismatch
or canary failure, and canary faults at the same reference step as a software fault. Property-based where an
oracle drives it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tuning.test_plan import STEP_S, bound, mv_knob, setups
from tuner.tuning.plan import (
    BASELINE,
    COARSE,
    CONTROL,
    REFINE,
    REPLAY,
    BisectPlan,
    NextTrial,
    PlanParams,
    PlanResult,
    Recommend,
    Stop,
)


def plan_with_rules() -> BisectPlan:
    knob = mv_knob()
    return BisectPlan(knob, PlanParams.defaults_for(knob, replay_baseline=True, stock_control=True))


def test_the_replay_comes_right_after_the_baseline_and_gates_every_undervolt():
    plan = plan_with_rules()
    base = PlanResult(0, BASELINE, "pass")
    assert plan.decide([base]) == NextTrial(0, REPLAY)
    stop = plan.decide([base, PlanResult(0, REPLAY, "fail", "not-repeatable", 141, reason="loss differs")])
    assert isinstance(stop, Stop) and stop.kind == "not-repeatable" and "141" in stop.reason
    assert plan.decide([base, PlanResult(0, REPLAY, "pass")]) == NextTrial(-10, COARSE)
    # a baseline whose own start-up check did not repeat
    stop = plan.decide([PlanResult(0, BASELINE, "error", "not-repeatable", 0)])
    assert isinstance(stop, Stop) and stop.kind == "not-repeatable" and "start-up check" in stop.reason


def test_a_machine_reset_or_hang_at_stock_is_not_called_a_platform_that_does_not_repeat():
    # a reset during the replay or a control (recovered on resume as system-reset) was reported as "this platform
    # does not repeat bit for bit", with --tolerance (reduced sensitivity) among the remedies: nothing differed
    plan = plan_with_rules()
    base = PlanResult(0, BASELINE, "pass")
    mismatch = PlanResult(-10, COARSE, "fail", "mismatch", 12)
    for kind in ("system-reset", "hang"):
        for results in ([base, PlanResult(0, REPLAY, "fail", kind, edge=True)],
                        [base, PlanResult(0, REPLAY, "pass"), mismatch, PlanResult(0, CONTROL, "fail", kind,
                                                                                   edge=True)]):
            stop = plan.decide(results)
            assert isinstance(stop, Stop) and stop.kind == "baseline-failed", stop
            assert kind in stop.reason and "--tolerance" not in stop.reason


def test_a_control_follows_a_mismatch_or_canary_but_not_other_kinds_or_injected_faults():
    plan = plan_with_rules()
    head = [PlanResult(0, BASELINE, "pass"), PlanResult(0, REPLAY, "pass")]
    for kind in ("mismatch", "canary"):
        assert plan.decide([*head, PlanResult(-10, COARSE, "fail", kind, 12)]) == NextTrial(0, CONTROL)
    for kind in ("nonfinite", "hang", "gemm", "device-error"):
        assert plan.decide([*head, PlanResult(-10, COARSE, "fail", kind, 12)]).phase != CONTROL
    injected = PlanResult(-10, COARSE, "fail", "mismatch", None, injected=True)
    assert plan.decide([*head, injected]) == NextTrial(-5, REFINE)


def test_a_passing_control_lets_the_failure_count_and_a_failing_one_stops():
    plan = plan_with_rules()
    head = [PlanResult(0, BASELINE, "pass"), PlanResult(0, REPLAY, "pass"), PlanResult(-10, COARSE, "fail",
                                                                                       "mismatch", 12)]
    assert plan.decide([*head, PlanResult(0, CONTROL, "pass")]) == NextTrial(-5, REFINE)
    stop = plan.decide([*head, PlanResult(0, CONTROL, "fail", "mismatch", 9)])
    assert isinstance(stop, Stop) and stop.kind == "not-repeatable" and "-10 mV" in stop.reason


def test_canary_faults_at_the_same_reference_step_at_two_settings_are_a_software_fault():
    plan = plan_with_rules()
    results = [PlanResult(0, BASELINE, "pass"), PlanResult(0, REPLAY, "pass"),
               PlanResult(-10, COARSE, "fail", "canary", 100), PlanResult(0, CONTROL, "pass"),
               PlanResult(-5, REFINE, "fail", "canary", 100)]
    stop = plan.decide(results)
    assert isinstance(stop, Stop) and stop.kind == "software-fault" and "100" in stop.reason


@settings(max_examples=60, deadline=None)
@given(setups(), st.integers(0, 80))
def test_with_passing_controls_the_recommendation_is_unchanged(setup, limit):
    """A noise-free oracle whose stock controls pass: the same recommendation as without the rules, with one
    replay and at most one control per failing setting on top of the usual trial bound."""
    knob, params = setup
    plain = BisectPlan(knob, params)
    ruled = BisectPlan(knob, replace(params, replay_baseline=True, stock_control=True))
    outcomes = []
    for plan in (plain, ruled):
        results: list[PlanResult] = []
        while True:
            d = plan.decide(results)
            if not isinstance(d, NextTrial):
                break
            k = plan.k_of(d.setting)
            ok = d.phase in (REPLAY, CONTROL) or k <= limit
            results.append(PlanResult(d.setting, d.phase, "pass" if ok else "fail", None if ok else "mismatch",
                                      None if ok else 1000 + k, steps=d.steps or 1000,
                                      step_s=STEP_S if d.phase == BASELINE else None))
        outcomes.append((d, results))
    (d_plain, r_plain), (d_ruled, r_ruled) = outcomes
    assert isinstance(d_plain, Recommend) and d_ruled == d_plain
    controls = [r for r in r_ruled if r.phase == CONTROL]
    fails = {r.setting for r in r_ruled if r.verdict == "fail"}
    assert len(controls) == len(fails) and sum(r.phase == REPLAY for r in r_ruled) == 1
    assert len(r_ruled) <= bound(plain) + 1 + len(fails) + len([r for r in r_plain if r.phase == "confirm"])


def test_start_up_check_misses_at_two_settings_are_not_a_software_fault():
    plan = plan_with_rules()
    results = [PlanResult(0, BASELINE, "pass"), PlanResult(0, REPLAY, "pass"),
               PlanResult(-10, COARSE, "fail", "canary", 0), PlanResult(0, CONTROL, "pass"),
               PlanResult(-5, REFINE, "fail", "canary", 0)]
    assert plan.decide(results) == NextTrial(0, CONTROL)  # the second setting gets its own control
