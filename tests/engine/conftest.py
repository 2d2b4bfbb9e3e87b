"""Fixtures for engine tests: run the engine in-process (fast) and record a reference trajectory once."""

from __future__ import annotations

import warnings

import pytest

from tuner.engine.events import validate

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
