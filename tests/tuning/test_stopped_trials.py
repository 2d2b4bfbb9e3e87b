"""Issue 28.1 and 28.5 at the job: a trial whose engine was stopped from outside, or whose card was changed by
someone else during it, is inconclusive (never a pass, never on the unsafe list). A stopped engine's trial runs
again; a change from outside stops the bisect, resumable, with exit code BUSY (docs/bisect.md, "Stopped processes"
and "Changed outside this bisect"). The engine is the fake (tests/tuning/fake_engine.py); the real engine and the
CLI: tests/tuning/test_stopped_processes_cli.py."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from tests.tuning.fake_engine import FakeEngine, result
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.tuning import journal
from tuner.tuning.job import BisectJob, BisectParams


def _job(engine: FakeEngine, **kw) -> tuple[SimulatedBackend, list, BisectJob]:
    backend = SimulatedBackend(vmin_mv=-52)
    events: list = []
    params = BisectParams(**{"trial_s": 1, "confirm_s": 2, **kw})
    return backend, events, BisectJob(backend, "sim0", params, events.append, engine_factory=engine)


def _trials(setting: int) -> list[dict]:
    return [t for t in journal.load("sim0")["trials"] if t["setting"] == setting]


@pytest.mark.parametrize("engine_said", ["pass", "hang"])
def test_an_engine_stopped_from_outside_is_inconclusive_and_runs_again(boot, engine_said):
    first = []

    def stopped_once(request):
        if request.options.fault_seed != -20 or first:
            return None
        first.append(1)
        said = (result("pass", None, "", steps=60) if engine_said == "pass" else
                result("fail", "hang", "hang after step 3: no output for 15.0 s", failure_step=4, steps=3))
        return replace(said, engine_stopped_s=15.0)

    _backend, _events, job = _job(FakeEngine(override=stopped_once))
    outcome = job.run()
    runs = _trials(-20)
    assert [(t["verdict"], t["kind"]) for t in runs] == [("inconclusive", "engine-stopped"), ("pass", None)], runs
    assert "stopped from outside for 15 s" in runs[0]["reason"]
    assert outcome.card.recommendation.setting == -40 and journal.unsafe_settings("sim0") == {}


def test_a_fault_the_stopped_engine_found_itself_still_counts(boot):
    def mismatch(request):
        if request.options.fault_seed == -20:
            return replace(result("fail", "mismatch", "loss bits differ", failure_step=5, steps=5),
                           engine_stopped_s=15.0)
        return None

    _backend, _events, job = _job(FakeEngine(override=mismatch))
    job.run()
    first = _trials(-20)[0]
    assert (first["verdict"], first["kind"]) == ("fail", "mismatch")


def test_a_setting_changed_outside_the_bisect_is_inconclusive_and_stops_it(boot):
    """`tuner reset --force` from another shell (or another tool) during the trial at -30 mV: the card reads
    stock for the rest of it. Before issue 28 the trial passed."""

    def reset_elsewhere(request):
        if request.options.fault_seed == -30:
            SimulatedBackend()._write_setting("sim0", 0)  # another process writes the card

    backend, events, job = _job(FakeEngine(on_start=reset_elsewhere))
    outcome = job.run()
    assert (outcome.status, outcome.exit_code) == ("stopped", exit_codes.BUSY)
    [changed] = _trials(-30)
    assert (changed["verdict"], changed["kind"]) == ("inconclusive", "changed-outside")
    assert changed["reason"] == "the card read +0 mV during the trial, set -30 mV: changed outside this bisect"
    stopped = [ev for ev in events if ev.event == "bisect_stopped"]
    assert stopped and "changed outside this bisect" in stopped[0].reason
    assert backend.knob("sim0").current == 0 and journal.unsafe_settings("sim0") == {}
    # whatever changed it is gone: the bisect continues where it stopped and runs that trial again
    _backend, _events, job = _job(FakeEngine(), resume=True)
    assert job.run().card.recommendation.setting == -40
    assert [t["verdict"] for t in _trials(-30)] == ["inconclusive", "pass"]


def test_in_a_rig_a_stopped_engine_is_inconclusive_for_its_own_card_only(boot):
    """A rig is a rig of cards: the same trial stack, each card's search alike (issue 28: "in a rig, a 15 s stop
    pins a hang on a healthy card")."""
    from tests.tuning.test_rig import make

    lock, stopped = threading.Lock(), []

    def stopped_once(request):
        with lock:
            if request.options.fault_seed != -20 or stopped:
                return None
            stopped.append(1)
        return replace(result("fail", "hang", "no output for 15.0 s", failure_step=4, steps=3), engine_stopped_s=15.0)

    _backend, _engine, _rig, _events, job = make(limits=[-52, -52], engine=FakeEngine(override=stopped_once))
    outcome = job.run()
    assert {d: o.recommendation.setting for d, o in outcome.per_card.items()} == {"sim0": -40, "sim1": -40}
    kinds = {d: [t["kind"] for t in journal.load(d)["trials"] if t["setting"] == -20] for d in ("sim0", "sim1")}
    assert sorted(kinds.values(), key=len) == [[None], ["engine-stopped", None]], kinds
    assert journal.unsafe_settings("sim0") == {} and journal.unsafe_settings("sim1") == {}
