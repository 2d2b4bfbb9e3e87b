"""The bisect's repeatability rules with a fake engine (issue 12): the baseline's replay in a second process, the
stock control after a mismatch or canary failure, the --tolerance opt-in and the refusal of a silent downgrade,
and the bounded wait for an engine's result."""

from __future__ import annotations

import pytest

from tests.tuning.fake_engine import FakeEngine
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.tuning import journal
from tuner.tuning.engine_client import WatchdogPolicy
from tuner.tuning.job import BisectJob, BisectParams, control_steps
from tuner.tuning.trial import bounded_result


def make(vmin=-52, **kw):
    backend = SimulatedBackend(vmin_mv=vmin)
    engine = FakeEngine()
    params = BisectParams(trial_s=1, confirm_s=2, **kw)
    return backend, engine, BisectJob(backend, "sim0", params, engine_factory=engine)


def test_a_replay_that_differs_stops_before_any_undervolt(boot):
    backend, engine, job = make()
    engine.replay_fault = lambda req: ("not-repeatable", 141)
    outcome = job.run().card
    assert (outcome.status, outcome.exit_code, outcome.failure.kind) == ("failed", exit_codes.TEST_FAILED,
                                                                          "not-repeatable")
    assert "first differing step 141" in outcome.failure.reason and "--tolerance" in outcome.failure.reason
    assert [(t.setting, t.phase) for t in outcome.trials] == [(0, "baseline"), (0, "replay")]
    assert all(r.options.fault_seed == 0 for r in engine.requests)  # nothing but stock was ever run
    assert backend.knob("sim0").current == 0 and journal.unsafe_settings("sim0") == {}


def test_a_mismatch_gets_a_stock_control_before_it_counts(boot):
    _backend, engine, job = make()
    engine.software_fault = lambda req: ("mismatch", 7, 7) if req.options.fault_seed == -10 else None
    outcome = job.run().card
    assert outcome.status == "recommended", outcome.failure
    phases = [(t.setting, t.phase, t.verdict) for t in outcome.trials]
    assert phases[:4] == [(0, "baseline", "pass"), (0, "replay", "pass"), (-10, "coarse", "fail"),
                          (0, "control", "pass")]
    assert sum(p == "control" for _, p, _ in phases) == 1  # at most one per failing setting
    control = engine.requests[3].options
    assert control.steps == control_steps(outcome.trials[2]) == 7 + 20 and control.reference_loop
    assert control.fault_seed == 0 and control.duration_s is None
    assert outcome.recommendation.first_failure == -10  # the failure counted once the control passed


def test_a_control_that_fails_too_stops_and_blames_no_voltage(boot):
    backend, engine, job = make()
    engine.software_fault = lambda req: ("canary", 30, 10)
    outcome = job.run().card
    assert (outcome.failure.kind, outcome.exit_code) == ("not-repeatable", 1)
    assert [(t.setting, t.phase) for t in outcome.trials][-2:] == [(-10, "coarse"), (0, "control")]
    assert journal.unsafe_settings("sim0") == {} and backend.knob("sim0").current == 0


def test_injected_faults_of_the_simulated_card_need_no_control(boot):
    _backend, _engine, job = make(vmin=-12)
    outcome = job.run().card
    assert outcome.status == "recommended"
    assert not [t for t in outcome.trials if t.phase == "control"]


def test_tolerance_is_passed_on_and_recorded_everywhere(boot):
    _backend, engine, job = make(tolerance=True)
    engine.sensitivity = "reduced"
    outcome = job.run().card
    assert outcome.status == "recommended"
    assert all(r.options.tolerance for r in engine.requests)
    assert outcome.recommendation.sensitivity == "reduced" and outcome.tuning()["sensitivity"] == "reduced"
    assert {t["sensitivity"] for t in outcome.tuning()["trials"]} == {"reduced"}


def test_reduced_sensitivity_without_asking_is_an_error(boot):
    _backend, engine, job = make()
    engine.sensitivity = "reduced"
    outcome = job.run().card
    assert (outcome.status, outcome.failure.kind) == ("failed", "error")
    assert outcome.trials[0].kind == "reduced-sensitivity" and outcome.recommendation is None


class _SlowRun:
    def __init__(self, ends_after_stop: bool):
        self.ends_after_stop, self.stopped, self.timeouts = ends_after_stop, False, []

    def stop(self):
        self.stopped = True

    def result(self, timeout=None):
        self.timeouts.append(timeout)
        if self.stopped and self.ends_after_stop:
            return "result"
        raise TimeoutError("the engine is still running")


@pytest.mark.parametrize("ends_after_stop", [True, False])
def test_the_wait_for_an_engines_result_is_bounded(ends_after_stop):
    run = _SlowRun(ends_after_stop)
    got = bounded_result(run, WatchdogPolicy(kill_grace_s=5))
    assert run.stopped and all(t is not None for t in run.timeouts) and len(run.timeouts) == 2
    assert got == ("result" if ends_after_stop else None)
