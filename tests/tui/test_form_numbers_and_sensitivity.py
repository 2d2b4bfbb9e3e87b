"""The bisect form takes numbers as the CLI does (ASCII digits and a sign only), and a result reached with the
weaker comparison says, in the UI too, what it catches (issues 11 and 12)."""

from types import SimpleNamespace

import pytest

from tuner.core.errors import UsageError
from tuner.screens.bisect import FIELDS, recommendation_text
from tuner.tuning.sensitivity import BITWISE_CAUGHT_PCT, TOLERANCE_CAUGHT_PCT

STEP = next(p for p in FIELDS if p.id == "step")


@pytest.mark.parametrize("text", ["-٣٠", "-3_0", "１５", "15.0", ""])
def test_the_form_refuses_what_the_cli_refuses(text):
    with pytest.raises(UsageError):
        STEP.parse(text, "mV", "step")


@pytest.mark.parametrize(("text", "value"), [("-30", -30), ("+15", 15), ("15 MHz", 15)])
def test_the_form_takes_ascii_numbers_with_the_cards_unit(text, value):
    unit = "MHz" if "MHz" in text else "mV"
    assert STEP.parse(text, unit, "step") == value


def _rec(sensitivity):
    return SimpleNamespace(setting=-40, confirmed=-50, first_failure=-55, margin=10, efficiency_gain_pct=None,
                           baseline_tok_per_j=None, tuned_tok_per_j=None, sensitivity=sensitivity)


def test_a_reduced_sensitivity_result_shows_the_measured_detection_rate():
    text = recommendation_text(_rec("reduced"), "mV").plain
    assert f"catches {TOLERANCE_CAUGHT_PCT:g} %" in text and f"{BITWISE_CAUGHT_PCT:g} % bit for bit" in text
    assert "--tolerance" not in text  # words for people, no CLI flags in the UI
    assert "reduced sensitivity" not in recommendation_text(_rec("full"), "mV").plain
