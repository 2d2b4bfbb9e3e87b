"""Issue 11, the parts about state and evidence: damaged safety files fail closed (defects 3, 10), a trial is
evidence only when it compared enough steps and nothing outside the voltage ended it (6, 7), we write only what we
own (8), no tracebacks (9), numbers are ASCII (11). Each test failed on the code before the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.profiles.helpers import save_and_apply, sim, sim_profile, tuner
from tests.tuning.fake_engine import FakeEngine, result
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.core.errors import DamagedState, UsageError
from tuner.profiles import save_profile
from tuner.tuning import evidence, journal
from tuner.tuning.job import BisectJob, BisectParams

GOOD_LINE = {"device": "sim0", "setting": -40, "unit": "mV", "kind": "system-reset", "reason": "reset",
             "edge": True}
DAMAGE = {
    "torn": json.dumps(GOOD_LINE)[:-1].encode(),  # cut before the closing brace
    "string-setting": json.dumps({**GOOD_LINE, "setting": "-40"}).encode(),
    "float-setting": json.dumps({**GOOD_LINE, "setting": -40.0}).encode(),
    "bad-bytes": b'{"device": "sim0", "setting": -40, "kind": "system-reset", "reason": "\xff\xfe"}',
}


def _damage_unsafe_list(raw: bytes) -> None:
    path = journal.unsafe_path("sim0")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(json.dumps({**GOOD_LINE, "setting": -90}).encode() + b"\n" + raw + b"\n")


def _make(vmin=-52, engine=None, **kw):
    backend = SimulatedBackend(vmin_mv=vmin)
    engine = engine or FakeEngine()
    events: list = []
    params = BisectParams(**{"trial_s": 1, "confirm_s": 2, **kw})
    return backend, engine, events, BisectJob(backend, "sim0", params, events.append, engine_factory=engine)


# --- defect 3 and 10: fail closed ----------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_unsafe_list_blocks_set_apply_boot_and_bisect(capsys, boot, damage):
    _damage_unsafe_list(DAMAGE[damage])
    where = str(journal.unsafe_path("sim0"))
    code, _out, err = tuner(capsys, "--simulate", "set", "--device", "sim0", "--offset", "-40", "--yes")
    assert code == exit_codes.USAGE and where in err and "damaged" in err and "line 2" in err, err
    assert len(err.strip().splitlines()) == 1
    # --ignore-unsafe overrides an entry, never a file we cannot read
    code, _out, err = tuner(capsys, "--simulate", "set", "--device", "sim0", "--offset", "-40", "--yes",
                            "--ignore-unsafe")
    assert code == exit_codes.USAGE and "damaged" in err
    code, _out, err = save_and_apply(capsys, sim_profile("p40", value=-40), "--device", "sim0", "--yes")
    assert code == exit_codes.USAGE and where in err
    save_profile(sim_profile("boot40", value=-40), system=True)
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "--boot", "--boot-wait", "0")
    assert code == exit_codes.USAGE and "could not apply 'boot40' to sim0" in err and "damaged" in err
    assert sim().knob("sim0").current == 0
    backend, engine, _events, job = _make()
    with pytest.raises(DamagedState, match="damaged"):
        job.run()
    assert engine.requests == [] and backend.knob("sim0").current == 0


def test_a_damaged_guard_file_blocks_set(capsys, boot):
    path = journal.guard_path("sim0")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"open_trial": {"setting": "-40", "phase": "verify"}}))
    code, _out, err = tuner(capsys, "--simulate", "set", "--device", "sim0", "--offset", "-10", "--yes")
    assert code == exit_codes.USAGE and str(path) in err and "'setting' is not a whole number" in err


@pytest.mark.parametrize("doc", [{}, {"version": 1, "session": 5}, [], {"version": 1, "session": "s", "device": "sim0",
                                 "state": "active", "params": {}, "trials": [{"setting": -10}]}])
def test_a_journal_of_valid_json_with_wrong_types_is_one_line(capsys, boot, doc):
    path = journal.journal_path("sim0")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    code, out, err = tuner(capsys, "--simulate", "bisect", "--device", "sim0", "--trial", "1s", "--resume")
    assert code == exit_codes.USAGE and out == "" and len(err.strip().splitlines()) == 1, err
    assert str(path) in err and "damaged" in err and "Traceback" not in err


@pytest.mark.parametrize("lacking", ["confirmed", "lowest_pass", "first_failure", "edge"])
def test_a_finished_journal_whose_recommendation_lacks_a_key_is_one_line(capsys, boot, lacking):
    """A hand-edited journal: `--from-last` rebuilt the recommendation with a TypeError (a traceback)."""
    rec = {"setting": -40, "margin": 10, "unit": "mV", "confirmed": -50, "lowest_pass": -50, "first_failure": -60,
           "edge": False}
    del rec[lacking]
    path, err = _from_last_of_a_finished_journal(capsys, rec)
    assert str(path) in err and "damaged" in err and repr(lacking) in err


def _from_last_of_a_finished_journal(capsys, rec: dict, *, edit=lambda text: text) -> tuple[Path, str]:
    """`bisect --from-last` over a finished journal holding `rec` (`edit` changes its JSON text, as a hand would): the
    journal's path and what it said on stderr, after checking it ended with one line, exit 2 and nothing on stdout."""
    path = journal.journal_path("sim0")
    path.parent.mkdir(parents=True)
    path.write_text(edit(json.dumps({"version": 1, "session": "s1", "device": "sim0", "state": "finished",
                                     "params": {}, "trials": [], "recommendation": rec})))
    code, out, err = tuner(capsys, "--simulate", "bisect", "--device", "sim0", "--save", "later", "--from-last")
    assert code == exit_codes.USAGE and out == "" and len(err.strip().splitlines()) == 1, err
    return path, err


