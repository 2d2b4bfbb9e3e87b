"""`apply --verify`: a stress trial at the setting; anything but a pass puts the card back where it was."""

from __future__ import annotations

import pytest

from tests.cli_helpers import run_tuner
from tests.profiles.helpers import save_and_apply, sim, sim_profile
from tuner.actions.verify import verify_setting
from tuner.profiles import save_profile


def fake_trial(calls, records=None):
    """Stands in for the bisect's trial runner: applies, fails exactly when the simulated card injects faults at
    this setting, and leaves the card at stock as the real one does. A stock recording (`workload.record`) writes
    its file, as the engine does on a pass, and is counted in `records`."""

    def run(backend, device_id, value, duration_s, workload, on_line, stop_event):
        if workload.record is not None:
            workload.record.write_text("{}")
            if records is not None:
                records.append((value, duration_s))
            return "pass", None
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
    proc = run_tuner("--simulate", "--sim-vmin", "-30", "apply", "deep", "--verify", "4s", timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "-60 mV failed" in proc.stdout and "reverted to -10 mV" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert sim(vmin_mv=-30).knob("sim0").current == -10


def _bundled(tmp_path, name, **sim_kw):
    """A profile saved with a stock reference beside it, recorded on a simulated card (`sim_kw`: its driver...)."""
    from tests.screen.helpers import bundle
    from tuner.profiles import reference_bundle as rb

    path = save_profile(sim_profile(name, value=-25))
    rb.write_beside(bundle(tmp_path, **sim_kw), path)
    return path


def test_verify_uses_the_bundled_reference_when_it_matches(tmp_path, capsys, monkeypatch):
    calls, records = [], []
    monkeypatch.setattr("tuner.actions.verify.bisect_trial", fake_trial(calls, records))
    _bundled(tmp_path, "carried")
    from tests.profiles.helpers import tuner
    code, out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "--sim-vmin", "-30", "apply", "carried",
                           "--device", "sim1", "--verify", "20s")
    assert code == 0, err
    assert records == []  # nothing recorded: the bundled one is used
    assert calls[0][2].reference is not None and calls[0][2].reference.name.startswith("trajectory-")
    assert "compared with the profile's bundled stock reference" in out + err


def test_verify_records_first_when_the_bundled_reference_does_not_match(tmp_path, capsys, monkeypatch):
    calls, records = [], []
    monkeypatch.setattr("tuner.actions.verify.bisect_trial", fake_trial(calls, records))
    _bundled(tmp_path, "elsewhere", driver="999.1")
    from tests.profiles.helpers import tuner
    code, out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "--sim-vmin", "-30", "apply", "elsewhere",
                           "--device", "sim1",
                           "--verify", "20s", "--json")
    assert code == 0, err
    assert records == [(0, 20.0)]  # at stock, as long as the trial
    assert "recorded on other hardware or software: card.driver_version" in err
    import json
    assert json.loads(out)["verify"]["reference"].startswith("compared with a stock reference recorded on this card")


def test_verify_records_when_the_engine_refuses_the_bundled_reference(tmp_path, monkeypatch):
    from tuner.engine.reference import MISMATCH
    from tuner.profiles import reference_bundle as rb

    path = _bundled(tmp_path, "refused")
    seen = []

    def run(backend, device_id, value, duration_s, workload, on_line, stop_event):
        seen.append(("record" if workload.record else "trial", workload.reference))
        if workload.record is not None:
            workload.record.write_text("{}")
            return "pass", None
        if workload.reference.name.startswith("trajectory-"):
            return "error", f"--reference 'x' {MISMATCH}torch_version: reference '1', this run '2'"
        return "pass", None

    outcome = verify_setting(sim(vmin_mv=-30), "sim1", -25, 5.0, bundled=rb.reference_beside(path), run_trial=run)
    assert [k for k, _ in seen] == ["trial", "record", "trial"]
    assert outcome.passed and "the engine refused the bundled reference" in outcome.reference


def test_a_gemm_verify_has_no_trajectory_to_compare(tmp_path):
    from tuner.actions.verify import Workload

    seen = []

    def run(backend, device_id, value, duration_s, workload, on_line, stop_event):
        seen.append(workload)
        return "pass", None

    outcome = verify_setting(sim(vmin_mv=-30), "sim0", -25, 5.0, workload=Workload(mode="gemm"), run_trial=run)
    assert [w.record for w in seen] == [None] and seen[0].reference is None
    assert outcome.reference.startswith("no stock reference (n/a: a GEMM burn")


