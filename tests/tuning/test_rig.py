"""The concurrent bisect of several cards and the whole-rig confirmation, with the fake engine and a fake rig
trial (tests/tuning/rig_fakes.py): recommendations per card, back-off rules, events, locks, exit codes."""

from __future__ import annotations

import threading

import pytest

from tests.tuning.fake_engine import FakeEngine
from tests.tuning.rig_fakes import FakeRigTrial
from tuner.actions.bisect import prepare_bisect, rig_devices
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.core.card_lock import CardBusy, CardLock
from tuner.core.errors import DamagedState, UsageError
from tuner.tuning import journal, kernel_log
from tuner.tuning.events import (
    RigConfirmFinished,
    RigConfirmStarted,
    RigRecommendation,
    SessionStarted,
    TrialFinished,
    TrialStarted,
)
from tuner.tuning.job import BisectParams

LIMITS = (-52, -67, -40)
CARDS = ("sim0", "sim1", "sim2")


def make(limits=LIMITS, rig=None, engine=None, **kw):
    backend = SimulatedBackend(gpus=len(limits), vmin_mv=limits)
    engine = engine or FakeEngine()
    rig = rig or FakeRigTrial()
    events: list = []
    params = BisectParams(trial_s=1, confirm_s=2, **kw)
    job = prepare_bisect(backend, rig_devices(backend, "all"), params, events.append, run_trial=rig,
                             engine_factory=engine)
    return backend, engine, rig, events, job


def test_three_cards_get_their_own_recommendations_then_pass_together(boot):
    backend, _engine, rig, events, job = make()
    outcome = job.run()
    assert {d: o.recommendation.setting for d, o in outcome.per_card.items()} == {"sim0": -40, "sim1": -55,
                                                                                  "sim2": -30}
    assert outcome.status == "recommended" and outcome.exit_code == exit_codes.OK
    assert dict(outcome.settings) == {"sim0": -40, "sim1": -55, "sim2": -30} and outcome.reasons == {}
    # the recording at stock first (every card its own reference), then the candidates together in mixed mode
    (base_settings, base), (confirm_settings, confirm) = rig.calls
    assert base_settings == {"sim0": 0, "sim1": 0, "sim2": 0} and base.mode == "train" and base.record_paths
    assert sorted(base.record_paths) == list(CARDS) and len(set(base.record_paths.values())) == 3
    assert confirm_settings == {"sim0": -40, "sim1": -55, "sim2": -30}
    assert confirm.mode == "mixed" and confirm.duration_s == 2 and confirm.reference_paths == base.record_paths
    assert all(backend.knob(d).current == 0 for d in CARDS)
    # each card its own journal, session and reference; every event names its card
    sessions = {e.device: e.session for e in events if isinstance(e, SessionStarted)}
    assert sorted(sessions) == list(CARDS) and len(set(sessions.values())) == 3
    assert all(journal.load(d)["session"] == sessions[d] for d in CARDS)
    assert all(e.device in CARDS for e in events if isinstance(e, (TrialStarted, TrialFinished)))
    assert all(e.to_json()["device"] for e in events)
    assert sum(isinstance(e, TrialFinished) and e.device == "sim1" for e in events) == len(
        outcome.per_card["sim1"].trials)
    final = [e for e in events if isinstance(e, RigRecommendation)]
    assert len(final) == 1 and final[0].settings == {"sim0": -40, "sim1": -55, "sim2": -30}
    assert final[0].to_json()["per_card"]["sim1"]["setting"] == -55
    doc = journal.Journal.open_rig(CARDS, backend).doc
    assert doc["state"] == journal.FINISHED and doc["open_trial"] is None and len(doc["attempts"]) == 1