def _finished_journal_of_sim0() -> None:
    path = journal.journal_path("sim0")
    path.parent.mkdir(parents=True)
    rec = {"setting": -40, "margin": 10, "unit": "mV", "confirmed": -50, "lowest_pass": -50, "first_failure": -60,
           "edge": False}
    path.write_text(json.dumps({"version": 1, "session": "s1", "device": "sim0", "state": "finished",
                                "params": {}, "trials": [], "recommendation": rec}))


def test_from_last_refuses_a_result_found_on_another_card_in_the_slot(capsys, boot):
    """The journals are keyed by slot, so --resume refuses a session run on another card (its serial). --from-last
    did not ask: a card swapped into sim0's slot got a profile for itself holding the other card's result, which
    `tuner apply` then applies to it. Refused in one line, nothing saved."""
    path = journal.journal_path("sim0")
    path.parent.mkdir(parents=True)
    rec = {"setting": -40, "margin": 10, "unit": "mV", "confirmed": -50, "lowest_pass": -50, "first_failure": -60,
           "edge": False}
    path.write_text(json.dumps({"version": 1, "session": "s1", "device": "sim0", "serial": "SIM-9999-00",
                                "state": "finished", "params": {}, "trials": [], "recommendation": rec}))
    code, out, err = tuner(capsys, "--simulate", "bisect", "--device", "sim0", "--save", "later", "--from-last")
    assert code == exit_codes.USAGE and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    assert "SIM-9999-00" in err and "another card" in err, err
    assert not _store("later").exists()


@pytest.mark.parametrize("serial", [None, "SIM-0000-00"])
def test_from_last_refuses_a_result_found_on_a_card_of_another_kind(capsys, boot, serial):
    """The journals are keyed by slot and a serial may be unknown (or, on the simulated kinds, the same): a result
    found in mV on an AMD card was saved for the NVIDIA card now in the slot as -45 MHz (only a value off the 15 MHz
    step was refused, by the step check, with a message about the step). Refused in one line, exit 2, nothing
    saved: the last result was found on a card of another kind."""
    path = journal.journal_path("sim0")
    path.parent.mkdir(parents=True)
    rec = {"setting": -45, "margin": 10, "unit": "mV", "confirmed": -55, "lowest_pass": -55, "first_failure": -60,
           "edge": False}
    path.write_text(json.dumps({"version": 1, "session": "s1", "device": "sim0", "serial": serial,
                                "state": "finished", "params": {}, "trials": [], "recommendation": rec}))
    code, out, err = tuner(capsys, "--simulate", "--sim-kind", "nvidia", "bisect", "--device", "sim0", "--save",
                           "later", "--from-last")
    assert code == exit_codes.USAGE and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    assert "another kind" in err and "mV" in err and "MHz" in err and "tuner bisect" in err, err
    assert not _store("later").exists()


