"""Auto-bisect from the UI with the bisect driver's fake engine (tests/tuning/fake_engine.py): rows appear,
switching screens does not stop it, stop resets the card to stock, the result saves as a profile with evidence."""

from __future__ import annotations

import threading

import pytest

from tests.polling import until
from tests.tui.helpers import make_app, screen_text, sim_backend
from tests.tuning.fake_engine import FakeEngine
from tuner.profiles import list_profiles
from tuner.screens.dialogs import TextInputDialog


class GatedEngine(FakeEngine):
    """Holds the `hold_at`-th trial in start() until released, so a test can look at a running trial."""

    def __init__(self, hold_at: int):
        super().__init__(on_start=self._gate)
        self.hold_at, self.started = hold_at, 0
        self.entered, self.release = threading.Event(), threading.Event()

    def _gate(self, request):
        self.started += 1
        if self.started == self.hold_at:
            self.entered.set()
            self.release.wait(20)


@pytest.fixture(autouse=True)
def boot_id(boot):
    """Every test here runs on a fake /proc with a known boot id (the journal records it)."""


def _fast_form(app):
    for field_id, value in (("trial", "1s"), ("confirm", "2s")):
        app.screen.query_one(f"#in-{field_id}").value = value


async def test_bisect_shows_rows_survives_screen_switches_and_stop_resets_to_stock(tmp_path):
    backend = sim_backend(tmp_path, vmin_mv=-52)
    engine = GatedEngine(hold_at=4)  # baseline, its replay, -10, then hold the -20 trial
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": engine, "kernel_watcher_factory": lambda _card: None})
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await pilot.pause()
        _fast_form(app)
        await pilot.press("b")
        await until(pilot, engine.entered.is_set)
        assert backend.knob("sim0").current == -20  # the trial's setting is on the card
        await until(pilot, lambda: app.screen.query_one("#bisect-trials").row_count >= 4)
        table = app.screen.query_one("#bisect-trials")
        assert [table.get_row_at(i)[2] for i in range(3)] == ["PASS", "PASS", "PASS"]
        for key in "1245613":
            await pilot.press(key)
            await pilot.pause()
            assert app.bisect.running
        await pilot.press("x")
        engine.release.set()
        await until(pilot, lambda: not app.bisect.running)
        assert backend.knob("sim0").current == 0
        assert "stopped" in (app.bisect.card("sim0").failure or "")


async def test_bisect_to_recommendation_and_save_profile(tmp_path):
    backend = sim_backend(tmp_path, vmin_mv=-52)
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": FakeEngine(), "kernel_watcher_factory": lambda _card: None})
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.press("3")
        await pilot.pause()
        _fast_form(app)
        await pilot.press("b")
        await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None)
        rec = app.bisect.card("sim0").recommendation
        assert rec is not None and rec.setting == -40  # vmin -52: lowest pass -50, +10 mV margin
        await until(pilot, lambda: "RECOMMENDED" in str(app.screen.query_one("#bisect-result").render()))
        assert backend.knob("sim0").current == 0  # a bisect leaves the card at stock
        await pilot.press("v")
        await pilot.pause()
        assert isinstance(app.screen, TextInputDialog)
        await pilot.press("enter")
        await until(pilot, lambda: any(n.message.startswith("saved profile") for n in app._notifications))
        [said] = [n.message for n in app._notifications if n.message.startswith("saved profile")]
        assert said.endswith("next: apply it from Profiles (4)"), said  # issue 24: the next step, in UI words
    [profile] = list_profiles()
    assert profile.setting.value == -40 and profile.tuning is not None and profile.tuning.trials


async def test_quit_during_bisect_asks_then_stops_and_resets(tmp_path):
    from tuner.screens.dialogs import ConfirmDialog

    backend = sim_backend(tmp_path, vmin_mv=-52)
    engine = GatedEngine(hold_at=3)  # baseline, its replay, then hold the -10 mV trial
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": engine, "kernel_watcher_factory": lambda _card: None})
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await pilot.pause()
        _fast_form(app)
        await pilot.press("b")
        await until(pilot, engine.entered.is_set)
        assert backend.knob("sim0").current == -10
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await pilot.pause()
    engine.release.set()
    done = app.make_safe(wait_s=20)  # what run_app does once the App has stopped
    assert backend.knob("sim0").current == 0, done


async def test_no_job_starts_once_the_app_is_leaving(tmp_path):
    """A key pressed after the hang-up guard made the cards safe (the App's loop still runs) starts nothing: a job
    started then would write the card after the revert, with nobody left to make it safe."""
    backend = sim_backend(tmp_path, vmin_mv=-52)
    engine = GatedEngine(hold_at=3)  # baseline, its replay, then hold the -10 mV trial
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": engine, "kernel_watcher_factory": lambda _card: None})
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("3")
            await pilot.pause()
            _fast_form(app)
            assert app.make_safe() == []  # the guard's thread: nothing to do yet
            await pilot.press("b")
            await pilot.pause()
            assert not app.bisect.running and engine.started == 0
            app.start_stress("sim0", "tiny", "train")
            await pilot.pause()
            assert not app.stress.running
    finally:
        engine.release.set()
    assert backend.knob("sim0").current == 0


