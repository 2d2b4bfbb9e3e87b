"""The declared shapes of the safety files: what each check accepts, the phrase it gives for what it refuses, and
the unsafe list's times (issue 28: a `recorded_at` of 1e308, Infinity or NaN is damage, one line, never a traceback
later). The rig journal the tuner writes fits its declared shape, and the journal module refuses each damage the
shape names (one schema, declared once: journal.py has no check of its own)."""

from __future__ import annotations

import json

import pytest

from tuner.core.errors import DamagedState
from tuner.tuning import journal, journal_schema
from tuner.tuning.journal_schema import Guard, RigJournal, UnsafeEntry, problem

TRIAL = {"setting": -40, "phase": "coarse", "verdict": "pass", "kind": None, "steps": 120, "duration_s": 5.0,
         "edge": False}
JOURNAL = {"version": 1, "session": "20260101-abc", "device": "sim0", "state": "active", "params": {"trial_s": 5},
           "knob": {"kind": "voltage_offset"}, "trials": [TRIAL], "pid": 123, "boot_id": "b", "reference": None,
           "created_at": 1.7e9, "updated_at": 1.7e9, "future_key": {"anything": 1},
           "open_trial": {"session": "20260101-abc", "device": "sim0", "setting": -45, "phase": "refine",
                          "boot_id": "b", "pid": 123, "started_at": 1.7e9},
           "recommendation": {"setting": -40, "margin": 10, "unit": "mV", "confirmed": -50, "lowest_pass": -50,
                              "first_failure": -55, "tuned_tok_s": 1.5, "measured_at": None, "edge": False}}
UNSAFE = {"device": "sim0", "serial": None, "setting": -40, "unit": "mV", "kind": "system-reset", "reason": "reset",
          "edge": True, "session": "s", "boot_id": "b", "recorded_at": 1.7e9, "kernel_log": ["amdgpu: ring timeout"]}
RIG = {"version": 1, "session": "s1", "devices": ["sim0", "sim1"], "state": "active", "phase": "confirm", "pid": 1,
       "boot_id": "b", "created_at": 1.7e9, "updated_at": 1.7e9, "params": {}, "stock": {"sim0": 0, "sim1": 0},
       "sessions": {"sim0": "a", "sim1": "b"}, "candidates": {"sim0": -40, "sim1": -30}, "references": {},
       "baseline": None, "attempts": [{"settings": {"sim0": -40}}], "never": [{"sim0": -60, "sim1": -50}],
       "open_trial": {"phase": "confirm", "attempt": 1, "settings": {"sim0": -40, "sim1": -30}, "boot_id": "b",
                      "pid": 1, "started_at": 1.7e9}}


def _with(doc: dict, dotted: str, value) -> dict:
    """A deep copy of `doc` with one key changed (`...`: removed); `trials.0.setting` indexes lists."""
    doc = json.loads(json.dumps(doc))
    *path, last = dotted.split(".")
    node = doc
    for key in path:
        node = node[int(key)] if key.isdigit() else node[key]
    if value is ...:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return doc


def test_good_documents_pass():
    assert journal_schema.check_journal(JOURNAL) is None
    assert journal_schema.check_journal({**JOURNAL, "open_trial": None, "recommendation": None}) is None
    assert problem({"open_trial": {**JOURNAL["open_trial"], "session": None}}, Guard) is None
    assert problem({"open_trial": None}, Guard) is None
    assert problem(UNSAFE, UnsafeEntry) is None
    assert problem({"setting": -40, "kind": "hang"}, UnsafeEntry) is None  # the oldest lines
    assert problem(RIG, RigJournal) is None
    assert problem({k: RIG[k] for k in ("version", "session", "devices", "state", "phase")}, RigJournal) is None