@pytest.mark.parametrize("flag", [("--resume",), ("--restart",), ("--margin", "20"), ("--step", "5"),
                                  ("--trial", "1m"), ("--bound", "10m"), ("--tolerance",), ("--floor", "-30")])
def test_from_last_refuses_a_flag_of_a_run_it_does_not_make(capsys, boot, flag):
    """`--from-last` runs nothing and saves the journal's result as it is: `--resume`, `--restart`, `--margin 20`
    and every other search flag were accepted and did nothing (exit 0, a profile saved with the journal's own
    margin). A flag that cannot apply is refused with one line, exit 2, nothing saved."""
    _finished_journal_of_sim0()
    code, out, err = tuner(capsys, "--simulate", "bisect", "--device", "sim0", "--save", "later", "--from-last",
                           *flag)
    assert code == exit_codes.USAGE and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    assert flag[0] in err and "--from-last" in err, err
    assert not _store("later").exists()


def test_from_last_answers_in_json_when_asked(capsys, boot):
    _finished_journal_of_sim0()
    code, out, err = tuner(capsys, "--simulate", "bisect", "--device", "sim0", "--save", "later", "--from-last",
                           "--json")
    assert code == 0, err
    [line] = out.splitlines()
    assert json.loads(line)["event"] == "profile_saved" and json.loads(line)["name"] == "later"


def test_an_end_of_input_at_the_bisect_question_is_a_no_not_a_traceback(capsys, boot, monkeypatch):
    """Ctrl-D at "Continue? [y/N]" on a terminal: input() raised EOFError, which no exit code maps, so the command
    ended in a traceback. Nobody said yes: cancelled, one line, exit 2, the card untouched."""
    import io

    from tests.actions.fakes import RealLookingSim

    class EndedTerminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    backend = RealLookingSim(vmin_mv=-52)
    monkeypatch.setattr("tuner.actions.context.open_backend", lambda **_kw: backend)
    monkeypatch.setattr("sys.stdin", EndedTerminal(""))
    code, _out, err = tuner(capsys, "bisect", "--device", "sim0", "--trial", "1s", "--confirm", "2s")
    assert code == exit_codes.USAGE and "cancelled" in err and len(err.strip().splitlines()) == 1, (code, err)
    assert backend.knob("sim0").current == 0 and journal.load("sim0") is None


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN"])
def test_a_finished_journal_whose_measurement_is_not_finite_names_the_file(capsys, boot, value):
    """A hand-edited journal (Python's json reads Infinity and NaN): `--from-last` ended with
    `tuning.tuned_tok_s: expected a finite number, got inf`, naming neither the journal nor a remedy."""
    rec = {"setting": -40, "margin": 10, "unit": "mV", "confirmed": -50, "lowest_pass": -50, "first_failure": -60,
           "edge": False, "tuned_tok_s": 0.0}
    path, err = _from_last_of_a_finished_journal(capsys, rec, edit=lambda text: text.replace("0.0", value))
    assert str(path) in err and "damaged" in err and "tuned_tok_s" in err and "move it aside" in err, err


@pytest.mark.parametrize("setting", [-5000, 5000])
def test_a_finished_journal_whose_recommendation_this_card_cannot_take_names_the_file(capsys, boot, setting):
    """A journal from another card, or hand-edited: `--from-last` ended on the profile's own check,
    `setting.value: -5000 mV is outside -500..+0 mV for a voltage_offset`, naming neither the journal nor a way out."""
    rec = {"setting": setting, "margin": 10, "unit": "mV", "confirmed": -50, "lowest_pass": -50,
           "first_failure": -60, "edge": False}
    path, err = _from_last_of_a_finished_journal(capsys, rec)
    assert str(path) in err and f"{setting:+d} mV" in err and "tuner bisect" in err, err