async def test_resume_shows_every_trial_and_the_form_remembers_its_values(tmp_path):
    """Issue 15 item 10: a resumed session's table starts with the trials done before the stop; the form keeps
    the last values per card (XDG config)."""
    backend = sim_backend(tmp_path, vmin_mv=-52)
    engine = GatedEngine(hold_at=3)  # two trials at stock, then hold the third
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": engine, "kernel_watcher_factory": lambda _card: None})
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await pilot.pause()
        _fast_form(app)
        await pilot.press("b")
        await until(pilot, engine.entered.is_set)
        await pilot.press("x")
        engine.release.set()
        await until(pilot, lambda: not app.bisect.running)
        before = [(r["setting"], r["phase"], r["verdict"]) for r in app.bisect.card("sim0").trials
                  if r["verdict"] != "stopped"]
        assert len(before) >= 2 and before[0] == (0, "baseline", "pass")
        await pilot.press("u")
        await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None,
                    timeout_s=60)
        after = [(r["setting"], r["phase"], r["verdict"]) for r in app.bisect.card("sim0").trials]
        assert after[: len(before)] == before  # the earlier trials are still on screen
        assert app.bisect.card("sim0").recommendation is not None
    again = make_app(tmp_path, backend=backend, samples=1)
    async with again.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: again.current_mode == "bisect")
        await until(pilot, lambda: again.screen.query_one("#in-trial").value == "1s",
                    what="the remembered form, read in a worker")
        assert again.screen.query_one("#in-confirm").value == "2s"


async def test_export_the_trials_from_the_ui_and_the_cli(tmp_path):
    import csv
    import json

    from tests.cli_helpers import run_tuner

    backend = sim_backend(tmp_path, vmin_mv=-52)
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": FakeEngine(), "kernel_watcher_factory": lambda _card: None})
    out_csv = tmp_path / "trials.csv"
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await pilot.pause()
        _fast_form(app)
        await pilot.press("b")
        await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None)
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, TextInputDialog)
        app.screen.query_one("#text").value = str(out_csv)
        await pilot.press("enter")
        await until(pilot, out_csv.exists, what="the export, written in a worker")  # written whole (atomic)
        n = len(app.bisect.card("sim0").trials)
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == n and rows[0]["setting"] == "0" and rows[0]["phase"] == "baseline"
    assert {"verdict", "tok_per_j", "power_w", "reason"} <= set(rows[0])
    out_json = tmp_path / "trials.json"
    proc = run_tuner("--simulate", "report", str(out_json))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out_json.read_text())
    assert len(doc["trials"]) == n and doc["simulated"] and "SIMULATED" in doc["note"]
    assert doc["recommendation"]["setting"] == -40
    bad = run_tuner("--simulate", "report", str(tmp_path / "trials.txt"))
    assert bad.returncode == 2 and "a report is .csv or .json" in bad.stderr and "Traceback" not in bad.stderr


async def test_a_refused_start_keeps_the_finished_result_on_screen(tmp_path):
    """Issue 24: a start that is refused (a floor outside the card's range) leaves the finished bisect's table and
    recommendation where they were, says why once, and the result can still be saved."""
    from tuner.tuning.job import BisectParams

    backend = sim_backend(tmp_path, vmin_mv=-52)
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": FakeEngine(), "kernel_watcher_factory": lambda _card: None})
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect")
        _fast_form(app)
        await pilot.press("b")
        await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None)
        finished, rows = app.bisect.outcome, app.bisect.card("sim0").trials
        await until(pilot, lambda: "RECOMMENDED" in str(app.screen.query_one("#bisect-result").render()))
        app.start_bisect(("sim0",), BisectParams(floor=-10_000))
        await until(pilot, lambda: not app.bisect.running and app._bisect_job is None
                    and any("outside this card's range" in n.message for n in app._notifications))
        assert app.bisect.outcome is finished and app.bisect.card("sim0").trials == rows
        await until(pilot, lambda: "outside this card's range" in str(app.screen.query_one("#bisect-status").render()))
        assert "RECOMMENDED" in str(app.screen.query_one("#bisect-result").render())
        assert app.screen.query_one("#bisect-trials").row_count == len(rows)
        refused = [n for n in app._notifications if "outside this card's range" in n.message]
        assert len(refused) == 1 and refused[0].severity == "error", refused


async def test_an_unfinished_sessions_trials_show_when_the_screen_opens(tmp_path):
    """Issue 24: a session stopped earlier (this App or another run) shows its trials and that u continues it as
    soon as its card is on the Bisect screen, before anything runs here (not only after u)."""
    backend = sim_backend(tmp_path, vmin_mv=-52)
    engine = GatedEngine(hold_at=3)  # two trials at stock, then hold the third
    first = make_app(tmp_path, backend=backend, samples=1,
                     bisect_options={"engine_factory": engine, "kernel_watcher_factory": lambda _card: None})
    async with first.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: first.current_mode == "bisect")
        _fast_form(first)
        await pilot.press("b")
        await until(pilot, engine.entered.is_set)
        await pilot.press("x")
        engine.release.set()
        await until(pilot, lambda: not first.bisect.running)
    done = [r for r in first.bisect.card("sim0").trials if r["verdict"] != "stopped"]
    assert len(done) >= 2
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect")
        table = app.screen.query_one("#bisect-trials")
        await until(pilot, lambda: table.row_count >= len(done), what="the earlier trials in the table")
        assert [table.get_row_at(i)[2] for i in range(len(done))] == ["PASS"] * len(done)
        status = str(app.screen.query_one("#bisect-status").render())
        assert "UNFINISHED" in status and "u continues it" in status, status
        assert not app.bisect.running and backend.knob("sim0").current == 0
        assert "u continues it, n starts afresh" in screen_text(app)  # whole at 80 columns