@pytest.mark.parametrize(("dotted", "value", "phrase"), [
    ("version", 2, "'version' is not 1 (got 2)"),
    ("version", True, "'version' is not 1 (got True)"),
    ("session", "../x", "'session' is not a session id"),
    ("device", ..., "'device' is missing"),
    ("state", "gone", "'state' is not one of active, interrupted, finished (got 'gone')"),
    ("params", [], "'params' is not an object (got [])"),
    ("knob", None, "'knob' is not an object (got None)"),
    ("trials", {}, "'trials' is not a list (got {})"),
    ("trials.0", 5, "trial 1 is not an object"),
    ("trials.0.setting", "-40", "trial 1: 'setting' is not a whole number (got '-40')"),
    ("trials.0.setting", -40.0, "trial 1: 'setting' is not a whole number (got -40.0)"),
    ("trials.0.verdict", "stopped", "trial 1: 'verdict' is not one of pass, fail, error, inconclusive"),
    ("trials.0.edge", None, "trial 1: 'edge' is not true or false (got None)"),
    # a negative warm-up would count more steps compared than ran (evidence.compared_steps): a short pass as a pass
    ("trials.0.warmup_steps", -1000, "trial 1: 'warmup_steps' is not a number of steps, 0 or more (got -1000)"),
    ("trials.0.steps", -5, "trial 1: 'steps' is not a number of steps, 0 or more (got -5)"),
    # a stored length is the replay's on resume (job._trial_params): NaN and Infinity were shown as nothing at all
    ("trials.0.duration_s", float("nan"), "trial 1: 'duration_s' is not a number of seconds, 0 or more (got nan)"),
    ("trials.0.duration_s", float("inf"), "trial 1: 'duration_s' is not a number of seconds, 0 or more (got inf)"),
    ("trials.0.duration_s", -5.0, "trial 1: 'duration_s' is not a number of seconds, 0 or more (got -5.0)"),
    # the stock baseline's is NVIDIA's lock on resume (job.lock_at_baseline_clock); the helper's wire takes 1..10000
    ("trials.0.median_core_clock_mhz", float("nan"), "trial 1: 'median_core_clock_mhz' is not a clock of 0 to 10000"),
    ("trials.0.median_core_clock_mhz", float("inf"), "trial 1: 'median_core_clock_mhz' is not a clock of 0 to 10000"),
    ("trials.0.median_core_clock_mhz", -5.0, "trial 1: 'median_core_clock_mhz' is not a clock of 0 to 10000"),
    ("pid", "123", "'pid' is not a whole number (got '123')"),
    ("open_trial", 5, "'open_trial' is not an object (got 5)"),
    ("open_trial.session", ..., "open trial: 'session' is missing"),
    ("open_trial.setting", "-45", "open trial: 'setting' is not a whole number (got '-45')"),
    ("open_trial.started_at", float("inf"), "open trial: 'started_at' is not a time in seconds since 1970"),
    # the writer's start time (clock ticks since boot) names it with its pid: a negative or text one names no process
    ("open_trial.pid_start_ticks", -1, "open trial: 'pid_start_ticks' is not a whole number, 0 or more"),
    ("open_trial.pid_start_ticks", "12", "open trial: 'pid_start_ticks' is not a whole number, 0 or more"),
    ("recommendation.margin", 1.5, "recommendation: 'margin' is not a whole number (got 1.5)"),
    ("recommendation.unit", ..., "recommendation: 'unit' is missing"),
    ("updated_at", "yesterday", "'updated_at' is not a time in seconds since 1970 (got 'yesterday')"),
])
def test_a_damaged_journal_says_which_key(dotted, value, phrase):
    problem = journal_schema.check_journal(_with(JOURNAL, dotted, value))
    assert problem is not None and phrase in problem and "\n" not in problem, problem


def test_the_checks_give_their_phrases():
    """journal.py calls these, one a kind of file; the phrase names the part of the document that is wrong."""
    bare_trial = {"setting": 1, "phase": "x"}
    assert problem({"open_trial": bare_trial}, Guard) is None  # a guard's trial names no session
    assert journal_schema.check_journal({**JOURNAL, "open_trial": bare_trial}) == "open trial: 'session' is missing"
    assert journal_schema.check_journal({**JOURNAL, "trials": [TRIAL, TRIAL, bare_trial]}) == \
        "trial 3: 'verdict' is missing"
    assert journal_schema.check_journal({**JOURNAL, "trials": [TRIAL, []]}) == "trial 2 is not an object (got [])"
    assert journal_schema.check_journal({**JOURNAL, "recommendation": 5}) == \
        "'recommendation' is not an object (got 5)"
    assert problem([], Guard) == "it is not a JSON object"
    assert problem({}, Guard) == "'open_trial' is missing"
    assert journal_schema.check_journal([]) == "it is not a JSON object"
    assert problem("x", UnsafeEntry) == "it is not a JSON object"
    ref = journal_schema.check_journal({**JOURNAL, "reference": "/etc/passwd"}, reference_name="sim0.s.ref")
    assert ref is not None and ref.startswith("'reference' names '/etc/passwd'")


@pytest.mark.parametrize(("dotted", "value", "phrase"), [
    ("setting", "-40", "'setting' is not a whole number (got '-40')"),
    ("setting", -40.0, "'setting' is not a whole number (got -40.0)"),
    ("setting", ..., "'setting' is missing"),
    ("kind", 5, "'kind' is not a string (got 5)"),
    ("edge", "yes", "'edge' is not true or false (got 'yes')"),
    ("kernel_log", "x", "'kernel_log' is not a list (got 'x')"),
    ("recorded_at", 1e308, "'recorded_at' is not a time in seconds since 1970 (got 1e+308)"),
    ("recorded_at", float("inf"), "'recorded_at' is not a time in seconds since 1970 (got inf)"),
    ("recorded_at", float("nan"), "'recorded_at' is not a time in seconds since 1970 (got nan)"),
    ("recorded_at", -1, "'recorded_at' is not a time in seconds since 1970 (got -1)"),
    ("recorded_at", journal_schema.LAST_TIME_S + 1, "'recorded_at' is not a time"),
    ("recorded_at", "2026-01-01", "'recorded_at' is not a time"),
])
def test_a_damaged_unsafe_line_says_which_key(dotted, value, phrase):
    found = problem(_with(UNSAFE, dotted, value), UnsafeEntry)
    assert found is not None and phrase in found, found