def test_a_journal_that_parses_but_is_damaged_blocks_boot_apply(capsys, boot):
    path = journal.journal_path("sim1")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "session": "s1", "state": "active", "open_trial": None}))
    save_profile(sim_profile("mine", value=-45), system=True)
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "--boot", "--boot-wait", "0")
    assert code == 0 and "skipped" in err and "damaged" in err and str(path) in err
    assert sim().knob("sim0").current == 0


def test_status_warns_about_a_value_left_by_a_dead_tool(capsys, boot, in_process_backend):
    j = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)
    j.begin_trial("coarse", setting=-10)
    j.doc["open_trial"]["pid"] = 2**22 + 4321  # dead
    j._save()
    sim(gpus=1).apply("sim0", -10)  # a kill -9 left the trial value on the card
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "1", "status")
    assert code == 0
    assert "warning: sim0 reads -10 mV, left over: a coarse trial at -10 mV did not finish" in err
    assert "tuner reset --device sim0" in err


def test_a_journal_naming_a_reference_outside_the_state_directory_is_damaged(boot, tmp_path, in_process_backend):
    j = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)
    elsewhere = tmp_path / "precious"
    j.update(reference=str(elsewhere))
    with pytest.raises(DamagedState, match="'reference' names"):
        journal.load("sim0")
    assert j.reference == journal.reference_path("sim0", j.session)  # never the path the document names


def test_a_journal_copied_to_another_cards_name_is_damaged(boot, in_process_backend):
    # sim0's history (its passes, its open trial) is not sim1's: resuming it on sim1 would take trials sim1 never
    # ran as its evidence, and mark sim0's open setting unsafe on sim1
    j = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)
    j.begin_trial("coarse", setting=-10)
    # without its 'reference' (optional), only the 'device' key tells whose history it is
    doc = {k: v for k, v in json.loads(journal.journal_path("sim0").read_text()).items() if k != "reference"}
    journal.journal_path("sim1").write_text(json.dumps(doc))
    with pytest.raises(DamagedState, match="'device' is 'sim0'"):
        journal.load("sim1")
    assert journal.load("sim0") is not None


# --- defects 6 and 7: evidence, not accidents ----------------------------------------------------------------------
def test_a_trial_too_short_to_compare_50_steps_is_inconclusive_and_runs_longer(boot):
    engine = FakeEngine(steps=lambda r: int((r.options.duration_s or 1) * 30))  # 1 s: 30 steps; 4 s: 120
    _backend, engine, _events, job = _make(engine=engine)
    outcome = job.run().card
    assert outcome.recommendation.setting == -40 and outcome.recommendation.confirmed == -50
    short = [t for t in outcome.trials if t.verdict == "inconclusive"]
    assert short and all(t.kind == evidence.TOO_SHORT for t in short)
    # every passing trial at a setting compared at least 50 steps (the runs at stock test the platform)
    assert all(t.steps >= 50 for t in outcome.trials if t.passed and t.phase not in ("baseline", "replay", "control"))
    coarse_10 = [r.options.duration_s for r in engine.requests if r.options.fault_seed == -10]
    assert coarse_10 == [1, 4]
    # the history, inconclusive runs included, goes into a valid profile
    from tuner.profiles import build_profile
    from tuner.profiles.schema import Profile

    profile = build_profile("short", _backend.devices()[0], _backend.knob("sim0"), -40, tuning=outcome.tuning())
    assert "inconclusive" in [t.verdict for t in Profile.from_toml(profile.to_toml()).tuning.trials]


def test_a_trial_that_never_compares_enough_steps_is_never_a_pass(boot):
    backend, engine, _events, job = _make(engine=FakeEngine(steps=lambda r: 1))  # --trial 0.01: one step each
    outcome = job.run().card
    assert outcome.recommendation is None and outcome.failure.kind == evidence.TOO_SHORT
    assert outcome.exit_code == exit_codes.TEST_FAILED and "longer --trial" in outcome.failure.reason
    assert [r.options.duration_s for r in engine.requests if not r.options.verify_repeatable][1:] == [1, 4, 16, 64]
    assert backend.knob("sim0").current == 0 and journal.unsafe_settings("sim0") == {}


