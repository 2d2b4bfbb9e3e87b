"""What a run with no fault proves (tuner.tuning.bound): the exact one-sided bound, pooling by depth, `--bound`."""

from __future__ import annotations

import doctest
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.core.errors import UsageError
from tuner.tuning import bound as bounds
from tuner.tuning.bound import Bound, Evidence, fault_rate_upper, pooled


def test_docstring_examples():
    result = doctest.testmod(bounds)
    assert result.attempted > 0 and result.failed == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**7))
def test_zero_faults_is_the_exact_clopper_pearson_bound(n):
    p = fault_rate_upper(n)
    assert 0 < p < 1
    assert bounds.binomial_cdf(0, n, p) == pytest.approx(0.05, rel=1e-9)  # (1 - p)^n = 5 %, exactly
    assert p <= 3 / n  # the rule of three never understates it ...
    if n >= 1000:
        assert p >= 2.99 / n  # ... and is what it is for large n


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.data())
def test_k_faults_solve_the_binomial_and_more_faults_bound_higher(n, data):
    k = data.draw(st.integers(1, min(n - 1, 20))) if n > 1 else 0
    p = fault_rate_upper(n, k)
    if k:
        assert bounds.binomial_cdf(k, n, p) == pytest.approx(0.05, rel=1e-6)
        assert p > fault_rate_upper(n, k - 1)


def test_known_values():
    # published one-sided 95 % Clopper-Pearson upper limits
    assert fault_rate_upper(10, 1) == pytest.approx(0.3942, abs=1e-4)
    assert fault_rate_upper(20, 2) == pytest.approx(0.2826, abs=1e-4)
    assert fault_rate_upper(100) == pytest.approx(0.0295, abs=1e-4)
    assert fault_rate_upper(0) == 1.0
    with pytest.raises(ValueError):
        fault_rate_upper(5, 6)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_more_steps_with_no_fault_never_raise_the_bound(n, more):
    assert fault_rate_upper(n + more) <= fault_rate_upper(n)


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-7, 0.999))
def test_steps_for_rate_is_the_fewest_that_reach_it(rate):
    n = bounds.steps_for_rate(rate)
    assert fault_rate_upper(n) <= rate
    assert n == 1 or fault_rate_upper(n - 1) > rate


@settings(max_examples=200, deadline=None)
@given(st.floats(1.0, 7 * 24 * 3600.0), st.floats(0.001, 10.0))
def test_a_bound_needs_about_three_times_its_load_and_the_quote_up_front_is_never_short(bound_s, step_s):
    n = bounds.steps_for_bound(bound_s, step_s)
    reached = Bound(steps=n, step_s=step_s)
    assert reached.reaches(bound_s) and not Bound(steps=n - 1, step_s=step_s).reaches(bound_s * (1 + 1e-9))
    assert not Bound(steps=0, step_s=step_s).reaches(bound_s)
    assert n * step_s <= bounds.load_needed_s(bound_s) + step_s  # the up-front quote covers any step time


def test_the_default_bound_reaches_at_least_todays_30_minute_confirmation():
    """Today's 30 min mixed confirmation holds 30 min x 144/174 of load (tuner.tuning.plan.MIXED_LOAD_FRACTION);
    its zero-fault bound is 8.3 min at any step time. The default asks for 10."""
    from tuner.tuning.plan import MIXED_LOAD_FRACTION

    assert math.isclose(MIXED_LOAD_FRACTION, 144 / 174)
    load_s = 1800.0 * MIXED_LOAD_FRACTION
    for step_s in (0.02, 0.085, 0.3, 1.0):
        today = Bound(steps=int(load_s / step_s), step_s=step_s)
        assert today.duration_s is not None and today.duration_s <= bounds.DEFAULT_BOUND_S
        assert today.duration_s == pytest.approx(8.3 * 60, rel=0.01)


def _ev(depth, steps, passed=True, phase="coarse"):
    return Evidence(depth=depth, setting=-5 * depth, phase=phase, passed=passed, steps=steps)


def test_pooling_counts_deeper_passes_up_to_the_first_failure_and_says_where_they_came_from():
    evidence = [_ev(2, 100), _ev(4, 300), _ev(4, 50, phase="confirm"), _ev(6, 7, passed=False), _ev(8, 10_000),
                _ev(1, 40)]
    b = pooled(evidence, 2, fail_depth=6, step_s=0.1)
    assert b is not None and b.steps == 450  # 2 and 4 count; 1 is shallower; 6 failed; 8 is beyond the failure
    assert [(c.setting, c.phase, c.steps) for c in b.contributions] == [(-20, "coarse", 300), (-20, "confirm", 50),
                                                                         (-10, "coarse", 100)]
    assert pooled(evidence, 6, fail_depth=6, step_s=0.1) is None and pooled(evidence, 7, 6, 0.1) is None
    assert b.provenance("mV") == "-20 mV coarse 300 + -20 mV confirm 50 + -10 mV coarse 100"
    assert pooled(evidence, 0, None, None).steps == 10_490  # no failure: everything that passed counts


