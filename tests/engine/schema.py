"""The engine's JSON-lines protocol as a checkable schema (docs/engine.md is the prose version)."""

from __future__ import annotations

import json
import math

NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_STR = (str, type(None))
OPT_INT = (int, type(None))
FLOATISH = (int, float, str)  # non-finite floats are written as "NaN", "Infinity", "-Infinity"

# event -> {field: allowed types}; every field listed is required.
SCHEMA: dict[str, dict[str, tuple]] = {
    "start": {
        "protocol": (int,), "mode": (str,), "preset": (str,), "device": (str,), "device_type": (str,),
        "device_name": (str,), "pci_bus_id": OPT_STR, "dtype": (str,), "params": (int,), "tokens_per_step": (int,),
        "flops_per_step": (int,), "batch_size": (int,), "seq_len": (int,), "model": (dict, type(None)),
        "seed": (int,), "steps": OPT_INT, "duration_s": OPT_NUM, "warmup_steps": (int,), "canary_every": (int,),
        "canary_every_s": NUM, "gemm_n": (int,), "gemm_repeats": (int,), "data": (dict, type(None)),
        "repeatable": (bool,), "repeatability": (dict,), "sensitivity": (str,), "deterministic": (bool,),
        "threads": (int,), "reference": (dict, type(None)), "record": OPT_STR, "fault_rate": NUM,
        "fault_seed": (int,),
        "injections": (list,), "visible_devices": (dict,), "setup_problems": (list,), "torch_version": (str,),
        "cuda_version": OPT_STR, "hip_version": OPT_STR, "compile": (bool,),
        "data_parallel": (dict, type(None)),
    },
    "step": {"step": (int,), "loss": FLOATISH, "grad_norm": FLOATISH, "dt_ms": NUM, "tok_s": OPT_NUM,
             "tflops": OPT_NUM},
    "gemm": {"step": (int,), "ok": (bool,), "dt_ms": NUM, "tflops": OPT_NUM, "n": (int,), "repeats": (int,)},
    "canary": {"step": (int,), "index": (int,), "reason": (str,), "ok": (bool,), "gemm_ok": (bool,),
               "digest": (str,), "dt_ms": NUM},
    "warning": {"step": (int,), "kind": (str,), "detail": (str,), "setup": (bool,)},
    "fault": {"kind": (str,), "step": OPT_INT, "reference_step": OPT_INT, "detail": (str,), "figure": OPT_STR},
    "heartbeat": {"step": (int,), "state": (str,), "progress": (int,)},
    "phase": {"step": (int,), "phase": (str,), "duration_s": NUM},
    "segment": {"step": (int,), "segment": (int,), "reference_steps": (int,)},
    "end": {"verdict": (str,), "reason": (str,), "kind": OPT_STR, "step": OPT_INT, "steps": (int,),
            "duration_s": NUM, "exit_code": (int,)},
}
END_FULL = {"reference_step": OPT_INT, "median_step_ms": OPT_NUM, "median_tok_s": OPT_NUM, "bpb": OPT_NUM,
            "eval_losses": (list,),
            "reference": (dict, type(None)), "recorded": OPT_STR, "sensitivity": OPT_STR,
            "setup_problems": (list,), "warnings": (int,), "canaries": (int,), "figure": OPT_STR,
            "data_parallel": (dict, type(None))}
VERDICTS = {"pass": 0, "fail": 1, "error": (2, 130)}
FAULT_KINDS = {"mismatch", "canary", "gemm", "nonfinite", "device-error", "not-repeatable"}


def validate(event: dict, *, full_end: bool = True) -> None:
    """Raise AssertionError unless `event` follows the protocol."""
    assert isinstance(event, dict), event
    name = event.get("event")
    assert name in SCHEMA, f"unknown event {name!r}"
    assert isinstance(event.get("t"), NUM) and event["t"] >= 0, event
    fields = dict(SCHEMA[name])
    if name == "end" and full_end and event.get("kind") != "usage":
        fields.update(END_FULL)
    for key, types in fields.items():
        assert key in event, f"{name}: missing {key!r} in {event}"
        value = event[key]
        assert isinstance(value, types) and not (isinstance(value, bool) and bool not in types), \
            f"{name}.{key}: {value!r} is not {types}"
        if isinstance(value, float):
            assert math.isfinite(value), f"{name}.{key} is a raw non-finite float"
    if name == "end":
        code = VERDICTS[event["verdict"]]
        assert event["exit_code"] in (code if isinstance(code, tuple) else (code,)), event
        if event["verdict"] == "fail":
            assert event["kind"] in FAULT_KINDS, event
    if name == "fault":
        assert event["kind"] in FAULT_KINDS, event


def validate_stream(lines: list[str]) -> list[dict]:
    """Every line strict JSON (no NaN literals) and a valid event; exactly one `end`, last; `start` before
    steps. Returns the parsed events."""
    events = []
    for line in lines:
        ev = json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(f"literal {c}")))
        validate(ev)
        events.append(ev)
    names = [e["event"] for e in events]
    assert names.count("end") == 1 and names[-1] == "end", names[-5:]
    if "step" in names or "gemm" in names:
        first_work = min(names.index(n) for n in ("step", "gemm") if n in names)
        assert "start" in names[:first_work]
    ts = [e["t"] for e in events]
    assert ts == sorted(ts), "t must not go backwards"
    return events
