"""The bisect job with a bound asked for (issue 26): sized trials, the engine's step time carried, the bound stated
on every pass and in the recommendation, and the bad inputs refused before anything is touched. A fake engine
(tests/tuning/fake_engine.py) runs the trials: the behaviour under test is the job's."""

from __future__ import annotations

import pytest

from tests.tuning.fake_engine import FakeEngine
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.core.errors import DamagedState, UsageError
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


def _sized(**kw):
    # 100 ms a step: a one-minute bound needs 1,797 compared steps with no fault (bound.steps_for_bound)
    return make(engine=FakeEngine(step_ms=100.0), bound_s=60.0, trial_s=10, **kw)


def test_with_a_bound_the_trials_run_the_plans_steps_and_each_pass_states_its_bound(boot):
    from tuner.tuning.plan import MIXED_LOAD_FRACTION

    _backend, engine, events, job = _sized()
    outcome = job.run().card
    rec = outcome.recommendation
    assert (rec.setting, rec.confirmed, rec.first_failure) == (-40, -50, -55)
    opts = [r.options for r in engine.requests]
    warmup = 5  # the fake's start event (tests/engine/examples.py)
    screens = [o for o, t in zip(opts, outcome.trials, strict=True) if t.phase == "coarse" and t.setting > -50]
    assert screens and all(o.steps == 50 + warmup for o in screens)  # trial_s / 10 = 10 steps: the minimum, 50
    confirm = opts[-1]
    assert confirm.mode == "mixed" and confirm.steps is not None and confirm.steps > 1000
    [started] = [e for e in events if type(e).__name__ == "TrialStarted" and e.phase == "confirm"]
    assert started.duration_s == pytest.approx((confirm.steps - warmup) * 0.1 / MIXED_LOAD_FRACTION, rel=0.01)
    finished = [e for e in events if isinstance(e, TrialFinished)]
    passing = [e for e in finished if e.result.passed and e.result.phase not in ("baseline", "replay")]
    assert passing and all(e.bound is not None and e.bound["steps"] > 0 for e in passing)
    assert all(e.bound is None for e in finished if not e.result.passed)
    last = passing[-1]
    assert "at most one fault per" in last.bound_text and "of this load" in last.bound_text
    # the recommendation states the bound asked for, what the confirmed value reached and what -40 mV pools
    assert rec.bound_s == 60.0 and rec.bound_met is True
    assert rec.confirmed_bound["duration_s"] >= 60.0
    assert rec.bound["steps"] >= rec.confirmed_bound["steps"]
    assert {c["phase"] for c in rec.bound["contributions"]} >= {"confirm", "coarse"}
    tuning = outcome.tuning()
    assert tuning["bound_s"] == 60.0 and tuning["bound_met"] is True and tuning["bound"]["steps"] > 0
    assert isinstance(events[-1], Recommendation)


def test_without_a_bound_the_lengths_stay_the_users_and_the_bound_is_still_stated(boot):
    _backend, engine, _events, job = make(confirm_s=2)
    outcome = job.run().card
    assert all(r.options.steps is None for r in engine.requests if not r.options.verify_repeatable)
    rec = outcome.recommendation
    assert rec.bound_s is None and rec.bound_met is None and rec.bound["steps"] > 0


def test_an_unreachable_bound_is_refused_before_anything(boot):
    with pytest.raises(UsageError, match="needs about") as err:
        make(bound_s=3600.0, confirm_s=600)
    assert err.value.exit_code == exit_codes.USAGE and "--confirm" in err.value.one_line()
    assert journal.load("sim0") is None


def test_a_resume_with_another_bound_is_refused_and_changes_nothing(boot):
    _backend, engine, _events, job = _sized()
    engine.on_start = lambda req: job.stop() if req.options.fault_rate == 0 and not req.options.record else None
    assert job.run().card.status == "stopped"
    before = journal.load("sim0")
    with pytest.raises(UsageError, match="started with --bound 1m00s") as err:
        make(engine=FakeEngine(step_ms=100.0), trial_s=10, bound_s=120.0, resume=True)[3].run()
    assert err.value.exit_code == exit_codes.USAGE and "--restart" in err.value.one_line()
    assert journal.load("sim0")["trials"] == before["trials"]
    # resuming without --bound keeps the session's own
    outcome = make(engine=FakeEngine(step_ms=100.0), trial_s=10, resume=True)[3].run().card
    assert outcome.recommendation.bound_s == 60.0 and outcome.recommendation.bound_met


