"""Issue 24: notices (toasts) never cover the key bar, say their kind in words, go when you switch screens, and a
job that fails says so once (it was said twice: a BackendFailed from the worker and the job's end)."""

from __future__ import annotations

from tests.tui.helpers import make_app, open_profiles, screen_text, sim_backend, until
from tuner.tuning.job import BisectParams
from tuner.widgets.key_bar import KeyBar


def _errors(app) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "error"]


def _saying(app, words: str) -> list[str]:
    return [n.message for n in app._notifications if words in n.message]


async def test_a_refused_bisect_start_is_one_error_notice(app, backend):
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.start_bisect(("sim0",), BisectParams(floor=-10_000))
        await until(pilot, lambda: not app.bisect.running and _errors(app))
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert len(_saying(app, "outside this card's range")) == 1, list(app._notifications)
        assert _errors(app) == _saying(app, "outside this card's range")
    assert backend.knob("sim0").current == 0


async def test_a_stress_run_that_cannot_start_is_one_error_notice(tmp_path):
    backend = sim_backend(tmp_path)

    def broken(device_id):
        raise RuntimeError("no stress target")

    backend.stress_target = broken
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("2", "s")
        await until(pilot, lambda: not app.stress.running and _errors(app))
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert len(_saying(app, "no stress target")) == 1, list(app._notifications)
        assert _errors(app) == _saying(app, "no stress target")


async def test_a_notice_sits_above_the_key_bar_and_says_its_kind_in_words(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(tmp_path, samples=1)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("3")  # the busiest key bar: two lines at 80 columns
        await until(pilot, lambda: len(app.screen.query_one(KeyBar).plain.splitlines()) == 2)
        app.notify("something went wrong, here is how to fix it", severity="error", timeout=30)
        await until(pilot, lambda: bool(app.screen.query("Toast")))
        await pilot.pause()
        toast, bar = app.screen.query_one("Toast"), app.screen.query_one(KeyBar)
        assert toast.region.bottom <= bar.region.y, (toast.region, bar.region)
        assert "ERROR" in screen_text(app)
        footer = screen_text(app).splitlines()[-2:]
        assert all("something went wrong" not in line for line in footer)
        assert "q Quit" in "\n".join(footer)


async def test_notices_do_not_follow_you_to_another_screen(app):
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await open_profiles(pilot, app)
        app.notify("about the Profiles screen", timeout=30)
        await until(pilot, lambda: "about the Profiles screen" in screen_text(app))
        await pilot.press("1")
        await until(pilot, lambda: type(app.screen).__name__ == "DashboardScreen")
        await pilot.pause()
        assert not list(app._notifications)
        assert "about the Profiles screen" not in screen_text(app)


async def test_text_in_brackets_is_shown_as_it_is(app):
    """A notice is never markup: a card's `[SIMULATED]` or a path's `[b]` was eaten as a style tag."""
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await open_profiles(pilot, app)
        app.notify("on card-x [SIMULATED]: exported to /tmp/[b]/r.csv", timeout=30)
        await until(pilot, lambda: "card-x [SIMULATED]: exported to /tmp/[b]/r.csv" in screen_text(app))
