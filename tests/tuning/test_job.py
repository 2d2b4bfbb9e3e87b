"""The driver with a fake engine: order of operations, journal, unsafe list, recovery, stop, outcomes."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from tests.tuning.fake_engine import FakeEngine
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.core.errors import DamagedState, DiskFull, UsageError
from tuner.tuning import journal
from tuner.tuning.events import BisectFailed, Recommendation, TrialFinished, TrialRecovered
from tuner.tuning.job import BisectJob, BisectParams


def make(vmin=-52, **kw):
    backend = SimulatedBackend(vmin_mv=vmin)
    engine = FakeEngine()
    events = []
    params = BisectParams(trial_s=1, confirm_s=2, **kw)
    job = BisectJob(backend, "sim0", params, events.append, engine_factory=engine)
    return backend, engine, events, job


def test_recommends_lowest_pass_plus_margin_and_records_everything(boot):
    backend, engine, events, job = make()
    outcome = job.run().card
    assert outcome.exit_code == exit_codes.OK
    rec = outcome.recommendation
    assert (rec.setting, rec.confirmed, rec.first_failure) == (-40, -50, -55)
    assert [t.setting for t in outcome.trials] == [0, 0, -10, -20, -30, -40, -50, -60, -55, -50]
    assert [t.phase for t in outcome.trials[:2]] == ["baseline", "replay"]
    # the baseline records the reference in one trial, a second process replays all of it at stock, bit for bit;
    # the others compare against it, looping it, uncapped
    base, replay, *rest = (r.options for r in engine.requests)
    assert base.record and base.duration_s == 1 and base.reference is None
    assert not base.reference_loop and base.steps is None
    assert replay.reference == base.record and replay.steps == 60 and replay.duration_s is None
    assert replay.verify_repeatable and not replay.reference_loop
    assert all(r.reference == base.record and r.reference_loop and r.steps is None for r in rest)
    assert rest[-1].mode == "mixed" and rest[-1].duration_s == 2
    # injected faults are drawn per setting (stable), the data and weights stay on the session's seed
    assert [(r.options.seed, r.options.fault_seed) for r in engine.requests] == [(0, t.setting)
                                                                                for t in outcome.trials]
    assert backend.knob("sim0").current == 0
    doc = journal.load("sim0")
    assert doc["state"] == journal.FINISHED and doc["open_trial"] is None and len(doc["trials"]) == 10
    assert sum(isinstance(e, TrialFinished) for e in events) == 10
    assert isinstance(events[-1], Recommendation) and events[-1].to_json()["event"] == "recommendation"
    assert outcome.tuning()["trials"][0]["phase"] == "baseline"
    assert journal.unsafe_settings("sim0") == {}


def test_hang_far_below_the_limit_lands_in_the_unsafe_list_with_edge_margin(boot):
    # vmin -30: a -10 mV coarse step of 40 jumps straight to -70 (at or below vmin - 40: the card hangs)
    _backend, _engine, _events, job = make(vmin=-30, step=70, resolution=5)
    outcome = job.run().card
    hang = [t for t in outcome.trials if t.kind == "hang"]
    assert hang and hang[0].setting == -70 and hang[0].edge
    assert -70 in journal.unsafe_settings("sim0")
    assert outcome.recommendation.margin == 15 and outcome.recommendation.edge


def test_a_hard_failure_in_a_trial_is_listed_under_the_serial_of_the_card_it_ran_on(boot):
    # a trial's own hard failure went on the list with serial None (only a recovered one named its card), so the
    # root helper, importing the user's list, filed it under whatever card is in the slot then (service._key_for),
    # not under the card that hung
    backend, _engine, _events, job = make(vmin=-30, step=70, resolution=5)
    job.run()
    [entry] = journal.own_unsafe_entries("sim0")
    assert (entry["setting"], entry["serial"]) == (-70, backend.device("sim0").serial)


@pytest.mark.parametrize("listed", [0, 10])
def test_stock_on_the_unsafe_list_stops_the_search_in_one_line(boot, listed):
    # a hand-edited list (or a verify at stock that the machine reset under) blocks stock itself, and with an
    # overvolt every setting (tuner.core.unsafe_rule): the plan still proposed the baseline at stock and the
    # job's own guard raised AssertionError, a traceback
    path = journal.unsafe_path("sim0")
    path.parent.mkdir(parents=True)
    path.write_text(f'{{"setting": {listed}, "kind": "hang", "edge": true}}\n')
    _backend, engine, events, job = make()
    outcome = job.run().card
    assert outcome.exit_code == exit_codes.TEST_FAILED and outcome.recommendation is None
    [failure] = [e for e in events if isinstance(e, BisectFailed)]
    assert f"{listed:+d} mV" in failure.reason and "tuner unsafe clear" in failure.reason
    assert engine.requests == []  # nothing ran, not even at stock


def test_unfinished_session_needs_resume_or_restart(boot):
    backend, engine, _events, job = make()
    engine.on_start = lambda req: job.stop() if req.options.fault_rate == 0 and not req.options.record else None
    outcome = job.run().card
    assert outcome.status == "stopped" and outcome.exit_code == exit_codes.INTERRUPTED
    assert backend.knob("sim0").current == 0
    assert journal.load("sim0")["state"] == journal.INTERRUPTED
    with pytest.raises(UsageError, match="unfinished bisect session") as err:
        make()[3].run()
    assert "--resume" in err.value.one_line()
    backend, engine, _events, job = make(resume=True)
    outcome = job.run().card
    assert outcome.recommendation.setting == -40
    # the stopped trial was not counted: baseline + 9 - 1 trials before, all once
    assert [t.setting for t in outcome.trials].count(-10) == 1


def _session_in_its_coarse_trial(backend) -> journal.Journal:
    """A session of sim0 whose baseline passed, left inside its -30 mV coarse trial (its open trial written)."""
    j = journal.Journal.create("sim0", params=BisectParams(trial_s=1, confirm_s=2, preset="tiny").search(),
                               knob=backend.knob("sim0").to_dict(), backend=backend)
    j.finish_trial({"setting": 0, "unit": "mV", "phase": "baseline", "verdict": "pass", "tok_s": 1000.0,
                    "power_w": 300.0, "tok_per_j": 3.3})
    j.reference.write_text('{"steps": 1000}')
    j.begin_trial("coarse", setting=-30)
    return j


def test_open_trial_of_a_dead_tool_is_inconclusive_and_runs_again_on_resume(boot):
    # issue 11 defect 7: a kill -9 of the tuner (or a full disk) in this boot says nothing about the voltage
    backend, engine, events, job = make()
    j = _session_in_its_coarse_trial(backend)
    j.doc["open_trial"]["pid"] = 2**22 + 4321  # dead
    j._save()
    backend, engine, events, job = make(resume=True)
    outcome = job.run().card
    recovered = [e for e in events if isinstance(e, TrialRecovered)]
    assert recovered and recovered[0].result.kind == "tool-died" and not recovered[0].result.edge
    assert recovered[0].result.verdict == "inconclusive"
    assert journal.unsafe_settings("sim0") == {}
    assert -30 in [r.options.fault_seed for r in engine.requests]  # run again
    # the same recommendation as an uninterrupted run
    assert outcome.recommendation.confirmed == -50 and outcome.recommendation.setting == -40
    assert not outcome.recommendation.edge


def _left_open_by_an_earlier_boot(backend, boot) -> None:
    """A session whose coarse trial at -40 was open when the machine reset: the next process runs in another boot."""
    j = journal.Journal.create("sim0", params=BisectParams(trial_s=1, confirm_s=2, preset="tiny").search(),
                               knob=backend.knob("sim0").to_dict(), backend=backend)
    j.finish_trial({"setting": 0, "unit": "mV", "phase": "baseline", "verdict": "pass"})
    j.reference.write_text('{"steps": 1000}')
    j.begin_trial("coarse", setting=-40)
    boot("boot-b")


def test_open_trial_from_a_previous_boot_is_a_hard_failure_with_edge_margin(boot):
    backend, engine, _events, job = make()
    _left_open_by_an_earlier_boot(backend, boot)
    backend, engine, _events, job = make(resume=True)
    outcome = job.run().card
    assert journal.unsafe_settings("sim0")[-40]["kind"] == "system-reset"
    assert -40 not in [r.options.fault_seed for r in engine.requests]  # seed 0: the fault seed is the setting
    assert outcome.recommendation.confirmed == -35 and outcome.recommendation.margin == 15
    assert outcome.recommendation.setting == -20
    # a brand-new session keeps the unsafe value out, too
    backend, engine, _events, job = make(restart=True)
    outcome = job.run().card
    assert all(t.setting > -40 for t in outcome.trials)


def test_a_reset_trial_stays_open_until_its_value_is_on_the_unsafe_list(boot, monkeypatch):
    # the journal closed the trial that reset the machine before the unsafe list had its value: a full disk (or a
    # kill) between the two lost the value for good, and a --restart applied it again
    backend, _engine, _events, _job = make()
    _left_open_by_an_earlier_boot(backend, boot)
    append = journal.append_durable

    def full_for_the_unsafe_list(path, line):
        if path == journal.unsafe_path("sim0"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return append(path, line)

    monkeypatch.setattr(journal, "append_durable", full_for_the_unsafe_list)
    with pytest.raises(DiskFull):
        make(resume=True)[3].run()
    monkeypatch.setattr(journal, "append_durable", append)
    _backend, _engine, _events, job = make(restart=True)
    outcome = job.run().card
    assert journal.unsafe_settings("sim0")[-40]["kind"] == "system-reset"
    assert all(t.setting > -40 for t in outcome.trials)


def _a_trial_at_40_open_when_the_machine_reset(boot) -> SimulatedBackend:
    """A bisect session of sim0 whose coarse trial at -40 was open when the machine reset (now boot-b); the card
    it ran on."""
    crashed = SimulatedBackend(vmin_mv=-52)
    j = journal.Journal.create("sim0", params=BisectParams(trial_s=1, confirm_s=2, preset="tiny").search(),
                               knob=crashed.knob("sim0").to_dict(), serial=crashed.device("sim0").serial,
                               backend=crashed)
    j.begin_trial("coarse", setting=-40)
    boot("boot-b")
    return crashed


def test_a_reset_trial_recovered_after_the_card_was_swapped_is_recorded_under_the_card_it_ran_on(boot):
    # the card that was in the slot when the machine reset was swapped for another of its model; --restart recovered
    # the open trial with the serial of the card now in the slot, so the root helper (which files a user's unsafe
    # line under the card of its serial: helper/service.py _key_for) put the refusal on the new card's list and the
    # card that crashed kept none
    crashed = _a_trial_at_40_open_when_the_machine_reset(boot)
    swapped = SimulatedBackend(vmin_mv=-52, seed=1)  # the same model, another serial, in slot sim0
    assert swapped.device("sim0").serial != crashed.device("sim0").serial
    job = BisectJob(swapped, "sim0", BisectParams(trial_s=1, confirm_s=2, restart=True), lambda e: None,
                    engine_factory=FakeEngine())
    job.run()
    [entry] = journal.own_unsafe_entries("sim0")
    assert (entry["setting"], entry["kind"]) == (-40, "system-reset")
    assert entry["serial"] == crashed.device("sim0").serial


def test_a_reset_trial_recovered_after_the_card_was_swapped_keeps_the_unit_it_ran_in(boot):
    # a -40 mV trial reset the machine; the card in the slot now is another kind (its knob a clock offset in MHz).
    # The recovery recorded -40 in the new card's unit: -40 MHz. The root helper files the line under the card of
    # its serial (the one that crashed) and counts only entries in that card's unit (helper/service.py: e.unit ==
    # knob.unit), so the crashed card's -40 mV was refused by no one; and the new card, whose stock is at or beyond
    # -40 MHz, could not be searched at all
    crashed = _a_trial_at_40_open_when_the_machine_reset(boot)
    swapped = SimulatedBackend(kind="nvidia", seed=1)
    assert swapped.knob("sim0").unit == "MHz"
    job = BisectJob(swapped, "sim0", BisectParams(trial_s=1, confirm_s=2, restart=True), lambda e: None,
                    engine_factory=FakeEngine())
    job.run()
    [entry] = journal.own_unsafe_entries("sim0")
    assert (entry["setting"], entry["unit"], entry["serial"]) == (-40, "mV", crashed.device("sim0").serial)


@pytest.mark.parametrize(("key", "value"), [("step", "10"), ("trial_s", "5m"), ("seed", "x"), ("floor", 1e300),
                                            ("floor", -52.5),
                                            # a value of the right type that no command line can give (the
                                            # parameters' own bounds: tuner.core.durations, Mode, the engine's
                                            # presets and dtypes) reached the trials as it was
                                            ("trial_s", float("nan")), ("trial_s", 0), ("trial_s", -5.0),
                                            ("confirm_s", 0.5), ("confirm_s", 1e9), ("bound_s", -60.0),
                                            ("mode", "burn"), ("preset", "huge"), ("dtype", "fp8")])
def test_a_hand_edited_search_parameter_is_damage_in_one_line(boot, key, value):
    # the parameters --resume takes from the journal were never checked: a string or a float where a whole number
    # belongs raised TypeError / ValueError (a traceback), or ran a search with a fractional floor
    backend, _engine, _events, _job = make()
    params = BisectParams(trial_s=1, confirm_s=2, preset="tiny").search()
    j = journal.Journal.create("sim0", params={**params, key: value}, knob=backend.knob("sim0").to_dict(),
                               backend=backend)
    j.close(journal.INTERRUPTED)
    _backend, engine, _events, job = make(resume=True)
    with pytest.raises(DamagedState, match=f"'params'\\['{key}'\\]") as e:
        job.run()
    assert e.value.exit_code == exit_codes.USAGE and engine.requests == []


def test_stored_search_parameters_this_card_cannot_take_are_refused_before_the_session_is_claimed(boot):
    # --resume runs with the session's stored --step (off this card's 5 mV grid here: a hand-edited journal, or a
    # driver whose step changed): the plan refused it only after the session was claimed (state "active", our pid)
    # and told the user to "use a multiple of 5", which --resume cannot do
    backend, _engine, _events, _job = make()
    params = BisectParams(trial_s=1, confirm_s=2, preset="tiny").search()
    j = journal.Journal.create("sim0", params={**params, "step": 7}, knob=backend.knob("sim0").to_dict(),
                               backend=backend)
    j.close(journal.INTERRUPTED)
    _backend, engine, _events, job = make(resume=True)
    with pytest.raises(UsageError, match="--step 7 mV") as e:
        job.run()
    assert "--restart" in (e.value.remedy or ""), e.value.one_line()
    assert e.value.exit_code == exit_codes.USAGE and engine.requests == []
    assert journal.load("sim0")["state"] == journal.INTERRUPTED


def test_a_live_session_elsewhere_is_refused(boot):
    backend, _engine, _events, _job = make()
    j = journal.Journal.create("sim0", params={}, knob={}, backend=backend)
    j.begin_trial("coarse", setting=-10)
    j.doc["open_trial"]["pid"] = os.getppid()  # alive, and not us
    j._save()
    with pytest.raises(UsageError, match="already running"):
        make(resume=True)[3].run()


def test_a_dead_sessions_pid_reused_by_another_process_does_not_refuse_resume(boot):
    # a bisect killed with kill -9, its pid taken later in this boot by an unrelated process: --resume said "a
    # bisect is already running" until that process ended. A process is its pid and its start time.
    backend, _engine, _events, _job = make()
    j = _session_in_its_coarse_trial(backend)
    stranger = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        j.doc["open_trial"].update(pid=stranger.pid, pid_start_ticks=boot.process(stranger.pid) - 1)
        j._save()
        _backend, engine, events, job = make(resume=True)
        outcome = job.run().card
    finally:
        stranger.stdin.close()
        stranger.wait()
    recovered = [e for e in events if isinstance(e, TrialRecovered)]
    assert recovered and recovered[0].result.kind == "tool-died" and recovered[0].result.verdict == "inconclusive"
    assert -30 in [r.options.fault_seed for r in engine.requests]  # run again
    assert outcome.recommendation.setting == -40


def test_the_same_reference_step_in_different_passes_is_a_software_fault(boot):
    # looped reference of 20 steps: step 27 of one trial and step 47 of the next are both its step 7
    _backend, engine, _events, job = make()
    engine.software_fault = lambda req: ("nonfinite", 27 if len(engine.requests) == 3 else 47, 7)
    outcome = job.run().card
    assert outcome.status == "failed" and outcome.failure.kind == "software-fault"
    assert "step 7" in outcome.failure.reason
    assert [(t.setting, t.fault_step, t.reference_step) for t in outcome.trials[2:]] == [(-10, 27, 7), (-5, 47, 7)]
    assert journal.unsafe_settings("sim0") == {}


def test_fault_seeds_are_stable_and_differ_per_setting():
    from tuner.tuning.engine_client import fault_seed_for

    assert fault_seed_for(0, -10) == -10 and fault_seed_for(2, -10) == 2_000_006 - 10
    seeds = {fault_seed_for(s, v) for s in range(3) for v in range(-300, 1, 5)}
    assert len(seeds) == 3 * 61


def test_a_real_fault_at_the_same_step_at_two_settings_is_a_software_fault(boot):
    # vmin -52: nothing is injected at -10 or -5, so the engine's nonfinite at step 7 there is the software's
    _backend, engine, _events, job = make()
    engine.software_fault = lambda req: ("nonfinite", 7, 7)
    outcome = job.run().card
    assert outcome.status == "failed" and outcome.failure.kind == "software-fault"
    assert [(t.setting, t.fault_step, t.injected) for t in outcome.trials[2:]] == [(-10, 7, False), (-5, 7, False)]


def test_the_same_absolute_step_at_different_reference_steps_is_not_a_software_fault(boot):
    _backend, engine, _events, job = make()
    engine.software_fault = lambda req: ("nonfinite", 27, 7 if len(engine.requests) == 3 else 17)
    outcome = job.run().card
    assert outcome.status == "recommended" and outcome.recommendation.confirmed is None


def test_setup_error_is_not_blamed_on_the_voltage(boot):
    _backend, engine, events, job = make()
    engine.error = True
    outcome = job.run().card
    assert outcome.status == "failed" and outcome.exit_code == exit_codes.TEST_FAILED
    assert isinstance(events[-1], BisectFailed) and events[-1].kind == "error"
    assert outcome.trials[0].verdict == "error" and journal.unsafe_settings("sim0") == {}


def test_every_started_trial_carries_a_running_estimate_of_the_total(boot):
    from tuner.tuning.events import TrialStarted

    _, _, events, job = make()
    job.run()
    started = [e for e in events if isinstance(e, TrialStarted)]
    assert [e.index for e in started] == list(range(1, len(started) + 1))
    assert all(e.expected_trials is not None and e.expected_trials >= e.index for e in started)
    # the estimate is exact by the time the confirmation starts (it is the last trial)
    assert started[-1].phase == "confirm" and started[-1].expected_trials == started[-1].index


def test_resume_refuses_another_card_swapped_into_the_slot(boot):
    # the journal is keyed by the slot: a card swapped in (another serial) took over the other card's trials as its
    # own evidence on --resume, and its search went on from them
    backend, engine, _events, job = make()
    engine.on_start = lambda req: job.stop() if req.options.fault_rate == 0 and not req.options.record else None
    assert job.run().card.status == "stopped"
    before = journal.load("sim0")
    other = SimulatedBackend(vmin_mv=-52, seed=1)  # the same model, another serial, in slot sim0
    assert other.device("sim0").serial != backend.device("sim0").serial
    _a_resume_on_it_is_refused_before_anything_runs(other, "another card", before)


def _a_resume_on_it_is_refused_before_anything_runs(other: SimulatedBackend, match: str, before: dict) -> None:
    """`--resume` on the card `other` now in slot sim0: one line (`match`), --restart, exit 2, no engine started,
    the journal as it was (`before`)."""
    engine = FakeEngine()
    job = BisectJob(other, "sim0", BisectParams(trial_s=1, confirm_s=2, resume=True), lambda e: None,
                    engine_factory=engine)
    with pytest.raises(UsageError, match=match) as e:
        job.run()
    assert "--restart" in (e.value.remedy or ""), e.value.one_line()
    assert e.value.exit_code == exit_codes.USAGE and engine.requests == []
    assert journal.load("sim0") == before


@pytest.mark.parametrize("setting", [-100_000, 50])
def test_a_stored_trial_outside_the_cards_range_is_refused_with_the_remedy_resume_leaves(boot, setting):
    """A hand-edited or damaged journal with a pass at -100000 mV: the plan took it as the lowest pass and tried to
    confirm it, and the resumed bisect ended on the card's own refusal ('-100000 mV is outside this card's range'),
    naming a value the user never asked for and no way out. The stored trials are refused as the stored parameters
    are (_check_resumed_search): one line, --restart, before anything runs."""
    backend, engine = SimulatedBackend(vmin_mv=-52), FakeEngine()
    params = BisectParams(trial_s=10, confirm_s=600, preset="tiny").search()
    j = journal.Journal.create("sim0", params=params, knob=backend.knob("sim0").to_dict(), backend=backend)
    j.finish_trial({"setting": 0, "unit": "mV", "phase": "baseline", "verdict": "pass", "steps": 200,
                    "warmup_steps": 5, "duration_s": 5.0})
    j.finish_trial({"setting": setting, "unit": "mV", "phase": "coarse", "verdict": "pass", "steps": 200,
                    "warmup_steps": 5, "duration_s": 5.0})
    j.reference.write_text('{"steps": 1000}')
    j.close(journal.INTERRUPTED)
    job = BisectJob(backend, "sim0", BisectParams(trial_s=10, confirm_s=600, resume=True), lambda _e: None,
                    engine_factory=engine)
    with pytest.raises(UsageError, match=r"trial 2: [+-]\d+ mV is outside this card's range") as e:
        job.run()
    assert "--restart" in (e.value.remedy or "") and engine.requests == []


def test_an_unsafe_entry_in_another_unit_does_not_narrow_the_search(boot):
    # the slot's list holds -30 MHz (another kind of card, once in this slot, hung there): the plan counted it as
    # -30 mV on this mV card (job.py read the list without the knob's unit) while set/apply and the helper ignore it
    from tuner.tuning.events import SessionStarted

    journal.add_unsafe("sim0", -30, unit="MHz", kind="hang", reason="hang at -30 MHz", edge=True)
    backend, _engine, events, job = make()
    assert backend.knob("sim0").unit == "mV"
    outcome = job.run().card
    started = next(e for e in events if isinstance(e, SessionStarted))
    assert started.unsafe == (), started.unsafe
    assert outcome.exit_code == exit_codes.OK and outcome.recommendation.setting < -30


def test_resume_refuses_a_card_of_another_kind_swapped_into_the_slot(boot):
    # a serial may be unknown (the simulated kinds even share them): a card of another kind in the slot must not
    # take the other card's stock baseline and trials as its own evidence on --resume (its search went on in MHz
    # from the mV card's baseline, one journal holding both units)
    _backend, engine, _events, job = make()
    engine.on_start = lambda req: job.stop() if req.options.fault_rate == 0 and not req.options.record else None
    assert job.run().card.status == "stopped"
    before = journal.load("sim0")
    other = SimulatedBackend(kind="nvidia")
    _a_resume_on_it_is_refused_before_anything_runs(other, "another kind", before)