def test_a_rig_failure_pinned_on_one_card_backs_off_only_that_card(boot):
    # under the rig load sim1 holds only down to -50 (the shared supply); alone it confirmed -65 (recommend -55)
    rig = FakeRigTrial(pin=lambda d, s: d == "sim1" and s < -50)
    _backend, _engine, rig, events, job = make(rig=rig)
    outcome = job.run()
    assert [c[0] for c in rig.calls[1:]] == [{"sim0": -40, "sim1": -55, "sim2": -30},
                                             {"sim0": -40, "sim1": -50, "sim2": -30}]
    first = next(e for e in events if isinstance(e, RigConfirmFinished) and e.attempt == 1)
    assert not first.passed and first.pinned == ("sim1",) and first.machine_event is None
    assert first.backed_off == {"sim0": -40, "sim1": -50, "sim2": -30} and "sim1" in first.reasons
    assert outcome.status == "recommended" and dict(outcome.settings) == {"sim0": -40, "sim1": -50, "sim2": -30}
    assert len(outcome.rig_attempts) == 2


def test_a_machine_event_backs_off_every_card_one_step(boot):
    rig = FakeRigTrial(machine_event=lambda call, settings: "machine froze" if call == 2 else None)
    _backend, _engine, rig, events, job = make(rig=rig)
    outcome = job.run()
    assert [c[0] for c in rig.calls[1:]] == [{"sim0": -40, "sim1": -55, "sim2": -30},
                                             {"sim0": -35, "sim1": -50, "sim2": -25}]
    assert dict(outcome.settings) == {"sim0": -35, "sim1": -50, "sim2": -25}
    started = [e for e in events if isinstance(e, RigConfirmStarted)]
    assert [(e.phase, e.attempt) for e in started] == [("rig-baseline", 0), ("rig-confirm", 1), ("rig-confirm", 2)]


def test_a_card_backed_off_to_stock_stays_there_and_says_why(boot):
    # sim2 fails every undervolt under the rig load: -30, -25, ... until stock; the others keep theirs
    rig = FakeRigTrial(pin=lambda d, s: d == "sim2" and s < 0)
    _backend, _engine, rig, _events, job = make(rig=rig, resolution=10, step=10)
    outcome = job.run()
    sim2 = [c[0]["sim2"] for c in rig.calls[1:]]
    assert sim2 == sorted(sim2) and sim2[-1] == 0  # one step at a time toward stock, never back down
    assert outcome.status == "partial" and outcome.exit_code == exit_codes.TEST_FAILED
    assert "sim2" not in outcome.settings and "backed off to stock" in outcome.reasons["sim2"]
    assert set(outcome.settings) == {"sim0", "sim1"}


def test_attempts_are_bounded(boot):
    rig = FakeRigTrial(machine_event=lambda call, settings: "collective timed out" if call > 1 else None)
    backend = SimulatedBackend(gpus=2, vmin_mv=(-52, -67))
    job = prepare_bisect(backend, ("sim0", "sim1"), BisectParams(trial_s=1, confirm_s=2), run_trial=rig,
                             engine_factory=FakeEngine(), max_attempts=3)
    outcome = job.run()
    assert len(rig.calls) == 1 + 3 and outcome.status == "failed" and outcome.exit_code == exit_codes.TEST_FAILED
    assert outcome.settings == {} and all("failed 3 times" in r for r in outcome.reasons.values())


def test_exit_code_and_reason_when_one_card_gets_no_recommendation(boot):
    # sim2's platform does not repeat (its replay at stock diverges): its search stops, the others go on
    engine = FakeEngine(replay_fault=lambda req: ("mismatch", 9) if "sim2." in str(req.options.reference) else None)
    _backend, _engine, rig, _events, job = make(engine=engine)
    outcome = job.run()
    assert outcome.per_card["sim2"].status == "failed" and outcome.status == "partial"
    assert outcome.exit_code == exit_codes.TEST_FAILED
    assert "sim2" not in outcome.settings and "repeat" in outcome.reasons["sim2"]
    assert dict(outcome.settings) == {"sim0": -40, "sim1": -55}
    assert all(set(c[0]) == {"sim0", "sim1"} for c in rig.calls)  # the rig confirms the cards that have one


def test_every_card_is_locked_for_the_rigs_whole_life(boot):
    seen: list = []

    def try_writers(settings, params):
        for d in CARDS:
            with pytest.raises(CardBusy, match="busy"):
                CardLock(d, "tuner set").acquire()
        seen.append(params.phase)

    _backend, _engine, _rig, _events, job = make(rig=FakeRigTrial(on_start=try_writers))
    engine_seen: list = []

    def during_trial(req):
        for d in CARDS:
            try:
                CardLock(d, "tuner set").acquire().release()
                engine_seen.append(d)
            except CardBusy:
                pass

    job._engine_factory.on_start = during_trial
    assert job.run().exit_code == exit_codes.OK
    assert seen == ["rig-baseline", "rig-confirm"] and engine_seen == []
    with CardLock("sim1", "after"):  # released at the end
        pass