def test_a_resume_with_another_bound_leaves_the_card_and_the_journal_as_they_were(boot):
    # the refusal came when the card's search opened its session, after the job had reset every card to stock: a
    # card set by hand since the stop (`tuner set`) was back at stock after a command that refused to start
    backend, engine, _events, job = _sized()
    engine.on_start = lambda req: job.stop() if req.options.fault_rate == 0 and not req.options.record else None
    assert job.run().card.status == "stopped"
    backend.apply("sim0", -20)
    before = journal.journal_path("sim0").read_bytes()
    with pytest.raises(UsageError, match="started with --bound 1m00s"):
        make(engine=FakeEngine(step_ms=100.0), trial_s=10, bound_s=120.0, resume=True)[3].run()
    assert SimulatedBackend(vmin_mv=-52).knob("sim0").current == -20
    assert journal.journal_path("sim0").read_bytes() == before


def test_an_unsized_session_resumed_with_a_bound_is_refused(boot):
    _backend, engine, _events, job = make()
    engine.on_start = lambda req: job.stop() if req.options.fault_rate == 0 and not req.options.record else None
    assert job.run().card.status == "stopped"
    with pytest.raises(UsageError, match="started without --bound"):
        make(engine=FakeEngine(step_ms=100.0), trial_s=10, bound_s=60.0, resume=True)[3].run()


def test_the_cli_reports_the_bound_reached_and_profile_show_prints_it(capsys, boot, monkeypatch):
    from tests.profiles.helpers import tuner

    engine = FakeEngine(step_ms=100.0)
    real_init = BisectJob.__init__
    monkeypatch.setattr(BisectJob, "__init__", lambda self, *a, **kw: real_init(self, *a, engine_factory=engine,
                                                                                **kw))
    code, out, err = tuner(capsys, "--simulate", "--sim-vmin", "-52", "bisect", "--device", "sim0", "--trial", "10s",
                           "--bound", "1m", "--yes", "--save", "b")
    assert code == exit_codes.OK, err
    assert "bound: at most one fault per" in out and "(asked 1m00s: reached)" in out, out
    assert "bound at most one fault per" in err  # each passing trial's line
    code, out, err = tuner(capsys, "profile", "show", "b")
    assert code == exit_codes.OK, err
    assert "bound" in out and "at most one fault per" in out and "asked 1m00s" in out, out


@pytest.mark.parametrize(("bound", "says"), [("10", "no unit"), ("-5m", "negative"), ("0s", "zero"),
                                             ("2h", "more than --confirm 30m00s allows")])
def test_a_bad_bound_on_the_cli_is_one_line_and_exit_2(capsys, boot, bound, says):
    from tests.profiles.helpers import tuner

    code, _out, err = tuner(capsys, "--simulate", "bisect", "--device", "sim0", f"--bound={bound}", "--yes")
    assert code == exit_codes.USAGE and says in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) <= 2 and journal.load("sim0") is None


def test_a_simulated_cards_efficiency_is_its_work_rate_over_its_power_not_the_cpu_engines(boot):
    # the CPU engine's tok/s swings with the host's load (here: a different figure every trial); the simulated
    # card's work rate (SimulatedBackend.work_rate_tok_s, bench/sim_efficiency.py) is what its tok/J is made of
    rates = iter(range(900, 100_000, 37))

    class Swinging(FakeEngine):
        def __call__(self, request, watchdog):
            self.tok_s = float(next(rates))
            return super().__call__(request, watchdog)

    from tuner.backends.simulated import WORK_RATE_TOK_S

    _backend, _engine, _events, job = make(engine=Swinging(), confirm_s=2)
    rec = job.run().card.recommendation
    assert rec.tuned_tok_per_j == pytest.approx(WORK_RATE_TOK_S / rec.tuned_power_w)
    assert rec.baseline_tok_per_j == pytest.approx(WORK_RATE_TOK_S / rec.baseline_power_w)
    assert rec.efficiency_gain_pct == pytest.approx((rec.baseline_power_w / rec.tuned_power_w - 1) * 100, abs=0.01)


@pytest.mark.parametrize("step_ms", [float("inf"), 1e300])
def test_a_stored_step_time_that_is_not_a_finite_time_is_damage_in_one_line(boot, step_ms):
    # the schema held a trial's median_step_ms only above 0: Infinity sized the resumed trials with an infinite step
    # (OverflowError, a traceback) and 1e300 ms ran a search sized by it; a time is finite (journal_schema's rule)
    backend, _engine, _events, _job = make()
    params = BisectParams(trial_s=10, confirm_s=600, preset="tiny", bound_s=60.0).search()
    j = journal.Journal.create("sim0", params=params, knob=backend.knob("sim0").to_dict(), backend=backend)
    j.finish_trial({"setting": 0, "unit": "mV", "phase": "baseline", "verdict": "pass", "steps": 200,
                    "warmup_steps": 5, "median_step_ms": step_ms})
    j.reference.write_text('{"steps": 1000}')
    j.close(journal.INTERRUPTED)
    _backend, engine, _events, job = make(engine=FakeEngine(step_ms=100.0), trial_s=10, resume=True)
    with pytest.raises(DamagedState, match=r"trial 1: 'median_step_ms'") as e:
        job.run()
    assert e.value.exit_code == exit_codes.USAGE and engine.requests == []

