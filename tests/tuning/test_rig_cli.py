"""`tuner bisect --device all|ID,ID` in process (fake engine, fake rig trial), the `--sim-vmin` list and the
single-card "trial k of <=N"."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_tuner
from tests.tuning.fake_engine import FakeEngine
from tests.tuning.rig_fakes import FakeRigTrial
from tuner import cli
from tuner.backends.simulated import SimulatedBackend
from tuner.tuning import trial

SIM3 = ["--simulate", "--sim-gpus", "3", "--sim-vmin", "-52,-67,-40"]
FAST = ["--trial", "1s", "--confirm", "2s", "--yes"]


@pytest.fixture
def fakes(monkeypatch):
    engine, rig = FakeEngine(), FakeRigTrial()
    monkeypatch.setattr(trial, "default_engine_factory", engine)
    monkeypatch.setattr(trial, "run_trial", rig)
    return engine, rig


def test_json_events_carry_their_card_and_the_rig_recommends_each(boot, fakes, capsys):
    code = cli.main([*SIM3, "bisect", "--device", "all", *FAST, "--json"])
    out = capsys.readouterr().out
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert all(e.get("device") for e in events)
    assert {e["device"] for e in events if e["event"] == "trial_finished"} == {"sim0", "sim1", "sim2"}
    recs = {e["device"]: e["setting"] for e in events if e["event"] == "recommendation"}
    assert recs == {"sim0": -40, "sim1": -55, "sim2": -30}
    rig = [e for e in events if e["event"].startswith("rig_")]
    assert [e["event"] for e in rig] == ["rig_confirm_started", "rig_confirm_finished", "rig_confirm_started",
                                         "rig_confirm_finished", "rig_recommendation", "rig_outcome"]
    assert rig[-1]["settings"] == recs and rig[-1]["exit_code"] == 0 and rig[-1]["status"] == "recommended"


def test_plain_output_has_a_line_per_card_a_table_per_card_and_the_final_settings(boot, fakes, capsys):
    code = cli.main([*SIM3, "bisect", "--device", "sim0,sim2", *FAST])
    captured = capsys.readouterr()
    assert code == 0
    assert any(line.startswith("[sim0] trial 1 of ≤") for line in captured.err.splitlines())
    assert any(line.startswith("[sim2] trial 3: -10 mV coarse PASS") for line in captured.err.splitlines())
    assert "[rig] confirmation attempt 1: sim0 -40 mV, sim2 -30 mV together" in captured.err
    assert "== sim0 " in captured.out and "== sim2 " in captured.out and "== sim1" not in captured.out
    final = captured.out.split("== final settings")[1]
    assert "sim0  -40 mV" in final and "sim2  -30 mV" in final
    attempts = captured.out.split("== rig confirmation")[1].split("== final settings")[0]
    assert "sim0 -40 mV, sim2 -30 mV" in attempts  # each card's setting with its unit, not a bare -40
    assert fakes[1].calls[-1][0] == {"sim0": -40, "sim2": -30}


def test_exit_code_and_report_when_one_card_gets_no_recommendation(boot, fakes, capsys):
    fakes[0].replay_fault = lambda req: ("mismatch", 9) if "sim1." in str(req.options.reference) else None
    code = cli.main([*SIM3, "bisect", "--device", "all", *FAST])
    out = capsys.readouterr().out
    assert code == 1
    assert "no recommendation for sim1" in out and "exit code 1" in out
    final = out.split("== final settings")[1]
    assert "sim1  -" in final and "repeat" in final


def test_a_single_card_says_trial_k_of_at_most_n(boot, fakes, capsys):
    assert cli.main(["--simulate", "--sim-vmin", "-52", "bisect", "--device", "sim0", *FAST]) == 0
    err = capsys.readouterr().err
    assert "trial 1 of ≤" in err and "of ~" not in err


def test_sim_vmin_list_sets_one_limit_per_card_in_order(tmp_path):
    b = SimulatedBackend(gpus=3, vmin_mv=(-52, -67, -40), state_path=tmp_path / "s.json")
    assert [b.limit(d) for d in ("sim0", "sim1", "sim2")] == [-52, -67, -40]
    assert cli.build_parser().parse_args([*SIM3, "list"]).sim_vmin == (-52, -67, -40)
    assert cli.build_parser().parse_args(["--sim-vmin", "-52", "list"]).sim_vmin == -52  # one value: sim0's
    proc = run_tuner(*SIM3, "list", "--json")
    assert proc.returncode == 0 and len(json.loads(proc.stdout)) == 3


@pytest.mark.parametrize("args, fragment", [
    (["--sim-gpus", "2", "--sim-vmin", "-52,-67,-40"], "gives 3 limits but there are 2"),
    (["--sim-gpus", "3", "--sim-vmin", "-52,-500"], "--sim-vmin must be between"),
    (["--sim-gpus", "3", "--sim-vmin", "-52,x"], "expected a whole number"),
    (["--sim-gpus", "3", "--sim-vmin", "-52,,-40"], "separated by commas"),
])
def test_bad_sim_vmin_lists_are_one_line_and_exit_2(args, fragment):
    proc = run_tuner("--simulate", *args, "list")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("device, fragment", [("sim0,sim0", "twice"), ("sim0,sim7", "sim7")])
def test_bad_device_lists_change_nothing(boot, fakes, capsys, device, fragment):
    assert cli.main([*SIM3, "bisect", "--device", device, *FAST]) == 2
    assert fragment in capsys.readouterr().err
    assert fakes[0].requests == []


def test_save_writes_one_rig_profile_with_a_part_per_card(boot, fakes, capsys):
    from tuner.profiles.store import load_profile

    code = cli.main([*SIM3, "bisect", "--device", "all", *FAST, "--save", "rig3"])
    out = capsys.readouterr().out
    assert code == 0 and "saved rig profile 'rig3' (3 cards)" in out
    assert out.rstrip().endswith("next: tuner apply rig3")  # issue 24: a rig profile applies the same way
    profile = load_profile("rig3")
    parts = {p.device.serial: p for p in profile.parts}
    assert {s: p.setting.value for s, p in parts.items()} == {"SIM-0000-00": -40, "SIM-0000-01": -55,
                                                              "SIM-0000-02": -30}
    assert profile.rig.backend == "gloo" and profile.rig.attempts == 1 and profile.rig.confirm_duration_s == 2
    assert all(p.tuning is not None and p.tuning.confirmed is not None for p in profile.parts)


def test_save_name_is_checked_before_anything_runs(boot, fakes, capsys):
    assert cli.main([*SIM3, "bisect", "--device", "all", *FAST, "--save", "bad name!"]) == 2
    assert fakes[0].requests == []


def _tty_printer():
    """The CLI's printer for two cards, as on a terminal."""
    from tuner.commands.bisect import _Printer

    printer = _Printer(SimulatedBackend(gpus=2), ("sim0", "sim1"), False)
    printer.tty = True
    return printer