def test_a_second_rig_over_an_overlapping_card_is_refused(boot):
    backend = SimulatedBackend(gpus=3, vmin_mv=LIMITS)
    with CardLock("sim2", "another bisect"), pytest.raises(CardBusy):
        prepare_bisect(backend, CARDS, BisectParams(trial_s=1, confirm_s=2), run_trial=FakeRigTrial(),
                           engine_factory=FakeEngine()).run()
    assert journal.load("sim0") is None  # nothing started


def test_stop_stops_every_card_and_the_rig_resumes(boot):
    holder: dict = {}
    engine = FakeEngine()
    calls = {"n": 0}

    def stop_at_third(req):
        calls["n"] += 1
        if calls["n"] == 7:
            holder["job"].stop()

    engine.on_start = stop_at_third
    backend, _e, _rig, _events, job = make(engine=engine)
    holder["job"] = job
    outcome = job.run()
    assert outcome.status == "stopped" and outcome.exit_code == exit_codes.INTERRUPTED
    assert all(backend.knob(d).current == 0 for d in CARDS)
    assert all(journal.load(d)["state"] == journal.INTERRUPTED for d in CARDS)
    with pytest.raises(UsageError, match="unfinished rig bisect"):
        make()[4].run()
    outcome = make(resume=True)[4].run()
    assert outcome.exit_code == exit_codes.OK
    assert dict(outcome.settings) == {"sim0": -40, "sim1": -55, "sim2": -30}


def test_a_kernel_line_naming_no_card_is_seen_by_every_watcher_with_a_trial_open():
    listeners: list[kernel_log.KernelLogWatcher] = []

    def broadcast(line: str) -> None:  # one kernel log, every watcher reading it
        for w in list(listeners):
            w.feed(line)

    def watcher(bus: str) -> kernel_log.KernelLogWatcher:
        w = kernel_log.KernelLogWatcher(bus, source=lambda: None)
        listeners.append(w)
        return w

    a, b = watcher("0000:03:00.0"), watcher("0000:04:00.0")
    broadcast("amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=7, emitted seq=9")
    broadcast("amdgpu: GPU reset begin!")  # names no card: counts against every card with a trial open
    listeners.remove(b)  # b's trial ended
    broadcast("amdgpu: MODE1 reset")
    assert [e.kind for e in a.events] == ["ring-timeout", "gpu-reset", "gpu-reset"]
    assert [e.kind for e in b.events] == ["gpu-reset"]


def test_each_trial_gets_its_own_watcher_for_its_own_card(boot):
    made: list[str] = []

    def factory(device_id: str) -> kernel_log.KernelLogWatcher:
        made.append(device_id)
        return kernel_log.NullWatcher()

    backend = SimulatedBackend(gpus=2, vmin_mv=(-52, -67))
    job = prepare_bisect(backend, ("sim0", "sim1"), BisectParams(trial_s=1, confirm_s=2),
                             run_trial=FakeRigTrial(), engine_factory=FakeEngine(), kernel_watcher_factory=factory)
    outcome = job.run()
    assert made.count("sim0") == len(outcome.per_card["sim0"].trials)
    assert made.count("sim1") == len(outcome.per_card["sim1"].trials)


def test_the_cards_search_concurrently(boot):
    # both cards have a trial open at the same moment (each thread waits until the other card has started one)
    both = threading.Barrier(2, timeout=10)
    opened: list = []

    def meet(req):
        if len(opened) < 2:  # the first trial of each card: neither goes on until both are open
            opened.append(req)
            both.wait()

    backend = SimulatedBackend(gpus=2, vmin_mv=(-52, -67))
    job = prepare_bisect(backend, ("sim0", "sim1"), BisectParams(trial_s=1, confirm_s=2),
                             run_trial=FakeRigTrial(), engine_factory=FakeEngine(on_start=meet))
    assert job.run().exit_code == exit_codes.OK and len(opened) == 2


