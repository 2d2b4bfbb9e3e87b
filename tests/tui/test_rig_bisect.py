"""Issue 16 item 4 in the UI: the Bisect screen's ALL CARDS target runs every card at once through
tuner.actions.bisect.prepare_bisect of every card as an App-owned job (the bisect driver's fake engine, tests/tuning/
rig_fakes.FakeRigTrial for the whole-rig run), shows a line per card, the rig attempts and the final settings;
the result applies through the core's rig apply (one keep-or-revert for every card) and saves as a rig profile."""

from __future__ import annotations

import html
import re
import threading

import pytest

from tests.polling import until
from tests.tui.helpers import make_app, sim_backend
from tests.tuning.fake_engine import FakeEngine
from tests.tuning.rig_fakes import FakeRigTrial
from tuner.app import jobs
from tuner.profiles import list_profiles
from tuner.screens.dialogs import ConfirmDialog, KeepOrRevertDialog, TextInputDialog
from tuner.tuning import trial

VMIN = (-52, -67, -40)  # own recommendations: -40, -55, -30 mV


@pytest.fixture(autouse=True)
def boot_id(boot):
    """A fake /proc with a known boot id (the journals record it)."""


@pytest.fixture
def fake_rig(monkeypatch):
    fake = FakeRigTrial()
    monkeypatch.setattr(trial, "run_trial", fake)
    return fake


def _app(tmp_path, *, gpus: int = 3, engine=None, **kw):
    backend = sim_backend(tmp_path, gpus=gpus, vmin_mv=VMIN[:gpus])
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": engine or FakeEngine(),
                                   "kernel_watcher_factory": lambda _card: None},
                   **kw)
    return app, backend


def _fast_form(app):
    for field_id, value in (("trial", "1s"), ("confirm", "2s")):
        app.screen.query_one(f"#in-{field_id}").value = value


async def _run_then_apply(pilot, app):
    """Run every card to its result, then press apply: the rig's keep-or-revert question is open."""
    await pilot.press("b")
    await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None)
    await pilot.press("a")
    await app.workers.wait_for_complete()
    await pilot.pause()
    assert isinstance(app.screen, KeepOrRevertDialog)


def _text(app, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


async def _all_cards(pilot, app, gpus: int = 3):
    await pilot.press("3")
    await pilot.pause()
    for _ in range(gpus - 1):
        await pilot.press("d")  # sim0 -> sim1 -> sim2 -> ALL CARDS
    await pilot.press("d")
    await pilot.pause()
    ids = ", ".join(f"sim{i}" for i in range(gpus))
    assert app.bisect_all and f"ALL CARDS ({ids})" in _text(app, "#bisect-status")
    _fast_form(app)


async def test_all_cards_bisects_every_card_then_the_rig_and_applies_and_saves_the_result(tmp_path, fake_rig):
    app, backend = _app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await _all_cards(pilot, app)
        await pilot.press("b")
        await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None)
        assert dict(app.bisect.settings) == {"sim0": -40, "sim1": -55, "sim2": -30}
        assert fake_rig.calls[-1][0] == {"sim0": -40, "sim1": -55, "sim2": -30}  # confirmed together
        assert [backend.knob(f"sim{i}").current for i in range(3)] == [0, 0, 0]  # a bisect leaves stock
        await until(pilot, lambda: "FINAL -40 mV" in _text(app, "#rig-cards"))
        lines = _text(app, "#rig-cards").splitlines()
        assert lines[0].startswith("▶ sim0") and "FINAL -40 mV (confirmed together)" in lines[0]
        assert "sim1" in lines[1] and "FINAL -55 mV" in lines[1] and "FINAL -30 mV" in lines[2]
        attempts = _text(app, "#rig-attempts")
        assert "rig recording at stock: PASS" in attempts
        assert "rig attempt 1 (sim0 -40 mV, sim1 -55 mV, sim2 -30 mV): PASS" in attempts
        assert "RIG RESULT" in _text(app, "#bisect-result")
        svg = html.unescape(app.export_screenshot()).replace("\xa0", " ")  # what fits on the 80x24 screen
        shown = " ".join(" ".join(re.findall(r">([^<>]*)<", svg)).split())
        assert "not a real gain" in shown  # the SIMULATED note is not cut  # the SIMULATED note is not cut
        table = app.screen.query_one("#bisect-trials")
        first = [table.get_row_at(i)[0] for i in range(table.row_count)]
        await pilot.press("c")  # the next card's table
        await until(pilot, lambda: "table: sim1" in _text(app, "#bisect-status"))
        assert [table.get_row_at(i)[0] for i in range(table.row_count)] != first
        assert [table.get_row_at(i)[:3] for i in range(table.row_count)][-1] == ["-65 mV", "confirm", "PASS"]

        await pilot.press("a")  # apply every card: one keep-or-revert, naming each card and unit
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, KeepOrRevertDialog)
        assert "sim0 -40 mV, sim1 -55 mV, sim2 -30 mV" in _text(app, "#keep-question")
        assert "Applied the bisect's result to 3 cards" in _text(app, "#keep-question")  # not its internal name
        assert [backend.knob(f"sim{i}").current for i in range(3)] == [-40, -55, -30]
        await pilot.press("k")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, TextInputDialog)  # kept: now offered as a rig profile
        await pilot.press("enter")
        await pilot.pause()
    assert [backend.knob(f"sim{i}").current for i in range(3)] == [-40, -55, -30]
    [profile] = list_profiles()
    assert profile.is_rig and [p.setting.value for p in profile.parts] == [-40, -55, -30]
    assert profile.rig is not None and profile.rig.attempts == 1 and profile.rig.backend == "gloo"


