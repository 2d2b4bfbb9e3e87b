"""docs/tui.md: "A key whose action would only be refused now is left out of the key bar (TunerScreen.offers), and
the screen says why." The Tune screen while a bisect runs on its card: apply, reset and stress would each be
refused (the App: "a job is running on this card"), yet the key bar offered them and the screen said
`stress idle`, nothing about the bisect."""

from __future__ import annotations

import pytest

from tests.polling import until
from tests.tui.helpers import make_app, screen_text, sim_backend
from tests.tui.test_bisect import GatedEngine, _fast_form
from tuner.screens.tune import TuneScreen
from tuner.widgets.key_bar import KeyBar


@pytest.fixture(autouse=True)
def boot_id(boot):
    """A fake /proc with a known boot id (the journal records it)."""


def _keys(app) -> str:
    return " ".join(" ".join(str(line) for line in app.screen.query_one(KeyBar).lines(app.size.width)).split())


async def test_tune_offers_no_key_a_running_bisect_would_refuse_and_says_why(tmp_path):
    backend = sim_backend(tmp_path, vmin_mv=-52)
    engine = GatedEngine(hold_at=4)
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": engine, "kernel_watcher_factory": lambda _card: None})
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.screen, TuneScreen), what="the Tune screen")
        assert all(key in _keys(app) for key in ("a Apply", "r Reset to stock", "s Stress")), _keys(app)
        await pilot.press("3")
        await pilot.pause()
        _fast_form(app)
        await pilot.press("b")
        await until(pilot, engine.entered.is_set, what="the held trial")
        await pilot.press("2")
        await until(pilot, lambda: "BISECT" in screen_text(app), what="the Tune screen naming the bisect")
        keys = _keys(app)
        assert not any(key in keys for key in ("a Apply", "r Reset to stock", "s Stress")), keys
        assert "q Quit" in keys
        text = " ".join(screen_text(app).split())
        assert "BISECT trial 4" in text and "stop it on the Bisect screen (3, x)" in text, text
        await pilot.press("a", "r")  # the keys still answer, with the reason; nothing changes on the card
        await pilot.pause()
        assert app.bisect.running and app.pending is None
        engine.release.set()
        app.stop_bisect()
        await until(pilot, lambda: not app.bisect.running, what="the bisect's end")
        await until(pilot, lambda: "a Apply" in _keys(app), what="the keys back once the bisect ended")


async def test_bisect_offers_no_key_its_running_search_would_refuse(tmp_path):
    """While a bisect runs, b/u/n (one job at a time), a and v (no result yet), d (stop it before choosing another
    card) are each only refused: the key bar leaves them out and keeps x Stop; idle, every key is back."""
    backend = sim_backend(tmp_path, gpus=2, vmin_mv=-52)
    engine = GatedEngine(hold_at=4)
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": engine, "kernel_watcher_factory": lambda _card: None})
    refused = ("b Start", "u Resume", "n Restart", "a Apply result", "v Save", "d Next card")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await pilot.pause()
        assert all(key in _keys(app) for key in refused), _keys(app)
        _fast_form(app)
        await pilot.press("b")
        await until(pilot, engine.entered.is_set, what="the held trial")
        await until(pilot, lambda: "x Stop" in _keys(app) and "b Start" not in _keys(app),
                    what="the running bisect's keys")
        keys = _keys(app)
        assert not any(key in keys for key in refused), keys
        assert "RUNNING" in screen_text(app)
        engine.release.set()
        await pilot.press("x")
        await until(pilot, lambda: not app.bisect.running, what="the bisect's end")
        await until(pilot, lambda: all(key in _keys(app) for key in refused), what="every key back once it ended")
