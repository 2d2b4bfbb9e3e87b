"""What `tuner bisect` says about a trial it recovered on resume (issue 28 item 7): a trial the tool died in is
inconclusive and runs again, and only a hard failure goes on the unsafe list. The words used to say "counted as FAIL
... added to the unsafe list" for both."""

from __future__ import annotations

from dataclasses import replace

from tuner.backends.simulated import SimulatedBackend
from tuner.commands.bisect import _Printer
from tuner.tuning.events import TrialRecovered, TrialResult


def _said(capsys, result: TrialResult) -> str:
    _Printer(SimulatedBackend(gpus=1), ("sim0",), False)(TrialRecovered(result, device="sim0"))
    return capsys.readouterr().err


def test_a_trial_the_tool_died_in_is_inconclusive_and_runs_again(capsys):
    line = _said(capsys, TrialResult(setting=-30, unit="mV", phase="coarse", verdict="inconclusive",
                                     kind="tool-died", reason="the tuner died during this trial"))
    assert "-30 mV coarse counted as INCONCLUSIVE (tool-died)" in line and "it runs again" in line
    assert "FAIL" not in line and "unsafe" not in line


def test_a_trial_open_at_a_reset_is_a_failure_on_the_unsafe_list(capsys):
    line = _said(capsys, TrialResult(setting=-40, unit="mV", phase="coarse", verdict="fail", kind="system-reset",
                                     reason="the machine froze or reset during this trial", edge=True))
    assert "-40 mV coarse counted as FAIL (system-reset)" in line and "added to the unsafe list" in line


def test_a_resumed_tolerance_session_says_its_sensitivity_is_reduced(capsys):
    # `--resume` runs with the session's stored parameters, --tolerance included, but the detection-rate note was
    # printed only when --tolerance was on this command line: a resumed tolerance search said nothing of it
    from tuner.tuning.events import SessionStarted

    params = {"step": 10, "resolution": 5, "margin": 10, "trial_s": 60.0, "confirm_s": 60.0, "tolerance": True}
    _Printer(SimulatedBackend(gpus=1), ("sim0",), False)(
        SessionStarted(session="s1", device="sim0", label="sim", unit="mV", stock=0, resumed=True, params=params))
    err = capsys.readouterr().err
    assert "resuming session s1" in err and "reduced sensitivity (--tolerance)" in err and "%" in err
    full = params | {"tolerance": False}
    _Printer(SimulatedBackend(gpus=1), ("sim0",), False)(
        SessionStarted(session="s2", device="sim0", label="sim", unit="mV", stock=0, resumed=True, params=full))
    assert "reduced sensitivity" not in capsys.readouterr().err


def test_a_tolerance_recommendation_says_its_sensitivity_is_reduced():
    # the JSON event and the saved profile said "reduced"; the report's recommendation (and its bound, "at most one
    # fault per ... of this load") read as if every step had been compared bit for bit
    from tuner.commands.bisect import _recommendation_text
    from tuner.tuning.events import Recommendation

    rec = Recommendation(device="sim0", unit="mV", setting=-10, confirmed=-20, lowest_pass=-20, first_failure=-30,
                         margin=10, edge=False)
    assert "reduced sensitivity" not in _recommendation_text(rec, "sim")
    text = _recommendation_text(replace(rec, sensitivity="reduced"), "sim")
    assert "reduced sensitivity (--tolerance)" in text and "%" in text  # with the measured detection rate
