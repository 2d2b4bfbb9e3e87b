"""The verdict rules: a pass needs compared steps, a fault is re-run and then run at stock, a hang is never re-run,
and the exit code of several cards is the worst one's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.actions.screen import attribution as at
from tuner.actions.screen.verdict import overall_exit
from tuner.core import exit_codes


def run(outcome, purpose="screen", setting=-50, compared=100, kind=None, step=None):
    return at.RunSummary(purpose, setting, outcome, f"{outcome} reason", kind=kind, compared_steps=compared,
                         step=step)


FAULT = run(at.FAULT, kind="mismatch", step=42, compared=41)


def test_pass_needs_compared_steps():
    assert at.classify("pass", None, compared_steps=0) == at.ERROR
    d = at.decide(run(at.PASS), at_stock=False)
    assert (d.verdict, d.action, d.exit_code) == ("pass", "ok", exit_codes.OK)
    d = at.decide(run(at.ERROR, compared=0), at_stock=False)
    assert (d.verdict, d.action, d.exit_code) == ("retest", "retest", exit_codes.SCREEN_RETEST)


def test_transient_fault_is_a_retest():
    d = at.decide(FAULT, run(at.PASS, "repeat"), at_stock=False)
    assert (d.verdict, d.attribution, d.action) == ("retest", "transient", "retest")
    assert "did not repeat" in d.reason


def test_persistent_at_stock_when_the_card_is_at_stock():
    d = at.decide(FAULT, run(at.FAULT, "repeat", kind="mismatch", step=7), at_stock=True)
    assert (d.verdict, d.attribution, d.action, d.exit_code) == ("fail", "persistent at stock", "drain",
                                                                 exit_codes.TEST_FAILED)
    assert not at.needs_stock(FAULT, run(at.FAULT, "repeat"), at_stock=True)


def test_off_stock_the_stock_run_decides():
    repeat = run(at.FAULT, "repeat", kind="mismatch", step=9)
    assert at.needs_stock(FAULT, repeat, at_stock=False)
    d = at.decide(FAULT, repeat, run(at.PASS, "stock", setting=0), at_stock=False, unit="mV")
    assert (d.attribution, d.action) == ("persistent at this setting", "raise voltage")
    d = at.decide(FAULT, repeat, run(at.FAULT, "stock", setting=0, kind="canary"), at_stock=False)
    assert (d.attribution, d.action) == ("persistent at stock", "drain")
    d = at.decide(FAULT, repeat, run(at.NOT_RUN, "stock", setting=0), at_stock=False)
    assert (d.verdict, d.attribution, d.action) == ("fail", "persistent at this setting", "reset to stock")


def test_a_hang_is_never_re_run():
    hang = run(at.HARD, kind="hang", step=3)
    assert not at.needs_repeat(hang)
    assert at.decide(hang, at_stock=False).action == "reset to stock"
    assert at.decide(hang, at_stock=True).action == "drain"
    assert at.classify("fail", "hang", compared_steps=2) == at.HARD
    assert at.classify("fail", "mismatch", compared_steps=2, edge=True) == at.HARD


def test_incomparable_runs_nothing():
    d = at.decide(run(at.INCOMPARABLE, compared=0), at_stock=True)
    assert (d.verdict, d.exit_code) == ("incomparable", exit_codes.SCREEN_INCOMPARABLE)
    assert at.classify("error", "usage", compared_steps=0, incomparable_keys=("torch_version",)) == at.INCOMPARABLE


OUTCOMES = st.sampled_from([at.PASS, at.FAULT, at.HARD, at.ERROR, at.STOPPED, at.NOT_RUN])


@given(first=OUTCOMES, repeat=st.none() | OUTCOMES, stock=st.none() | OUTCOMES, at_stock=st.booleans())
def test_never_a_pass_without_a_passing_screen_run(first, repeat, stock, at_stock):
    d = at.decide(run(first), None if repeat is None else run(repeat, "repeat"),
                  None if stock is None else run(stock, "stock", setting=0), at_stock=at_stock)
    assert (d.verdict == "pass") == (first == at.PASS)
    if first in (at.FAULT, at.HARD):
        assert d.verdict in ("fail", "retest")
        assert d.verdict == "fail" or (repeat == at.PASS and first == at.FAULT)


@given(st.lists(st.sampled_from(["pass", "fail", "retest", "incomparable"]), min_size=1))
def test_the_worst_card_decides_the_exit_code(verdicts):
    code = overall_exit(verdicts)
    assert (code == 0) == all(v == "pass" for v in verdicts)
    if "fail" in verdicts:
        assert code == exit_codes.TEST_FAILED


def test_no_cards_is_never_a_pass():
    assert overall_exit([]) != 0


@pytest.mark.parametrize("text, name", [("quick", "quick"), ("2", "standard"), ("r3", "long"), ("LONG", "long")])
def test_tiers(text, name):
    tier = at.tier_named(text)
    assert tier.name == name
    assert {"quick": 30, "standard": 120, "long": 900}[name] == tier.load_s


def test_unknown_tier():
    with pytest.raises(ValueError, match="quick"):
        at.tier_named("level4")
