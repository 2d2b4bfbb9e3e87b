"""A complete example of each protocol event, as the engine writes it (every field tests/engine/schema.py
requires). The fake engines start from these, so a fake is never kinder to the client than the engine: it cannot
leave a field out."""

from __future__ import annotations

EXAMPLES: dict[str, dict] = {
    "start": {"protocol": 1, "mode": "train", "preset": "tiny", "device": "cpu", "device_type": "cpu",
              "device_name": "FakeEngine", "pci_bus_id": None, "dtype": "fp32", "params": 1, "tokens_per_step": 512,
              "flops_per_step": 1, "batch_size": 8, "seq_len": 64, "model": None, "seed": 0, "steps": None,
              "duration_s": 1.0, "warmup_steps": 5, "canary_every": 100, "canary_every_s": 60.0, "gemm_n": 64,
              "gemm_repeats": 4, "data": None, "repeatable": True, "repeatability": {}, "sensitivity": "full",
              "deterministic": True, "threads": 1, "reference": None, "record": None, "fault_rate": 0.0,
              "fault_seed": 0, "injections": [], "visible_devices": {}, "setup_problems": [],
              "torch_version": "fake", "cuda_version": None, "hip_version": None, "compile": False,
              "data_parallel": None},
    "heartbeat": {"step": 0, "state": "setup", "progress": 0},
    "step": {"step": 1, "loss": 5.0, "grad_norm": 1.0, "dt_ms": 1.0, "tok_s": 1000.0, "tflops": None},
    "fault": {"kind": "mismatch", "step": 1, "reference_step": 1, "detail": "loss bits differ",
              "figure": "loss"},
    "end": {"verdict": "pass", "reason": "completed", "kind": None, "step": None, "steps": 1, "duration_s": 1.0,
            "exit_code": 0, "reference_step": None, "median_step_ms": 1.0, "median_tok_s": 1000.0, "bpb": 3.5,
            "eval_losses": [], "reference": None, "recorded": None, "sensitivity": "full", "setup_problems": [],
            "warnings": 0, "canaries": 0, "figure": None, "data_parallel": None},
}
