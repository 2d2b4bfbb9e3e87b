"""The trial count the UI shows ("trial 3 of ≤N") changes only when the plan's bound does (issue 15 item 3): a
passing coarse trial uses up one of the trials already counted; a failure closes the bracket and lowers it."""

from tuner.core.models import Knob, KnobKind
from tuner.tuning.plan import BisectPlan, NextTrial, PlanParams, PlanResult


def _estimates(vmin_mv: int, **params) -> list[tuple[str, int]]:
    """(phase, the count shown) at each trial of a search on a card that fails below `vmin_mv`; `params` go to
    PlanParams.defaults_for (replay_baseline=True unless given)."""
    knob = Knob(kind=KnobKind.VOLTAGE_OFFSET, unit="mV", stock=0, current=0, min=-200, max=0, step=5,
                aggressive_direction=-1)
    plan = BisectPlan(knob, PlanParams.defaults_for(knob, **{"replay_baseline": True, **params}))
    results, out = [], []
    while isinstance(decision := plan.decide(results), NextTrial):
        short, confirms = plan.remaining_estimate(results)
        out.append((decision.phase, len(results) + short + confirms))
        ok = decision.setting >= vmin_mv
        results.append(PlanResult(setting=decision.setting, phase=decision.phase, verdict="pass" if ok else "fail",
                                  kind=None if ok else "mismatch"))
    return out


def test_the_total_holds_while_the_descent_passes_and_drops_at_the_first_failure():
    est = _estimates(-52)
    totals = [total for _phase, total in est]
    descent = [total for phase, total in est if phase in ("baseline", "replay", "coarse")]
    # every trial down to the one that fails (-60 mV) sees the same total: the bound (the range end) never moved
    assert len(descent) == 8 and set(descent) == {24}
    assert totals == sorted(totals, reverse=True)  # it never grows
    assert totals[-1] == len(est) == 10  # and it is exact once the failure closed the bracket


def _run(vmin_mv: int, step: int, resolution: int = 5) -> list[tuple[str, int]]:
    return _estimates(vmin_mv, replay_baseline=False, step=step, resolution=resolution)


def test_the_count_is_an_upper_bound_during_a_long_refine():
    # --step 40: the first failure (-40 mV) leaves 7 resolution steps to bisect, three refine trials; the count
    # said two ("trial 6 of <=6" with a seventh still to come)
    for vmin in (-39, -36, -31, -5, -200):
        est = _run(vmin, 40)
        assert all(total >= len(est) for _phase, total in est), (vmin, est)


def test_the_count_stays_within_the_range_for_a_step_wider_than_the_range():
    # --step 999999999999999995 on a 200 mV range: 40 resolution steps bisect in at most 6 trials, not 60
    est = _run(-52, 999999999999999995)
    assert max(total for _phase, total in est) <= 2 + 1 + 6 + 1, est
    assert all(total >= len(est) for _phase, total in est), est