@pytest.mark.parametrize("text", ["0.01", "0.5", "0s"])
def test_durations_under_a_second_are_usage_errors(capsys, text):
    code, _out, err = tuner(capsys, "--simulate", "bisect", "--device", "sim0", "--trial", text)
    assert code == exit_codes.USAGE and "out of range" in err
    with pytest.raises(UsageError, match="too short"):
        _make(trial_s=0.01)[3].run()


def test_an_engine_killed_from_outside_is_inconclusive_and_runs_again_on_resume(boot):
    killed = []

    def oom_killer(request):
        if request.options.fault_seed == -30 and not killed:
            killed.append(request)
            return result("fail", "crash", "the engine died of SIGKILL after step 7", failure_step=8, steps=7,
                          duration_s=0.5)
        return None

    backend, engine, _events, job = _make(engine=FakeEngine(override=oom_killer))
    outcome = job.run().card
    assert outcome.status == "stopped" and outcome.exit_code == exit_codes.INTERRUPTED
    doc = journal.load("sim0")
    assert doc["state"] == journal.INTERRUPTED and doc["trials"][-1]["verdict"] == "inconclusive"
    assert doc["trials"][-1]["kind"] == evidence.ENGINE_KILLED and doc["trials"][-1]["setting"] == -30
    assert journal.unsafe_settings("sim0") == {} and backend.knob("sim0").current == 0
    backend, engine, _events, job = _make(resume=True)
    outcome = job.run().card
    assert outcome.recommendation.setting == -40 and not outcome.recommendation.edge  # as if uninterrupted
    assert -30 in [r.options.fault_seed for r in engine.requests]


def test_a_crash_by_a_signal_the_engine_raised_itself_is_still_a_failure(boot):
    def segv(request):
        if request.options.fault_seed == -60:
            return result("fail", "crash", "the engine died of SIGSEGV after step 3", failure_step=4, steps=3,
                          duration_s=0.5)
        return None

    outcome = _make(engine=FakeEngine(override=segv))[3].run().card
    assert any(t.setting == -60 and t.verdict == "fail" and t.kind == "crash" for t in outcome.trials)


def test_unsafe_list_and_clear(capsys, boot):
    journal.add_unsafe("sim0", -80, unit="mV", kind="system-reset", reason="reset", edge=True)
    journal.add_unsafe("sim0", -95, unit="mV", kind="hang", reason="hung", edge=True)
    code, out, _err = tuner(capsys, "--simulate", "unsafe", "list", "--json")
    assert code == 0 and [e["setting"] for e in json.loads(out)["unsafe"][0]["entries"]] == [-80, -95]
    code, _out, err = tuner(capsys, "--simulate", "unsafe", "clear", "--device", "sim0", "-80")  # no tty: asks
    assert code == exit_codes.USAGE and "--yes" in err and set(journal.unsafe_settings("sim0")) == {-80, -95}
    code, out, _err = tuner(capsys, "--simulate", "unsafe", "clear", "--device", "sim0", "-80", "--yes")
    assert code == 0 and "removed -80 mV" in out and set(journal.unsafe_settings("sim0")) == {-95}
    code, out, _err = tuner(capsys, "--simulate", "unsafe", "list")
    assert "-95 mV" in out and "-80 mV" not in out


def test_an_end_of_input_at_the_unsafe_clear_question_is_a_no_not_a_traceback(capsys, boot, monkeypatch):
    """Ctrl-D at "Remove ... from sim0's unsafe list? [y/N]" on a terminal: input() raised EOFError, a traceback.
    Nobody said yes: nothing is cleared, one line, exit 2."""
    import io

    class EndedTerminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    journal.add_unsafe("sim0", -80, unit="mV", kind="system-reset", reason="reset", edge=True)
    monkeypatch.setattr("sys.stdin", EndedTerminal(""))
    code, _out, err = tuner(capsys, "--simulate", "unsafe", "clear", "--device", "sim0", "-80")
    assert code == exit_codes.USAGE and "nothing was cleared" in err and len(err.strip().splitlines()) == 1, err
    assert set(journal.unsafe_settings("sim0")) == {-80}


