"""A complete example of each protocol event, as the engine writes it (every field tuner/engine/events.py declares;
tests/engine/test_events.py checks each against the schema). The fake engines start from these, so a fake is never
kinder to the client than the engine: it cannot leave a field out."""

from __future__ import annotations

from typing import Any

from tuner.engine import events

EXAMPLES: dict[str, dict[str, Any]] = {
    "start": {
        "protocol": events.PROTOCOL_VERSION, "mode": "train", "preset": "tiny", "device": "cpu", "device_type": "cpu",
        "device_name": "FakeEngine", "pci_bus_id": None, "dtype": "fp32", "params": 1, "tokens_per_step": 512,
        "flops_per_step": 1, "batch_size": 8, "seq_len": 64, "model": None, "compile": False, "seed": 0,
        "steps": None, "duration_s": 1.0, "warmup_steps": 5, "canary_every": 100, "canary_every_s": 60.0,
        "gemm_n": 64, "gemm_repeats": 4, "data": None, "repeatable": True, "repeatability": {},
        "first_difference": None, "sensitivity": "full", "tolerance": False, "verify_repeatable": False,
        "deterministic": True, "deterministic_mode": "strict", "kernels": {}, "kernel_env": {},
        "attention_kernels": None,
        "driver_version": None, "threads": 1, "reference": None, "record": None, "fault_rate": 0.0, "fault_seed": 0,
        "injections": [], "visible_devices": {}, "setup_problems": [], "data_parallel": None,
        "torch_version": "fake", "cuda_version": None, "hip_version": None},
    "heartbeat": {"step": 0, "state": "setup", "progress": 0},
    "step": {"step": 1, "loss": 5.0, "grad_norm": 1.0, "dt_ms": 1.0, "tok_s": 1000.0, "tflops": None},
    "gemm": {"step": 1, "ok": True, "dt_ms": 1.0, "tflops": None, "n": 64, "repeats": 4},
    "canary": {"step": 1, "index": 1, "reason": "scheduled", "ok": True, "gemm_ok": True,
               "digest": "0123456789abcdef", "dt_ms": 1.0},
    "warning": {"step": 1, "kind": "loss-spike", "detail": "loss above the rolling median", "setup": False},
    "fault": {"kind": "mismatch", "step": 1, "reference_step": 1, "detail": "loss bits differ",
              "figure": "loss"},
    "phase": {"step": 1, "phase": "partial", "duration_s": 1.0},
    "segment": {"step": 1, "segment": 2, "reference_steps": 1},
    "end": {"verdict": "pass", "reason": "completed", "kind": None, "step": None, "reference_step": None,
            "steps": 1, "duration_s": 1.0, "median_step_ms": 1.0, "median_tok_s": 1000.0, "bpb": 3.5,
            "eval_losses": [], "reference": None, "recorded": None, "sensitivity": "full", "first_difference": None,
            "setup_problems": [], "warnings": 0, "canaries": 0, "exit_code": 0, "figure": None,
            "data_parallel": None},
}


def example(name: str, **fields: Any) -> events.Event:
    """The typed event `name` with `fields` over its example (as a reader gets it from the engine's line)."""
    record = {"event": name, "t": 0.0, **EXAMPLES[name], **fields}
    return events.validate(record)