@pytest.mark.parametrize("when", ["1e308", "Infinity", "-Infinity", "NaN", "1e400"])
def test_an_absurd_time_in_the_unsafe_list_is_damage_in_one_line(boot, when):
    """Python's json reads all of these (1e400 as inf); each is one DamagedState naming the line and the key."""
    path = journal.unsafe_path("sim0")
    path.parent.mkdir(parents=True)
    good = json.dumps(UNSAFE)
    path.write_text(f"{good}\n{good[:-1]}, \"recorded_at\": {when}}}\n")
    with pytest.raises(DamagedState) as info:
        journal.unsafe_entries("sim0")
    line = info.value.one_line()
    assert "\n" not in line and str(path) in line and "line 2: 'recorded_at' is not a time" in line, line


def test_the_last_time_the_list_takes_is_the_end_of_year_9999():
    assert problem({**UNSAFE, "recorded_at": journal_schema.LAST_TIME_S}, UnsafeEntry) is None
    assert problem({**UNSAFE, "recorded_at": 0}, UnsafeEntry) is None


RIG_BAD = [
    ("version", 2, "'version' is not 1"),
    ("session", "a/b", "'session' is not a session id"),
    ("state", "x", "'state' is not one of active, interrupted, finished"),
    ("phase", "x", "'phase' is not one of search, baseline, confirm, done"),
    ("devices", [], "'devices' is not a list of card ids (got [])"),
    ("devices", ["sim0", 5], "'devices' is not a list of card ids"),
    ("devices", ..., "'devices' is missing"),
    ("candidates", {"sim0": "-40"}, "'candidates' is not a map of card -> whole number"),
    ("candidates", {"sim0": True}, "'candidates' is not a map of card -> whole number"),
    ("stock", [], "'stock' is not a map of card -> whole number"),
    ("sessions", {"sim0": 5}, "'sessions' is not a map of card -> session id"),
    ("attempts", {}, "'attempts' is not a list"),
    ("never", {}, "'never' is not a list of maps of card -> whole number"),
    ("never", [{"sim0": -60.0}], "'never' is not a list of maps of card -> whole number"),
    ("open_trial", 5, "'open_trial' is not an object"),
    ("open_trial.settings", ..., "open trial: 'settings' is missing"),
    ("open_trial.settings", {"sim0": "x"}, "open trial: 'settings' is not a map of card -> whole number"),
    ("open_trial.phase", 5, "open trial: 'phase' is not a string"),
    ("open_trial.pid", "1", "open trial: 'pid' is not a whole number"),
    ("open_trial.started_at", "x", "open trial: 'started_at' is not a time"),
    # the rig's confirmation reads float(params['confirm_s']) and its mode: a hand-edited one was a ValueError
    ("params.confirm_s", "30m", "'params'['confirm_s'] is not a duration"),
    ("params.mode", 5, "'params'['mode'] is not one of train, gemm, mixed"),
]


@pytest.mark.parametrize(("dotted", "value", "phrase"), RIG_BAD)
def test_a_damaged_rig_journal_says_which_key(dotted, value, phrase):
    found = problem(_with(RIG, dotted, value), RigJournal)
    assert found is not None and phrase in found, found


def test_a_rig_journal_that_is_not_an_object():
    assert problem([], RigJournal) == "it is not a JSON object"


def test_the_rig_journal_the_tuner_writes_fits_the_declared_shape_and_each_damage_is_refused(boot, in_process_backend):
    """What Journal.create_rig and begin_trial write is a RigJournal; each damage above, written over it, makes
    every card of the rig refuse (check_safety_state, which set, apply, boot apply and bisect call first)."""
    rig = journal.Journal.create_rig(["sim0", "sim1"], params={"trial_s": 5}, stock={"sim0": 0, "sim1": 0},
                                     backend=in_process_backend)
    rig.begin_trial("confirm", attempt=1, settings={"sim0": -40, "sim1": -30})
    real = json.loads(rig.path.read_text())
    assert problem(real, RigJournal) is None
    journal.check_safety_state("sim0")  # a sound rig journal refuses nothing
    for dotted, value, phrase in RIG_BAD:
        rig.path.write_text(json.dumps(_with(real, dotted, value)))
        for card in ("sim0", "sim1"):
            with pytest.raises(DamagedState) as damaged:
                journal.check_safety_state(card)
            assert phrase in damaged.value.message and str(rig.path) in damaged.value.message, dotted