@pytest.mark.parametrize("spec, fragment", [("sim0,,sim1", "empty entry"), ("sim0,sim0", "twice"),
                                            ("sim0,sim9", "sim9")])
def test_bad_device_lists_are_refused(spec, fragment):
    backend = SimulatedBackend(gpus=2)
    with pytest.raises(Exception, match=fragment):
        rig_devices(backend, spec)


def test_a_rig_run_that_cannot_run_stops_without_blaming_a_voltage(boot):
    # the recording at stock went missing (a state directory cleaned mid-run): every rank errors, nobody is pinned
    rig = FakeRigTrial(on_start=lambda settings, params: [p.unlink() for p in (params.reference_paths or {}).values()])
    _backend, _engine, rig, _events, job = make(rig=rig)
    outcome = job.run()
    assert len(rig.calls) == 2 and outcome.settings == {} and outcome.exit_code == exit_codes.TEST_FAILED
    assert all("could not run" in outcome.reasons[d] for d in CARDS)
    assert all(journal.unsafe_settings(d) == {} for d in CARDS)


def test_a_single_card_bisect_names_its_card_in_every_event(boot):
    from tuner.tuning.job import BisectJob

    events: list = []
    BisectJob(SimulatedBackend(vmin_mv=-52), "sim0", BisectParams(trial_s=1, confirm_s=2), events.append,
              engine_factory=FakeEngine()).run()
    assert events and all(e.device == "sim0" and e.to_json()["device"] == "sim0" for e in events)