def test_the_unsafe_clear_question_keeps_out_of_the_json_document(capsys, boot, monkeypatch):
    """`--json` prints one JSON document (README): the question was input()'s prompt on stdout, before the
    document, so `unsafe clear --json` answered on a terminal printed "Remove ...? [y/N] {...}", no JSON."""
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    journal.add_unsafe("sim0", -80, unit="mV", kind="system-reset", reason="reset", edge=True)
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    code, out, err = tuner(capsys, "--simulate", "unsafe", "clear", "--device", "sim0", "-80", "--json")
    assert code == 0 and json.loads(out)["removed"][0]["setting"] == -80, out
    assert "Remove -80 mV" in err and journal.unsafe_settings("sim0") == {}


def test_unsafe_clear_is_refused_while_a_bisect_holds_the_card(capsys, boot):
    """A bisect holds the card's writer lock for its whole life and appends to its unsafe list when a trial hangs or
    resets the card. `tuner unsafe clear` took no lock: it read the list, then rewrote it without the entries it
    removed, so a line the bisect appended in between was lost (and it cleared under a running bisect, which the
    root helper refuses: service._op_unsafe_clear, `_writer`). Busy: one line, exit 6, the list untouched."""
    from tuner.core.card_lock import CardLock

    journal.add_unsafe("sim0", -80, unit="mV", kind="system-reset", reason="reset", edge=True)
    with CardLock("sim0", "auto-bisect of sim0"):
        code, _out, err = tuner(capsys, "--simulate", "unsafe", "clear", "--device", "sim0", "--yes")
    assert code == exit_codes.BUSY and "auto-bisect of sim0" in err, (code, err)
    assert set(journal.unsafe_settings("sim0")) == {-80}


# --- defect 8: write only what we own ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_export_overwrite_refuses_anything_but_a_regular_file(capsys, tmp_path, kind):
    save_profile(sim_profile("mine"))
    target = tmp_path / "target"
    precious = tmp_path / "precious"
    precious.write_text("precious")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        target.symlink_to(precious)
    else:
        target.mkdir()
    code, _out, err = tuner(capsys, "profile", "export", "mine", str(target), "--overwrite")
    assert code == exit_codes.USAGE and "nothing was written" in err and len(err.strip().splitlines()) == 1
    assert precious.read_text() == "precious"
    assert {"fifo": target.is_fifo, "symlink": target.is_symlink, "directory": target.is_dir}[kind]()


def test_a_result_whose_save_failed_is_saved_later_from_the_journal(capsys, boot, monkeypatch):
    engine = FakeEngine()

    def take_the_name(request):  # another process saves a profile under our --save name during the run
        if request.options.fault_seed == -50 and not os.path.exists(str(_store("taken"))):
            save_profile(sim_profile("taken", value=-5))

    engine.on_start = take_the_name
    real_init = BisectJob.__init__
    monkeypatch.setattr(BisectJob, "__init__", lambda self, *a, **kw: real_init(self, *a, engine_factory=engine,
                                                                                **kw))
    code, out, err = tuner(capsys, "--simulate", "--sim-vmin", "-52", "bisect", "--device", "sim0", "--trial", "1s",
                           "--confirm", "2s", "--save", "taken")
    assert code == exit_codes.USAGE and "already exists" in err and "--from-last" in err, err
    assert "--overwrite" not in err  # a flag `tuner bisect` does not take: its remedy is another --save name
    assert "recommendation for" in out
    code, out, err = tuner(capsys, "--simulate", "bisect", "--device", "sim0", "--save", "later", "--from-last")
    assert code == 0, err
    from tuner.profiles.store import load_profile

    saved = load_profile("later")
    assert saved.setting.value == -40 and saved.tuning is not None and saved.tuning.confirmed == -50


