"""The bisect job with a bound asked for (issue 26): sized trials, the engine's step time carried, the bound stated
on every pass and in the recommendation, and the bad inputs refused before anything is touched. A fake engine
(tests/tuning/fake_engine.py) runs the trials: the behaviour under test is the job's."""

from __future__ import annotations

import pytest

from tests.tuning.fake_engine import FakeEngine
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.core.errors import UsageError
from tuner.tuning import journal
from tuner.tuning.events import Recommendation, TrialFinished
from tuner.tuning.job import BisectJob, BisectParams


def make(vmin=-52, engine=None, **kw):
    backend = SimulatedBackend(vmin_mv=vmin)
    engine = engine or FakeEngine()
    events = []
    params = BisectParams(**{"trial_s": 1, "confirm_s": 600, **kw})
    job = BisectJob(backend, "sim0", params, events.append, engine_factory=engine)
    return backend, engine, events, job


def test_a_trial_carries_the_engines_median_step_time(boot):
    _backend, _engine, _events, job = make()
    outcome = job.run().card
    assert all(t.median_step_ms == 1.0 for t in outcome.trials if t.passed)  # the fake's end event: 1 ms a step
    assert all(r.get("median_step_ms") == 1.0 for r in journal.load("sim0")["trials"] if r["verdict"] == "pass")