class ClockedCards(SimulatedBackend):
    """NVIDIA-like for the lock: each card sustains its own clock under load (1900, 1915, 1930 MHz) and every
    `lock_at_measured_clock` is recorded, in the order made (this process's lock choice, as on the NVML backend)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.locks: list[tuple[str, float]] = []

    def lock_at_measured_clock(self, device_id, clock_mhz):
        self.locks.append((device_id, clock_mhz))
        return int(clock_mhz)

    def telemetry(self, device_id):
        from dataclasses import replace
        return replace(super().telemetry(device_id), core_clock_mhz=1900.0 + 15 * int(device_id[-1]))


def test_a_rig_resumed_after_its_searches_locks_every_card_at_its_own_baseline_clock(boot):
    """The lock is this process's choice (NVIDIA): a rig resumed in a new process after its per-card searches ends
    with no search to set it. Each card must be locked at the clock its own stock baseline sustained before the
    rig runs on it, as its own search was, not left at the V/F table top (which caps nothing)."""
    holder: dict = {}
    first = ClockedCards(gpus=3, vmin_mv=LIMITS)
    rig = FakeRigTrial(on_start=lambda settings, params: holder["job"].stop())  # stops at the rig's recording
    holder["job"] = prepare_bisect(first, CARDS, BisectParams(trial_s=1, confirm_s=2), run_trial=rig,
                                       engine_factory=FakeEngine())
    assert holder["job"].run().status == "stopped" and len(rig.calls) == 1
    own = dict(first.locks)  # what each card's own search locked at (its baseline)
    assert own == {"sim0": 1900.0, "sim1": 1915.0, "sim2": 1930.0}

    resumed = ClockedCards(gpus=3, vmin_mv=LIMITS)  # a new process: no lock chosen yet
    seen: list = []
    rig2 = FakeRigTrial(on_start=lambda settings, params: seen.append(list(resumed.locks)))
    outcome = prepare_bisect(resumed, CARDS, BisectParams(trial_s=1, confirm_s=2, resume=True), run_trial=rig2,
                                 engine_factory=FakeEngine()).run()
    assert outcome.exit_code == exit_codes.OK
    assert dict(seen[0]) == own, seen  # before the first rig run (the recording at stock), every card locked


def test_a_rig_resumed_never_applies_a_value_its_card_listed_unsafe_meanwhile(boot):
    # sim1's own search recommended -55; before the rig resumed, a verify at -50 on sim1 reset the machine (its
    # unsafe list holds -50). The resumed confirmation applied the journal's candidates as they were: -55 on
    # sim1, beyond a value that crashed the machine (in-process nothing else refuses it)
    holder: dict = {}
    rig = FakeRigTrial(on_start=lambda settings, params: holder["job"].stop())  # stops at the rig's recording
    _backend, _engine, _rig, _events, holder["job"] = make(rig=rig)
    assert holder["job"].run().status == "stopped"
    journal.add_unsafe("sim1", -50, unit="mV", kind="system-reset", reason="a verify trial never finished",
                       edge=True)
    rig2 = FakeRigTrial()
    outcome = make(rig=rig2, resume=True)[4].run()
    applied = [settings["sim1"] for settings, _params in rig2.calls]
    assert applied and all(v > -50 for v in applied), applied
    assert outcome.settings.get("sim1", 0) > -50



def test_a_rig_resumed_is_not_backed_off_by_an_unsafe_entry_in_another_unit(boot):
    # sim1's list holds -50 MHz (another kind of card once in the slot): the resumed confirmation backed the mV card
    # off past it as if it were -50 mV (_clear_of_unsafe read the list without the knob's unit)
    holder: dict = {}
    rig = FakeRigTrial(on_start=lambda settings, params: holder["job"].stop())  # stops at the rig's recording
    _backend, _engine, _rig, _events, holder["job"] = make(rig=rig)
    assert holder["job"].run().status == "stopped"
    journal.add_unsafe("sim1", -50, unit="MHz", kind="hang", reason="hang at -50 MHz", edge=True)
    rig2 = FakeRigTrial()
    outcome = make(rig=rig2, resume=True)[4].run()
    assert outcome.exit_code == exit_codes.OK
    assert dict(outcome.settings) == {"sim0": -40, "sim1": -55, "sim2": -30}


@pytest.mark.parametrize("candidate", [-150, -100_000, 50])
def test_a_rig_candidate_beyond_its_cards_own_recommendation_is_refused_before_anything_runs(boot, candidate):
    # a hand-edited or damaged rig journal: sim1's candidate -150 mV (its own search recommended -55) was applied
    # to the card in the rig confirmation, a value no search ever confirmed; one outside the card's range ended the
    # rig on the card's own refusal ("-100000 mV is outside this card's range") after the recording at stock ran
    holder: dict = {}
    rig = FakeRigTrial(on_start=lambda settings, params: holder["job"].stop())  # stops at the rig's recording
    backend, _engine, _rig, _events, holder["job"] = make(rig=rig)
    assert holder["job"].run().status == "stopped"
    j = journal.Journal.open_rig(CARDS, backend)
    assert j is not None and j.doc["candidates"]["sim1"] == -55
    j.update(candidates={**j.doc["candidates"], "sim1": candidate})
    backend.apply("sim2", -20)  # set by hand since the stop: the refusal came after every card was reset to stock
    before = {p: p.read_bytes() for p in journal.journal_dir().iterdir()}
    rig2 = FakeRigTrial()
    with pytest.raises(UsageError, match="sim1") as e:
        make(rig=rig2, resume=True)[4].run()
    assert "--restart" in (e.value.remedy or ""), e.value.one_line()
    assert e.value.exit_code == exit_codes.USAGE and rig2.calls == []
    assert backend.knob("sim2").current == -20
    assert {p: p.read_bytes() for p in journal.journal_dir().iterdir()} == before  # nor the rig journal claimed


@pytest.mark.parametrize("devices", [["sim0", "sim1"], ["sim0", "sim7"]])
def test_a_rig_journal_whose_open_trial_names_a_card_not_in_the_rig_is_damage_not_a_traceback(boot, devices):
    """A hand-edited rig journal (its open trial names a card the rig does not hold), or another rig's renamed to
    this rig's name ('devices' is not what the name says): recovering its trial after a reset backed off each
    card it named by that card's knob, and one the rig has no knob for was a KeyError, a traceback."""
    backend = SimulatedBackend(gpus=2, vmin_mv=(-52, -67))
    j = journal.Journal.create_rig(["sim0", "sim1"], params={}, stock={"sim0": 0, "sim1": 0}, backend=backend)
    j.update(devices=devices, phase="confirm", open_trial={
        "settings": {"sim0": -40, "sim7": -40}, "phase": "rig-confirm", "attempt": 1, "boot_id": "boot-a",
        "pid": 4242, "started_at": 1.0})
    boot("boot-b")
    _backend, engine, _rig, _events, job = make(limits=(-52, -67), restart=True)
    with pytest.raises(DamagedState, match="sim7"):
        job.run()
    assert engine.requests == []