def test_a_save_name_taken_by_a_dangling_link_is_refused_before_the_run(capsys, boot, monkeypatch):
    """The --save name is checked before hours of trials, but with exists(), which follows a link: a dangling link
    at NAME.toml passed, the whole bisect ran, and the save at its end (lexists: the store never writes through a
    link) refused the name. Refused up front, nothing run."""
    engine = FakeEngine()
    real_init = BisectJob.__init__
    monkeypatch.setattr(BisectJob, "__init__", lambda self, *a, **kw: real_init(self, *a, engine_factory=engine,
                                                                                **kw))
    link = _store("taken")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(link.parent / "gone.toml")
    code, out, err = tuner(capsys, "--simulate", "--sim-vmin", "-52", "bisect", "--device", "sim0", "--trial", "1s",
                           "--confirm", "2s", "--save", "taken")
    assert code == exit_codes.USAGE and "already exists" in err and len(err.strip().splitlines()) == 1, (code, err)
    assert out == "" and journal.load("sim0") is None
    assert link.is_symlink()


def _store(name):
    from tuner.profiles.store import profile_path

    return profile_path(name)


# --- defect 9: no tracebacks ---------------------------------------------------------------------------------------
HUGE_INT = "1" * 5000
BAD_PROFILES = {
    "huge-int": lambda text: text.replace("value = -45", f"value = {HUGE_INT}"),
    "datetime-overflow": lambda text: _replace_created(text, "0001-01-01T00:00:00+01:00"),
}


def _replace_created(text: str, value: str) -> str:
    lines = [f"created = {value}" if line.startswith("created = ") else line for line in text.splitlines()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("bad", sorted(BAD_PROFILES))
def test_hostile_numbers_in_a_profile_are_one_line_and_never_block_the_others(capsys, boot, tmp_path, bad):
    text = sim_profile("bad", value=-45).to_toml()
    assert "value = -45" in text and "created = " in text
    path = tmp_path / "bad.toml"
    path.write_text(BAD_PROFILES[bad](text))
    code, out, err = tuner(capsys, "profile", "import", str(path))
    assert code == exit_codes.USAGE and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, out, err = tuner(capsys, "--simulate", "apply", str(path), "--yes")
    assert code == exit_codes.USAGE and len(err.strip().splitlines()) == 1
    # one bad file in the system store: the good profile is still applied at boot, and listed
    save_profile(sim_profile("good", value=-45), system=True)
    from tuner.core import paths

    (paths.system_profiles_dir() / "bad.toml").write_text(path.read_text())
    code, out, err = tuner(capsys, "profile", "list")
    assert code == 0 and "good" in out
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "--boot", "--boot-wait", "0")
    assert code == 0 and "applied 'good' to sim0" in err and "ignoring" in err


def test_set_with_stdin_closed_reverts_without_a_traceback(boot):
    import subprocess
    import sys

    from tests.cli_helpers import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", "-c", (f"exec {sys.executable} -m tuner --simulate set --device sim0 --offset -10 "
                           "--keep-timeout 1 <&-")], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert "Traceback" not in proc.stderr and "AttributeError" not in proc.stderr, proc.stderr
    assert "not confirmed: reverted to +0 mV" in proc.stderr and sim(gpus=1).knob("sim0").current == 0


# --- defect 11: numbers are ASCII, and the small ones ----------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["set", "--device", "sim0", "--offset=-\u0663\u0660", "--yes"],  # Arabic-Indic digits
    ["set", "--device", "sim0", "--offset=-3_0", "--yes"],
    ["bisect", "--device", "sim0", "--step", "1_0"],
    ["bisect", "--device", "sim0", "--trial", "5m5m"],
    ["bisect", "--device", "sim0", "--trial", "\u0663\u0660s"],
    ["stress", "--device", "sim0", "--duration", "3_0"],
])
def test_numbers_are_ascii_digits_and_a_sign(capsys, argv):
    code, out, err = tuner(capsys, "--simulate", *argv)
    assert code == exit_codes.USAGE and "tuner: error:" in err, (out, err)
    assert sim(gpus=1).knob("sim0").current == 0


def test_control_characters_in_a_device_name_are_escaped():
    from tuner.core.models import DeviceInfo

    dev = DeviceInfo(id="0000:03:00.0", vendor="amd", name="RX\x1b[2J\r\u202eevil\x07")
    assert dev.label == "RX\\x1b[2J\\x0d\\u202eevil\\x07"
    assert all(ch.isprintable() for ch in dev.label)