def test_the_recommendation_the_journal_holds_is_the_events_own():
    """A finished journal holds the Recommendation event as `asdict` writes it (job.py); the schema declares the
    keys it checks with the event's names (required where the event has no default: every journal has those), so
    the two stay two declarations: this keeps the schema's keys among the event's fields, and the event's document
    valid."""
    from dataclasses import asdict, fields

    from tuner.tuning.events import Recommendation

    assert set(journal_schema.Recommendation.__struct_fields__) <= {f.name for f in fields(Recommendation)}
    rec = Recommendation(device="sim0", unit="mV", setting=-40, confirmed=-50, lowest_pass=-50, first_failure=-55,
                         margin=10, edge=False, tuned_tok_s=1.5, measured_at=-40, bound={"s": 1.0})
    assert journal_schema.check_journal({**JOURNAL, "recommendation": asdict(rec)}) is None


@pytest.mark.parametrize("duration_s", [float("inf"), float("nan"), -5.0])
def test_a_stored_trial_length_that_is_not_a_number_of_seconds_is_damage_in_one_line(boot, duration_s):
    """The stock baseline's stored length is the replay's on resume: Infinity or NaN ran it announced as a trial of
    inf s, and the command line's "started" line (format_duration: OverflowError, ValueError) vanished in the
    job's display guard. A damaged journal is one line and exit 2, before the engine runs."""
    from tests.tuning.fake_engine import FakeEngine
    from tuner.backends.simulated import SimulatedBackend
    from tuner.core import exit_codes
    from tuner.tuning.job import BisectJob, BisectParams

    backend, engine = SimulatedBackend(vmin_mv=-52), FakeEngine()
    params = BisectParams(trial_s=10, confirm_s=600, preset="tiny").search()
    j = journal.Journal.create("sim0", params=params, knob=backend.knob("sim0").to_dict(), backend=backend)
    j.finish_trial({"setting": 0, "unit": "mV", "phase": "baseline", "verdict": "pass", "steps": 200,
                    "warmup_steps": 5, "duration_s": duration_s})
    j.reference.write_text('{"steps": 1000}')
    j.close(journal.INTERRUPTED)
    events: list = []
    job = BisectJob(backend, "sim0", BisectParams(trial_s=10, confirm_s=600, resume=True), events.append,
                    engine_factory=engine)
    with pytest.raises(DamagedState, match=r"trial 1: 'duration_s'") as e:
        job.run()
    assert e.value.exit_code == exit_codes.USAGE and engine.requests == []


@pytest.mark.parametrize("clock_mhz", [float("inf"), float("nan"), -5.0, 1e9])
def test_a_stored_baseline_clock_that_is_not_a_clock_is_damage_in_one_line(boot, clock_mhz):
    """The stock baseline's median core clock is the lock a resumed NVIDIA bisect sets again
    (job.lock_at_baseline_clock): Infinity or NaN died in the simulated card's snapping (ValueError, a traceback),
    and the real backend snaps a NaN or a negative one to the lowest clock and Infinity or 1e9 to the top of the
    table, which caps nothing (tuner/backends/nvidia.py lock_at_measured_clock). Damage: one line, exit 2."""
    from tests.tuning.fake_engine import FakeEngine
    from tuner.backends.simulated import SimulatedBackend
    from tuner.core import exit_codes
    from tuner.tuning.job import BisectJob, BisectParams

    backend, engine = SimulatedBackend(kind="nvidia", vmin_mv=100), FakeEngine()
    lock_before = backend.knob("sim0").lock_clock_mhz
    params = BisectParams(trial_s=10, confirm_s=600, preset="tiny").search()
    j = journal.Journal.create("sim0", params=params, knob=backend.knob("sim0").to_dict(), backend=backend)
    j.finish_trial({"setting": 0, "unit": "MHz", "phase": "baseline", "verdict": "pass", "steps": 200,
                    "warmup_steps": 5, "median_core_clock_mhz": clock_mhz})
    j.reference.write_text('{"steps": 1000}')
    j.close(journal.INTERRUPTED)
    job = BisectJob(backend, "sim0", BisectParams(trial_s=10, confirm_s=600, resume=True), lambda _e: None,
                    engine_factory=engine)
    with pytest.raises(DamagedState, match=r"trial 1: 'median_core_clock_mhz'") as e:
        job.run()
    assert e.value.exit_code == exit_codes.USAGE and engine.requests == []
    assert backend.knob("sim0").lock_clock_mhz == lock_before