async def test_the_rig_apply_of_the_result_reverts_every_card_when_not_confirmed(tmp_path, fake_rig, clock):
    app, backend = _app(tmp_path, clock=clock)
    async with app.run_test(size=(80, 24)) as pilot:
        await _all_cards(pilot, app)
        await _run_then_apply(pilot, app)
        assert [backend.knob(f"sim{i}").current for i in range(3)] == [-40, -55, -30]
        clock.advance(15.5)
        await until(pilot, lambda: not isinstance(app.screen, KeepOrRevertDialog)
                    and [backend.knob(f"sim{i}").current for i in range(3)] == [0, 0, 0])
        await app.workers.wait_for_complete()
        assert not isinstance(app.screen, (KeepOrRevertDialog, TextInputDialog))
        assert [backend.knob(f"sim{i}").current for i in range(3)] == [0, 0, 0]
    assert list_profiles() == []


class GatedRig(FakeRigTrial):
    """Holds the first confirmation attempt until released, so a test can look at the rig phase."""

    def __init__(self):
        super().__init__(on_start=self._gate)
        self.entered, self.release = threading.Event(), threading.Event()

    def _gate(self, settings, params):
        if params.phase == "rig-confirm":
            self.entered.set()
            self.release.wait(20)


async def test_the_rig_phase_is_shown_switching_screens_keeps_it_and_quit_resets_every_card(tmp_path, monkeypatch):
    gated = GatedRig()
    monkeypatch.setattr(trial, "run_trial", gated)
    app, backend = _app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await _all_cards(pilot, app)
        await pilot.press("b")
        await until(pilot, gated.entered.is_set)
        assert [backend.knob(f"sim{i}").current for i in range(3)] == [-40, -55, -30]  # all at once
        for key in "124563":
            await pilot.press(key)
            await pilot.pause()
            assert app.bisect.running
        await until(pilot, lambda: "the whole rig: confirmation attempt 1" in _text(app, "#bisect-status"))
        assert "RIG confirm 1 at -55 mV" in _text(app, "#rig-cards").splitlines()[1]
        await pilot.press("1")
        app.sample_now()  # what the 1 Hz sampler does (off in tests)
        await until(pilot, lambda: app.histories["sim0"].knob.current == -40)
        await until(pilot, lambda: "-40 mV APPLIED" in _text(app, "#card-rows"))
        rows = _text(app, "#card-rows").splitlines()
        assert "RIG confirm 1 at -40 mV" in rows[0] and "-40 mV APPLIED" in rows[0]
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        question = str(app.screen.query_one("#question").render())
        assert "an auto-bisect of every card (sim0, sim1, sim2)" in question
        assert "resets every card involved to stock" in question and "the card" not in question  # not one card
        await pilot.press("y")
        await pilot.pause()
    gated.release.set()
    done = app.make_safe(wait_s=20)
    assert [backend.knob(f"sim{i}").current for i in range(3)] == [0, 0, 0], done
    assert any("--device sim0,sim1,sim2 --resume" in line and "u on the Bisect screen" in line for line in done)


async def test_stop_then_resume_continues_the_rig_with_every_cards_earlier_trials(tmp_path, monkeypatch):
    gated = GatedRig()
    monkeypatch.setattr(trial, "run_trial", gated)
    app, backend = _app(tmp_path)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await _all_cards(pilot, app)
        await pilot.press("b")
        await until(pilot, gated.entered.is_set)
        await pilot.press("x")
        gated.release.set()
        await until(pilot, lambda: not app.bisect.running)
        assert "stopped" in (app.bisect.failure or "")
        assert [backend.knob(f"sim{i}").current for i in range(3)] == [0, 0, 0]
        await pilot.pause()
        lines, toasts = _text(app, "#rig-cards"), " ".join(n.message for n in app._notifications)
        assert "--resume" not in lines and "--resume" not in toasts  # the UI's key, not the CLI's flag
        assert lines.count("STOPPED") == 3 and "u resumes" in lines and "u resumes" in toasts
        before = {d: len(app.bisect.card(d).trials) for d in ("sim0", "sim1", "sim2")}
        await pilot.press("b")  # a new start is refused while an unfinished rig session exists
        await until(pilot, lambda: not app.bisect.running and any("unfinished rig" in n.message
                                                                for n in app._notifications))
        assert any("u continues it" in n.message for n in app._notifications)
        gated.entered.clear()
        monkeypatch.setattr(trial, "run_trial", FakeRigTrial())
        await pilot.press("u")
        await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None)
        assert dict(app.bisect.settings) == {"sim0": -40, "sim1": -55, "sim2": -30}
        assert all(len(app.bisect.card(d).trials) >= n for d, n in before.items())  # earlier trials still shown