def test_an_empty_name_is_an_error_not_no_name(capsys, tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(sim_profile("fromfile").to_toml())
    code, _out, err = tuner(capsys, "profile", "import", str(path), "--name", "")
    assert code == exit_codes.USAGE and "--name" in err
    code, _out, err = tuner(capsys, "--simulate", "bisect", "--device", "sim0", "--save", "")
    assert code == exit_codes.USAGE and "--save" in err


def test_a_full_disk_has_its_own_message_and_exit_code(capsys, monkeypatch, tmp_path):
    import errno

    import tuner.profiles.store as store

    save_profile(sim_profile("mine"))

    def full(path, data, mode=0o644):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(store, "write_atomic", full)
    code, _out, err = tuner(capsys, "profile", "export", "mine", str(tmp_path / "out.toml"))
    assert code == exit_codes.DISK_FULL != exit_codes.USAGE
    assert "no space left" in err and "free disk space" in err


def test_a_full_disk_mid_bisect_is_inconclusive_and_resumes(boot, monkeypatch):
    import errno

    from tuner.core.errors import DiskFull

    real_write = journal.write_atomic
    full = []

    def write(path, data, mode=0o644):
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_write(path, data, mode)

    monkeypatch.setattr(journal, "write_atomic", write)
    engine = FakeEngine(on_start=lambda r: full.append(1) if r.options.fault_seed == -30 else None)
    backend, engine, _events, job = _make(engine=engine)
    with pytest.raises(DiskFull, match="no space left"):
        job.run()
    assert backend.knob("sim0").current == 0 and journal.load("sim0")["open_trial"]["setting"] == -30
    full.clear()  # space freed
    backend, engine, _events, job = _make(resume=True)
    outcome = job.run().card
    assert journal.unsafe_settings("sim0") == {} and -30 in [r.options.fault_seed for r in engine.requests]
    assert outcome.recommendation.setting == -40 and not outcome.recommendation.edge


def test_an_engine_that_crashes_on_a_full_disk_is_not_blamed_on_the_voltage(boot, monkeypatch):
    from tuner.core.errors import DiskFull

    disk = {"full": False}
    monkeypatch.setattr(evidence, "disk_full", lambda path: disk["full"])

    def no_space(request):
        if request.options.fault_seed == -20 and not disk.get("done"):
            disk.update(full=True, done=True)
            return result("fail", "crash", "the engine exited with code 1 without an "
                          "end event after step 9", failure_step=10, steps=9, duration_s=0.5)
        return None

    backend, _engine, _events, job = _make(engine=FakeEngine(override=no_space))
    with pytest.raises(DiskFull, match="is full"):
        job.run()
    assert backend.knob("sim0").current == 0
    doc = journal.load("sim0")
    assert doc["state"] == journal.INTERRUPTED and doc["trials"][-1]["kind"] == evidence.DISK_FULL
    disk["full"] = False
    _backend, _engine, _events, job = _make(resume=True)
    outcome = job.run().card
    assert outcome.recommendation.setting == -40 and journal.unsafe_settings("sim0") == {}


def test_a_dead_tool_with_an_unreadable_boot_id_fails_closed(boot, in_process_backend):
    # without both boot ids a machine reset cannot be ruled out: the value is treated as after a reset
    j = journal.Journal.create("sim0", params=BisectParams(trial_s=1, confirm_s=2, preset="tiny").search(),
                               knob=SimulatedBackend().knob("sim0").to_dict(), backend=in_process_backend)
    j.finish_trial({"setting": 0, "unit": "mV", "phase": "baseline", "verdict": "pass"})
    j.reference.write_text('{"steps": 1000}')
    j.begin_trial("coarse", setting=-30)
    j.doc["open_trial"]["pid"] = 2**22 + 4321  # dead
    j._save()
    (boot.root / "proc/sys/kernel/random/boot_id").unlink()
    outcome = _make(resume=True)[3].run().card
    assert journal.unsafe_settings("sim0")[-30]["edge"] and outcome.recommendation.edge