def test_bound_text_and_record():
    b = Bound(steps=21_145, step_s=0.085, contributions=(bounds.Contribution(-50, "confirm", 21_145),))
    assert b.text() == "at most one fault per 10m00s of this load (95%; 21,145 steps with no fault)"
    d = b.to_dict()
    assert d["steps"] == 21_145 and d["duration_s"] == pytest.approx(600, abs=1) and d["hours"] == 0.167
    assert d["contributions"] == [{"setting": -50, "phase": "confirm", "steps": 21_145}]
    unknown = Bound(steps=3000)
    assert unknown.duration_s is None and "duration_s" not in unknown.to_dict()
    assert unknown.text() == "at most one fault per 1,002 steps (95%; 3,000 steps with no fault)"


@st.composite
def evidence_lists(draw):
    return [Evidence(depth=(d := draw(st.integers(0, 12))), setting=-5 * d, phase=draw(st.sampled_from(["coarse",
                     "refine", "confirm"])), passed=draw(st.booleans()), steps=draw(st.integers(0, 5000) | st.none()))
            for _ in range(draw(st.integers(0, 12)))]


def _rate(b: Bound | None) -> float:
    return 1.0 if b is None else b.rate


@settings(max_examples=100, deadline=None)
@given(evidence_lists(), st.integers(0, 12), st.integers(1, 5000), st.integers(1, 13) | st.none())
def test_a_pass_never_raises_the_failure_probability_anywhere(evidence, new_depth, steps, fail_depth):
    more = [*evidence, Evidence(new_depth, -5 * new_depth, "coarse", True, steps)]
    for depth in range(14):
        assert _rate(pooled(more, depth, fail_depth, 0.1)) <= _rate(pooled(evidence, depth, fail_depth, 0.1))


@settings(max_examples=100, deadline=None)
@given(evidence_lists(), st.integers(1, 12), st.lists(st.tuples(st.integers(0, 8), st.integers(1, 10**6)),
                                                       max_size=5))
def test_passes_beyond_a_failure_never_overrule_it(evidence, fail_depth, deeper):
    more = [*evidence, *(Evidence(fail_depth + d, -5 * (fail_depth + d), "coarse", True, n) for d, n in deeper)]
    for depth in range(fail_depth, fail_depth + 9):
        assert pooled(more, depth, fail_depth, 0.1) is None
    for depth in range(fail_depth):
        assert pooled(more, depth, fail_depth, 0.1) == pooled(evidence, depth, fail_depth, 0.1)


@pytest.mark.parametrize("text,seconds", [("2h", 7200.0), ("10m", 600.0), ("90s", 90.0), (" 1h30m ", 5400.0)])
def test_bound_parses_durations_with_units(text, seconds):
    assert bounds.parse_bound_s(text) == seconds


@pytest.mark.parametrize("text,says", [("2", "no unit"), ("600", "no unit"), ("-2h", "negative"), ("-10", "negative"),
                                       ("0h", "zero"), ("0m0s", "zero"), ("0.0h", "zero"), ("2x", "not a duration"),
                                       ("", "not a duration"), ("8d", "not a duration"), ("200h", "out of range")])
def test_bad_bounds_are_one_line_usage_errors(text, says):
    with pytest.raises(UsageError) as e:
        bounds.parse_bound_s(text)
    line = e.value.one_line()
    assert says in line and "\n" not in line and "--bound" in line and e.value.exit_code == 2
    assert e.value.remedy and "--bound 10m" in e.value.remedy


def test_a_bound_that_cannot_be_reached_in_the_time_allowed_says_how_long_it_would_take():
    with pytest.raises(UsageError) as e:
        bounds.check_reachable(2 * 3600.0, 3600.0, "--confirm 1h")
    msg = e.value.one_line()
    assert "--bound 2h00m needs about 5h60m" not in msg  # formatted properly
    assert "needs about 5h59m" in msg and "--confirm 1h" in msg and "allow at least 5h59m" in msg
    bounds.check_reachable(600.0, 1800.0, "--confirm 30m")  # 10 min needs 30 min of load: fits
    with pytest.raises(UsageError):  # ...but not in a mixed confirmation, idle gaps included
        bounds.check_reachable(600.0, 1800.0, "--confirm 30m", load_fraction=144 / 174)
    assert math.isclose(bounds.load_needed_s(600.0), 1797.4, abs_tol=0.1)


def test_an_unreachable_bound_never_suggests_a_bound_no_command_line_takes():
    # `--bound 1s --confirm 1s`: the remedy read "or ask for a bound under 0s", and --bound refuses anything under 1s
    with pytest.raises(UsageError) as e:
        bounds.check_reachable(1.0, 1.0, "--confirm 1s")
    msg = e.value.one_line()
    assert "allow at least 3s" in msg and "under 0s" not in msg
