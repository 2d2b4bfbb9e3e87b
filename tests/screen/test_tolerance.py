"""The tolerance mode's paired comparison of held-out losses: an equivalence test with a t interval."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.actions.screen.tolerance import paired, t975


def test_same_losses_pass_shifted_fail_noisy_retest():
    ref = [1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4]
    assert paired(ref, ref).verdict == "pass"
    assert paired(ref, [x + 0.1 for x in ref]).verdict == "fail"
    noisy = [x + (0.05 if i % 2 else -0.05) for i, x in enumerate(ref)]
    assert paired(ref, noisy).verdict == "retest"


def test_interval_is_t_based():
    c = paired([0.0, 0.0, 0.0, 0.0], [0.01, -0.01, 0.01, -0.01])
    half = (c.high_nats - c.low_nats) / 2
    assert half == pytest.approx(3.182 * 0.011547 / 2, rel=1e-3)


def test_non_finite_losses_fail():
    assert paired([1.0, 2.0], [math.nan, 2.0]).verdict == "fail"


def test_windows_must_pair():
    with pytest.raises(ValueError):
        paired([1.0, 2.0], [1.0])


@given(st.integers(1, 5000))
def test_t_quantile_falls_to_the_normal(df):
    assert 1.959 < t975(df) <= 12.706
    if df > 1:
        assert t975(df) <= t975(df - 1)