async def test_restart_discards_the_unfinished_rig_session_and_starts_afresh(tmp_path, monkeypatch):
    gated = GatedRig()
    monkeypatch.setattr(trial, "run_trial", gated)
    app, _backend = _app(tmp_path, gpus=2)
    async with app.run_test(size=(80, 24)) as pilot:
        await _all_cards(pilot, app, gpus=2)
        await pilot.press("b")
        await until(pilot, gated.entered.is_set)
        await pilot.press("x")
        gated.release.set()
        await until(pilot, lambda: not app.bisect.running)
        fresh = FakeRigTrial()
        monkeypatch.setattr(trial, "run_trial", fresh)
        await pilot.press("n")
        await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None)
        assert dict(app.bisect.settings) == {"sim0": -40, "sim1": -55}
        assert fresh.calls[0][1].phase == "rig-baseline"  # from the start: the recording at stock again
        assert app.bisect.card("sim0").trials[0]["phase"] == "baseline"  # a new table, not the stopped one's


async def test_quit_with_the_rig_result_unconfirmed_reverts_every_card(tmp_path, fake_rig):
    app, backend = _app(tmp_path, gpus=2)
    async with app.run_test(size=(80, 24)) as pilot:
        await _all_cards(pilot, app, gpus=2)
        await _run_then_apply(pilot, app)
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        assert "an unconfirmed setting on sim0, sim1" in str(app.screen.query_one("#question").render())
        await pilot.press("y")
        await pilot.pause()
    assert [backend.knob(f"sim{i}").current for i in range(2)] == [-40, -55]
    done = app.make_safe()
    assert [backend.knob(f"sim{i}").current for i in range(2)] == [0, 0], done
    assert "reverted the unconfirmed setting on sim0, sim1" in done


async def test_quit_when_the_rig_stops_at_once_still_says_the_session_is_kept(tmp_path, fake_rig):
    """A stop during a card's trial ends the rig job quickly: its end can be handled before make_safe runs; the
    exit lines must still say that the session is kept and how to resume it."""
    # The first card trial is held until the stop: with a fast fake engine the whole rig could otherwise end
    # between two polls of `running`, and the stop would land on no trial at all.
    entered, release = threading.Event(), threading.Event()

    def hold_first_trial(_request):
        if not entered.is_set():
            entered.set()
            release.wait(20)

    app, backend = _app(tmp_path, gpus=2, engine=FakeEngine(on_start=hold_first_trial))
    async with app.run_test(size=(80, 24)) as pilot:
        await _all_cards(pilot, app, gpus=2)
        await pilot.press("b")
        await until(pilot, entered.is_set, what="the first card trial started")
        assert app.bisect.running
        app.stop_jobs()  # what a confirmed quit (or a hang-up) does first
        release.set()
        await app.workers.wait_for_complete()
        await until(pilot, lambda: not app.bisect.running)  # the end was handled while the App still ran
    done = app.make_safe(wait_s=20)
    assert any("--device sim0,sim1 --resume" in line for line in done), done
    assert [backend.knob(f"sim{i}").current for i in range(2)] == [0, 0]


async def test_resume_with_no_rig_session_is_an_error_line_not_stopped(tmp_path, fake_rig):
    app, _backend = _app(tmp_path, gpus=2)
    async with app.run_test(size=(80, 24)) as pilot:
        await _all_cards(pilot, app, gpus=2)
        await pilot.press("u")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: not app.bisect.running and bool(app.bisect.failure))
        await until(pilot, lambda: "ERROR" in _text(app, "#bisect-status"))
        status = _text(app, "#bisect-status")
        assert "ERROR: no unfinished rig bisect" in status, status
        assert "STOPPED" not in status and "error:" not in status  # nothing was running to stop


async def test_a_refused_rig_apply_of_the_result_names_it_in_words_not_its_internal_name(tmp_path, fake_rig,
                                                                                         monkeypatch):
    from tuner.app import tuner_app
    from tuner.core.errors import NotApplied

    def refused(_backend, _profile):
        raise NotApplied("sim1 did not take the value", "check the card")

    monkeypatch.setattr(tuner_app, "plan_rig_apply", refused)
    app, backend = _app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await _all_cards(pilot, app)
        await pilot.press("b")
        await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None)
        await pilot.press("a")
        await until(pilot, lambda: any("did not take" in str(n.message) for n in app._notifications))
        [said] = [str(n.message) for n in app._notifications if "did not take" in str(n.message)]
        assert said.startswith("apply the bisect's result:") and jobs.RESULT_NAME not in said
    assert [backend.knob(f"sim{i}").current for i in range(3)] == [0, 0, 0]
