"""`apply --verify`: a stress trial at the setting; anything but a pass puts the card back where it was."""

from __future__ import annotations

import pytest

from tests.cli_helpers import run_tuner
from tests.profiles.helpers import save_and_apply, sim, sim_profile
from tuner.actions.verify import verify_setting
from tuner.profiles import save_profile


def fake_trial(calls):
    """Stands in for the bisect's trial runner: applies, fails exactly when the simulated card injects faults at
    this setting, and leaves the card at stock as the real one does."""

    def run(backend, device_id, value, duration_s, workload, on_line, stop_event):
        backend.apply(device_id, value)
        target = backend.stress_target(device_id)
        backend.reset(device_id)
        calls.append((target.fault_rate, duration_s, workload))
        if target.fault_rate > 0:
            on_line("fault: canary mismatch at step 3")
            return "fail", "canary mismatch at step 3"
        return "pass", None

    return run


@pytest.fixture
def stress_calls(monkeypatch):
    calls = []
    monkeypatch.setattr("tuner.actions.verify.bisect_trial", fake_trial(calls))
    return calls


def _other_card_profile(value):
    """A profile proven on sim0, applied to sim1 (same model, another card: what --verify is for)."""
    return sim_profile("from-sim0", value=value)


def test_verify_failing_reverts_to_the_previous_value(capsys, stress_calls):
    sim(vmin_mv=-30).apply("sim0", -10)  # a previous, non-stock value to come back to
    code, out, err = save_and_apply(capsys, sim_profile("deep", value=-60), "--verify", "20s", "--sim-vmin", "-30")
    assert code == 1, err
    assert stress_calls and stress_calls[0][0] > 0 and stress_calls[0][1] == 20.0
    assert "-60 mV failed (canary mismatch at step 3); reverted to -10 mV" in out
    assert sim(vmin_mv=-30).knob("sim0").current == -10


def test_verify_passing_keeps_it_on_another_card(capsys, stress_calls):
    code, out, err = save_and_apply(capsys, _other_card_profile(-25), "--device", "sim1", "--verify", "20s",
                                    "--sim-vmin", "-30")
    assert code == 0, err
    assert "passed and is kept" in out and sim().knob("sim1").current == -25


def test_verify_interrupted_reverts(monkeypatch):
    backend = sim(vmin_mv=-30)

    backend.apply("sim0", -15)

    def interrupted(backend, device_id, value, duration_s, workload, on_line, stop_event):
        backend.apply(device_id, value)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        verify_setting(backend, "sim0", -50, 5.0, run_trial=interrupted)
    assert backend.knob("sim0").current == -15


def test_verify_json(capsys, stress_calls):
    import json

    code, out, _err = save_and_apply(capsys, sim_profile("deep", value=-60), "--verify", "20s", "--sim-vmin", "-30",
                                    "--json")
    doc = json.loads(out)
    assert code == 1 and doc["verify"]["verdict"] == "fail" and doc["verify"]["reverted"] is True
    assert doc["knob"]["current"] == 0


def test_verify_with_the_real_stress_engine_reverts_on_the_failing_simulated_card():
    """End to end: the real CLI, the real trial runner and engine (tiny preset on the CPU)."""
    sim(vmin_mv=-30).apply("sim0", -10)
    save_profile(sim_profile("deep", value=-60))
    proc = run_tuner("--simulate", "--sim-vmin", "-30", "apply", "deep", "--verify", "20s", timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "-60 mV failed" in proc.stdout and "reverted to -10 mV" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert sim(vmin_mv=-30).knob("sim0").current == -10
