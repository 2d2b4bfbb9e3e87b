"""`tuner profile show` fits the terminal: a long reason is cut in the table and given in full, wrapped, below."""

from tuner.commands.profile import trials_table
from tuner.tuning.events import TrialResult

LONG = ("loss diverged from the stock reference at step 412: 2.718281 vs 2.718282 (relative difference 3.7e-7, "
        "bit-exact comparison), the canary agreed, the GEMM check agreed, no kernel message")


def test_trials_table_fits_80_columns_and_keeps_the_full_reason():
    trials = [TrialResult(setting=0, unit="mV", phase="baseline", verdict="pass", duration_s=300, tok_s=9000,
                          power_w=250.0, max_temp_c=70),
              TrialResult(setting=-40, unit="mV", phase="coarse", verdict="fail", kind="mismatch", reason=LONG,
                          duration_s=300, tok_s=9010, power_w=231.5, max_temp_c=68)]
    lines = trials_table(trials, "mV", 80)
    assert all(len(line) <= 80 for line in lines), lines
    assert "REASON" in lines[0] and "…" in lines[2]
    assert " ".join(line.strip() for line in lines[3:]).startswith("-40 mV: loss diverged")
    assert "no kernel message" in lines[-1]
    assert len(trials_table(trials, "mV", 400)) == 3  # wide enough: nothing cut, no notes


def test_trials_table_cuts_a_wide_reason_by_terminal_columns():
    """The reason was cut by len(): a reason in CJK (two columns a character) drew its row past the 80th column.
    (The full reason below the table is wrapped by textwrap, by characters: not checked here.)"""
    from tuner.commands._output import display_width

    trials = [TrialResult(setting=-40, unit="mV", phase="coarse", verdict="fail", kind="mismatch",
                          reason="损失与库存参考值不一致" * 8, duration_s=300, tok_s=9010, power_w=231.5,
                          max_temp_c=68)]
    table = trials_table(trials, "mV", 80)[:2]  # the header and the trial's row
    assert all(display_width(line) <= 80 for line in table), [display_width(line) for line in table]
    assert table[1].endswith("…")


def test_the_full_reason_below_the_table_is_wrapped_by_terminal_columns():
    """The full reason below the table was wrapped by textwrap, by characters: a CJK reason (two columns a
    character) gave lines of up to 150 columns at 80."""
    from tuner.commands._output import display_width

    reason = "损失与库存参考值不一致" * 8 + " then 第412步 mismatch"
    trials = [TrialResult(setting=-40, unit="mV", phase="coarse", verdict="fail", kind="mismatch", reason=reason,
                          duration_s=300, tok_s=9010, power_w=231.5, max_temp_c=68)]
    lines = trials_table(trials, "mV", 80)
    assert all(display_width(line) <= 80 for line in lines), [display_width(line) for line in lines]
    assert "".join(line.strip() for line in lines[2:]).replace(" ", "") == f"-40mV:{reason}".replace(" ", "")


def test_profile_show_wraps_a_wide_card_name_by_terminal_columns(capsys, monkeypatch):
    """The fields above the table (`device`, `evidence`, ...) were wrapped by textwrap, by characters: a card name
    in CJK (an imported profile's, two columns a character) drew its line past the 80th column."""
    import dataclasses

    from tests.profiles.helpers import sim_profile, tuner
    from tuner.commands._output import display_width
    from tuner.profiles import save_profile

    profile = sim_profile("wide")
    save_profile(dataclasses.replace(profile, device=dataclasses.replace(profile.device, name="显卡型号" * 12)))
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = tuner(capsys, "profile", "show", "wide")
    assert code == 0, err
    assert all(display_width(line) <= 80 for line in out.splitlines()), [display_width(x) for x in out.splitlines()]
    assert "".join(line.strip() for line in out.splitlines()).count("显卡型号") == 12