def test_a_damaged_bundled_reference_refuses_the_verify_before_the_lock_clock_is_set(tmp_path, stress_calls):
    """`tuner apply --verify` set the profile's lock clock first and read the bundle after: a damaged bundle then
    failed the command with the card's lock changed. The bundle is read first now (one action, both front ends)."""
    from dataclasses import replace

    from tests.actions.fakes import ClockOffsetSim
    from tuner.actions.profile_apply import plan_profile_apply, verify_profile
    from tuner.profiles import build_profile
    from tuner.profiles import reference_bundle as rb

    backend = ClockOffsetSim(gpus=1, state_path=tmp_path / "sim.json")
    other = replace(backend.device("sim0"), serial="SIM-9999-00")
    profile = build_profile("damaged", other, backend.knob("sim0"), 90, kernel="6.14.0-test")
    path = save_profile(replace(profile, setting=replace(profile.setting, lock_clock_mhz=2400)))
    rb.sidecar_path(path).write_bytes(b"not a bundle")
    plan = plan_profile_apply(backend, profile.__class__.from_bytes(path.read_bytes(), source=path), "sim0",
                              verify=True)
    with pytest.raises(rb.BundleProblem, match="not a tuner reference bundle"):
        verify_profile(backend, plan, 5.0, on_line=lambda line: None)
    assert backend.lock_calls == [] and stress_calls == []
    assert backend.knob("sim0").current == 0


def test_a_failed_verify_puts_back_the_lock_clock_the_card_had(stress_calls):
    """`verify_profile` locked the card at the profile's clock before the trial and nothing put the old lock back:
    a failed verify restored the card's previous offset at the profile's lock, a clock nobody confirmed (on NVIDIA
    the lock is what the next write locks to, tuner/backends/nvidia.py `set_lock_clock`)."""
    from dataclasses import replace

    from tuner.actions.profile_apply import plan_profile_apply, verify_profile
    from tuner.backends.simulated import SimulatedBackend
    from tuner.profiles import build_profile

    backend = SimulatedBackend(gpus=1, kind="nvidia", vmin_mv=100)  # faults past +100 MHz
    profile = build_profile("too-far", backend.device("sim0"), backend.knob("sim0"), 150, kernel="6.14.0-test")
    path = save_profile(replace(profile, setting=replace(profile.setting, lock_clock_mhz=2400)))
    backend.set_lock_clock("sim0", 2280)
    backend.apply("sim0", 30)  # the card holds +30 MHz locked at 2280 MHz before the verify
    plan = plan_profile_apply(backend, profile.__class__.from_bytes(path.read_bytes(), source=path), "sim0",
                              verify=True)
    outcome = verify_profile(backend, plan, 5.0, on_line=lambda line: None)
    assert outcome.verdict == "fail" and stress_calls
    knob = backend.knob("sim0")
    assert (knob.current, knob.lock_clock_mhz) == (30, 2280)


def test_a_hang_in_a_verify_is_listed_under_the_serial_of_the_card_it_ran_on(boot, monkeypatch):
    """A verify's hang went on the unsafe list with serial None (a bisect's trial names its card's since 9ee135d),
    so the root helper, importing the user's list, filed it under whatever card is in the slot then
    (service._key_for), not under the card that hung."""
    from tests.tuning.fake_engine import FakeEngine
    from tuner.backends.simulated import SimulatedBackend
    from tuner.tuning import journal, trial

    real_run_trial = trial.run_trial
    monkeypatch.setattr(trial, "run_trial", lambda *a, **kw: real_run_trial(*a, engine_factory=FakeEngine(), **kw))
    backend = SimulatedBackend(vmin_mv=-30)  # hangs at -70 mV (HANG_DEPTH_MV past its limit)
    outcome = verify_setting(backend, "sim0", -70, 2.0)
    assert outcome.verdict == "fail" and backend.knob("sim0").current == 0
    [entry] = journal.own_unsafe_entries("sim0")
    assert (entry["setting"], entry["serial"]) == (-70, backend.device("sim0").serial)


def test_a_verify_that_loses_its_card_still_lists_the_value(boot, monkeypatch):
    """A card lost in a verify's trial may answer nothing afterwards: its stock was read only after the trial, so the
    read raised and the hang never reached the unsafe list (the one value that must never be applied again)."""
    import threading

    from tests.tuning.fake_engine import FakeEngine
    from tuner.actions.verify import Workload, bisect_trial
    from tuner.backends.simulated import SimulatedBackend
    from tuner.core.errors import DeviceLost
    from tuner.tuning import journal, trial

    backend = SimulatedBackend(vmin_mv=-30)  # hangs at -70 mV (HANG_DEPTH_MV past its limit)
    real_run_trial = trial.run_trial

    def then_lost(*a, **kw):
        ran = real_run_trial(*a, engine_factory=FakeEngine(), **kw)

        def no_answer(device_id):
            raise DeviceLost(f"{device_id} fell off the bus", "reboot")

        monkeypatch.setattr(backend, "knob", no_answer)
        return ran

    monkeypatch.setattr(trial, "run_trial", then_lost)
    verdict, _ = bisect_trial(backend, "sim0", -70, 2.0, Workload(), lambda line: None, threading.Event())
    assert verdict == "fail"
    [entry] = journal.own_unsafe_entries("sim0")
    assert (entry["setting"], entry["serial"]) == (-70, backend.device("sim0").serial)
