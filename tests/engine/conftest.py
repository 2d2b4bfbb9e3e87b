"""Fixtures for engine tests: run the engine in-process (fast) and record a reference trajectory once."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

from tuner.engine.events import ProtocolError, validate

with warnings.catch_warnings():  # this torch build has no numpy; the engine silences the same warning
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch  # noqa: F401


def run_engine(**options):
    """Run the engine in this process with `EngineOptions(**options)`; returns (exit_code, events, engine).

    Every event is validated against the protocol schema on the way."""
    from tuner.engine.options import EngineOptions
    from tuner.engine.protocol import Emitter
    from tuner.engine.runner import Engine

    events: list[dict] = []

    def sink(ev: dict) -> None:
        validate(ev)
        events.append(ev)

    options.setdefault("canary_every_s", 0.0)  # time-based canaries would make event lists timing-dependent
    engine = Engine(EngineOptions(**options), Emitter(sink=sink), log=lambda msg: None)
    code = engine.run()
    return code, events, engine


def of(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["event"] == name]


def end_of(events: list[dict]) -> dict:
    ends = of(events, "end")
    assert len(ends) == 1
    return ends[0]


@pytest.fixture(scope="session")
def reference_30(tmp_path_factory):
    """A 30-step stock reference for the tiny preset, seed 0 (recorded in-process, once)."""
    path = tmp_path_factory.mktemp("ref") / "tiny-seed0.json"
    code, events, _ = run_engine(steps=30, record=str(path))
    assert code == 0, end_of(events)
    return path


def validate_stream(lines: list[str]) -> list[dict[str, Any]]:
    """A whole run's stdout, checked: every line strict JSON (no NaN literals) and a valid event (`validate`);
    exactly one `end`, last; `start` before the first step; `t` never goes backwards. Returns the records."""
    records: list[dict[str, Any]] = []
    for line in lines:
        try:
            record = json.loads(line, parse_constant=_refuse_constant)
        except ValueError as e:
            raise ProtocolError(f"not strict JSON: {e}: {line[:200]!r}") from None
        validate(record)
        records.append(record)
    names = [r["event"] for r in records]
    if names.count("end") != 1 or names[-1] != "end":
        raise ProtocolError(f"exactly one `end`, last: {names[-5:]}")
    work = [i for i, n in enumerate(names) if n in ("step", "gemm")]
    if work and "start" not in names[:work[0]]:
        raise ProtocolError("`start` must come before the first step")
    ts = [r["t"] for r in records]
    if ts != sorted(ts):
        raise ProtocolError("`t` must not go backwards")
    return records


def _refuse_constant(text: str) -> Any:
    raise ValueError(f"literal {text}")
