"""Determinism by construction and no silent downgrade (issue 12), in-process on the CPU with the tiny preset.

The simulated platform flaw (faults.PlatformFlaw) is the only source of non-repeatability here: strict
deterministic mode itself is bit-exact on the CPU (every op of train, mixed and gemm modes has a deterministic
implementation), which the first test shows.
"""

from __future__ import annotations

import json

import torch

from tests.engine.conftest import end_of, of, run_engine
from tuner.engine.reference import load_reference


def test_strict_deterministic_mode_and_the_kernel_choices_are_reported():
    code, events, _ = run_engine(steps=3, canary_every=2)
    start = of(events, "start")[0]
    assert code == 0, end_of(events)
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert start["deterministic_mode"] == "strict" and start["kernels"]["deterministic"] == "strict"
    assert start["kernels"]["attention"] == "math" and start["kernels"]["sdpa_backend"] == "math"
    assert start["kernel_env"]["CUBLAS_WORKSPACE_CONFIG"] in (":4096:8", ":16:8")
    assert start["kernel_env"]["PYTORCH_TUNABLEOP_ENABLED"] == "0"
    assert start["repeatability"] == {"gemm": True, "canary": True, "attention": True, "steps": True}
    assert start["repeatable"] is True and start["sensitivity"] == "full" and start["first_difference"] is None


def test_the_fingerprint_holds_kernel_choices_environment_and_driver(reference_30):
    fp = load_reference(reference_30).fingerprint
    assert fp["kernels"]["deterministic"] == "strict" and "kernel_env" in fp and "driver_version" in fp


def test_an_unrepeatable_platform_is_an_error_without_tolerance():
    code, events, _ = run_engine(steps=5, sim_nondeterministic=True)
    end = end_of(events)
    # 4 coin flips at p = 1/2 per half of the check; both halves clean happens 1 time in 16: then the steps
    # themselves must not decide anything (no reference) and the run passes without downgrading.
    if code == 0:
        assert end["sensitivity"] == "full"
        return
    assert (code, end["verdict"], end["kind"]) == (2, "error", "not-repeatable")
    assert "--tolerance" in end["reason"] and "other process" in end["reason"]
    assert end["sensitivity"] == "full"  # never quietly "reduced"


def test_a_start_up_miss_while_comparing_is_a_canary_fault_at_step_0(monkeypatch, reference_30):
    from tuner.engine.runner import Engine

    monkeypatch.setattr(Engine, "_step_check", lambda self: "training step 1 (loss)")
    code, events, _ = run_engine(steps=10, reference=str(reference_30), reference_loop=True)
    end = end_of(events)
    assert (code, end["verdict"], end["kind"], end["step"]) == (1, "fail", "canary", 0)
    assert of(events, "start")[0]["first_difference"] == {"step": 0, "figure": "start-up check: training step 1 "
                                                                               "(loss)"}


def test_tolerance_is_only_used_on_request(monkeypatch, reference_30):
    from tuner.engine.runner import Engine

    monkeypatch.setattr(Engine, "_step_check", lambda self: "training step 2 (state)")
    code, events, _ = run_engine(steps=30, reference=str(reference_30), tolerance=True)
    start, end = of(events, "start")[0], end_of(events)
    assert code == 0 and start["repeatable"] is False and start["sensitivity"] == "reduced"
    assert end["sensitivity"] == "reduced" and end["reference"]["tolerance"] == 0.05


def test_a_replay_records_that_the_reference_repeats(tmp_path, reference_30):
    ref = tmp_path / "ref.json"
    ref.write_bytes(reference_30.read_bytes())
    code, events, _ = run_engine(steps=30, reference=str(ref), verify_repeatable=True)
    assert code == 0, end_of(events)
    doc = json.loads(ref.read_text())
    assert (doc["repeatable"], doc["first_difference"], doc["replayed_steps"]) == (True, None, 30)


def test_a_replay_on_a_flawed_platform_names_the_first_differing_step(tmp_path, reference_30):
    ref = tmp_path / "ref.json"
    ref.write_bytes(reference_30.read_bytes())
    code, events, _ = run_engine(steps=30, reference=str(ref), verify_repeatable=True, sim_nondeterministic=True)
    end = end_of(events)
    assert (code, end["verdict"], end["kind"]) == (1, "fail", "not-repeatable")
    doc = json.loads(ref.read_text())
    assert doc["repeatable"] is False and doc["first_difference"]["step"] == end["step"]
    assert doc["first_difference"]["figure"] in ("loss", "grad_norm", "state") or end["step"] == 0
    assert end["first_difference"] == doc["first_difference"]


def test_contention_in_the_future_does_not_disturb_a_replay(tmp_path, reference_30):
    import time

    ref = tmp_path / "ref.json"
    ref.write_bytes(reference_30.read_bytes())
    code, events, _ = run_engine(steps=30, reference=str(ref), verify_repeatable=True,
                                 sim_contention_at=time.time() + 3600)
    assert code == 0, end_of(events)
    code, events, _ = run_engine(steps=30, reference=str(ref), reference_loop=True,
                                 sim_contention_at=time.time() - 1)
    assert code == 1 and end_of(events)["kind"] in ("mismatch", "canary")


def test_a_device_error_before_the_first_completed_step_is_a_setup_error(monkeypatch):
    from tuner.engine.runner import Engine

    real = Engine.train_step
    calls = {"n": 0}

    def broken(self, step, data_step=None):
        calls["n"] += 1
        if self.state == "train":
            raise RuntimeError("HIP error: hipErrorLaunchFailure")
        return real(self, step, data_step)

    monkeypatch.setattr(Engine, "train_step", broken)
    code, events, _ = run_engine(steps=5)
    end = end_of(events)
    assert (code, end["verdict"], end["kind"]) == (2, "error", "setup")
    assert "before the first completed step" in end["reason"] and not of(events, "fault")


def test_an_attention_kernel_that_fails_is_a_setup_error(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("HIP error: invalid argument")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", broken)
    code, events, _ = run_engine(steps=3)
    end = end_of(events)
    assert (code, end["verdict"], end["kind"]) == (2, "error", "setup")
    assert "attention" in end["reason"] and "[8, 2, 64, 32]" in end["reason"]


def test_an_op_without_a_deterministic_implementation_is_a_setup_error(monkeypatch):
    from tuner.engine.runner import Engine

    def strict(self, step, data_step=None):
        raise RuntimeError("index_add_cuda_ does not have a deterministic implementation, but you set "
                           "'torch.use_deterministic_algorithms(True)'.")

    monkeypatch.setattr(Engine, "_step_check", lambda self: None)
    monkeypatch.setattr(Engine, "train_step", strict)
    code, events, _ = run_engine(steps=3, batch_size=8)
    end = end_of(events)
    assert (code, end["kind"]) == (2, "setup") and "no deterministic implementation" in end["reason"]