@pytest.mark.parametrize("older", [False, True])
def test_a_rig_resume_refuses_a_card_swapped_in_after_its_search_finished(boot, older):
    # the rig journal recorded no serials and a finished card's result was taken on --resume without a look at the
    # card now in its slot: another card (another serial) swapped in was confirmed at the other card's value. An
    # older tuner's rig journal (no 'serials') still loads; each card's own journal of the rig's session says it
    holder: dict = {}
    rig = FakeRigTrial(on_start=lambda settings, params: holder["job"].stop())  # stops at the rig's recording
    _backend, _engine, _rig, _events, holder["job"] = make(limits=(-52, -67), rig=rig)
    assert holder["job"].run().status == "stopped"
    if older:
        j = journal.Journal.open_rig(("sim0", "sim1"), _backend)
        assert j is not None and j.doc.pop("serials") == {d: _backend.device(d).serial for d in ("sim0", "sim1")}
        j._save()
    assert all(journal.load(d)["state"] == journal.FINISHED for d in ("sim0", "sim1"))
    before = journal._load(journal.rig_path(("sim0", "sim1")))
    swapped = SimulatedBackend(gpus=2, vmin_mv=(-52, -67), seed=1)  # the same models, other serials, same slots
    assert swapped.device("sim1").serial != _backend.device("sim1").serial
    _a_rig_resume_on_them_is_refused_before_anything_runs(swapped, "another card")
    assert journal._load(journal.rig_path(("sim0", "sim1"))) == before


def _a_rig_resume_on_them_is_refused_before_anything_runs(swapped: SimulatedBackend, match: str) -> None:
    """A rig `--resume` of sim0+sim1 on the cards `swapped` now in the slots: one line (`match`), --restart, exit 2,
    no rig trial and no engine started."""
    rig2, engine = FakeRigTrial(), FakeEngine()
    job = prepare_bisect(swapped, ("sim0", "sim1"), BisectParams(trial_s=1, confirm_s=2, resume=True),
                         run_trial=rig2, engine_factory=engine)
    with pytest.raises(UsageError, match=match) as e:
        job.run()
    assert "--restart" in (e.value.remedy or ""), e.value.one_line()
    assert e.value.exit_code == exit_codes.USAGE and rig2.calls == [] and engine.requests == []


def test_a_rig_resume_refuses_a_card_of_another_kind_with_the_rigs_remedy(boot):
    # a finished card's result found on a card of another kind (its unit; the simulated kinds share serials) was
    # refused on a rig --resume by last_outcome with --from-last's remedy, 'run `tuner bisect` on this card', which
    # the unfinished rig journal refuses in turn (an unfinished rig bisect exists): a rig resume starts over with
    # --restart, as its other refusals say
    holder: dict = {}
    rig = FakeRigTrial(on_start=lambda settings, params: holder["job"].stop())  # stops at the rig's recording
    _backend, _engine, _rig, _events, holder["job"] = make(limits=(-52, -67), rig=rig)
    assert holder["job"].run().status == "stopped"
    assert all(journal.load(d)["state"] == journal.FINISHED for d in ("sim0", "sim1"))
    swapped = SimulatedBackend(gpus=2, kind="nvidia")
    swapped.apply("sim0", 60)  # left there by a `tuner set`: the refusal must not reset it
    # the refusal came after every card was reset to stock and the rig journal claimed (state, pid, updated_at,
    # a `session_resumed` line in its log): bad input changes nothing
    before = {p: p.read_bytes() for d in (journal.journal_dir(), swapped.state_path) for p in d.iterdir()}
    _a_rig_resume_on_them_is_refused_before_anything_runs(swapped, "another kind")
    assert swapped.knob("sim0").current == 60
    assert {p: p.read_bytes() for d in (journal.journal_dir(), swapped.state_path) for p in d.iterdir()} == before