def test_a_card_that_has_its_own_result_says_so_on_its_tty_line_not_a_stale_100_percent(capsys):
    from tuner.tuning.events import Recommendation, TrialProgress

    printer = _tty_printer()  # the progress block redrawn in place, as on a terminal
    printer(TrialProgress(device="sim0", setting=-35, phase="confirm", elapsed_s=10.0, duration_s=10.0, eta_s=0.0,
                          step=533, eta_total_s=None))
    printer(Recommendation(device="sim0", unit="mV", setting=-25, confirmed=-35, lowest_pass=-35,
                           first_failure=-40, margin=10, edge=False))
    lines = capsys.readouterr().err.split("\033[J")[-1].splitlines()
    assert lines[0] == "sim0: own result -25 mV; waiting for the other cards"


def test_a_trial_past_its_time_says_finishing_on_its_tty_line_not_eta_0s(capsys):
    from tuner.tuning.events import FINISHING, TrialProgress

    printer = _tty_printer()
    printer(TrialProgress(device="sim0", setting=-35, phase="confirm", elapsed_s=12.5, duration_s=10.0, eta_s=0.0,
                          step=533, eta_total_s=None))
    line = capsys.readouterr().err.split("\033[J")[-1].splitlines()[0]
    assert "100%" in line and FINISHING in line and "ETA" not in line, line
    printer(TrialProgress(device="sim0", setting=-35, phase="confirm", elapsed_s=5.0, duration_s=10.0, eta_s=5.0,
                          step=266, eta_total_s=None))
    line = capsys.readouterr().err.split("\033[J")[-1].splitlines()[0]
    assert " 50%" in line and "ETA 5s" in line and FINISHING not in line, line
