"""Issue 24: the command palette (ctrl+p) finds every action of every screen by name from anywhere, each with its
key, as Help promises; choosing one on another screen goes there and runs it as its key would."""

from __future__ import annotations

from tests.tui.helpers import make_app, screen_text, sim_backend, until
from tuner.app.palette import entries

EVERY_SCREEN = ["Screen: Tune (2)", "Tune: -1 step (←)", "Tune: Apply (a)", "Tune: Stress on/off (s)",
                "Auto-bisect: Start (b)", "Auto-bisect: Export (e)", "Profiles: Delete (Del)",
                "Profiles: Apply at boot (install/remove) (b)", "Doctor: Run again (r)", "Quit (q)"]


async def test_the_palette_lists_every_screens_actions_with_their_keys_from_the_dashboard(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.current_mode == "dashboard")
        titles = [e.title for e in entries(app, app.current_mode)]
        for title in EVERY_SCREEN:
            assert title in titles, (title, titles)
        assert not any(t.startswith("Dashboard: Next card") for t in titles)  # one card: d does nothing
        assert len(titles) == len(set(titles))
        await pilot.press("ctrl+p")
        await pilot.press(*"delete")
        await until(pilot, lambda: "Profiles: Delete (Del)" in screen_text(app))


async def test_an_action_of_another_screen_runs_there_from_the_palette(app, backend):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+p")
        await pilot.press(*"tune -1 step")
        await until(pilot, lambda: "Tune: -1 step (←)" in screen_text(app))
        await pilot.press("down", "enter")
        await until(pilot, lambda: app.current_mode == "tune" and "target -5 mV" in screen_text(app))
    assert backend.knob("sim0").current == 0  # moved the target only: nothing applied


async def test_with_three_cards_the_card_keys_are_listed(tmp_path):
    app = make_app(tmp_path, backend=sim_backend(tmp_path, gpus=3), samples=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.current_mode == "dashboard")
        titles = [e.title for e in entries(app, app.current_mode)]
        assert "Dashboard: Next card (d)" in titles and "Auto-bisect: All cards: the next card's table (c)" in titles
