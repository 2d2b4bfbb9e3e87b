"""Tune: apply opens a keep-or-revert dialog whose default is Revert; the backend is what we check."""

from __future__ import annotations

from tests.tui.helpers import until
from tuner.screens.dialogs import ConfirmDialog, KeepOrRevertDialog


async def _apply_minus_20(app, pilot):
    await pilot.press("2")
    await pilot.pause()
    await pilot.press("left", "left", "pagedown")  # 0 -> -5 -> -10 -> -35
    await pilot.press("right", "right", "right")  # -> -20
    await pilot.press("a")
    await app.workers.wait_for_complete()
    await pilot.pause()
    assert isinstance(app.screen, KeepOrRevertDialog)


async def test_apply_then_timeout_reverts(app, backend, clock):
    async with app.run_test(size=(80, 24)) as pilot:
        await _apply_minus_20(app, pilot)
        assert backend.knob("sim0").current == -20  # applied and read back, but not confirmed
        clock.advance(14.0)
        # the countdown has ticked on the advanced clock (its line says 1 s left) and has not reverted: not yet
        await until(pilot, lambda: "Reverting in 1 s" in str(app.screen.query_one("#countdown").render()),
                    what="the countdown's tick at 14 s")
        assert isinstance(app.screen, KeepOrRevertDialog) and backend.knob("sim0").current == -20
        clock.advance(1.5)
        await until(pilot, lambda: not isinstance(app.screen, KeepOrRevertDialog) and app.pending is None
                    and backend.knob("sim0").current == 0, what="the revert at 15 s")
        await app.workers.wait_for_complete()
        assert backend.knob("sim0").current == 0
        assert app.pending is None


async def test_apply_then_keep(app, backend):
    async with app.run_test(size=(80, 24)) as pilot:
        await _apply_minus_20(app, pilot)
        await pilot.press("k")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert backend.knob("sim0").current == -20
        assert app.histories["sim0"].knob.current == -20


async def test_enter_chooses_revert(app, backend):
    async with app.run_test(size=(80, 24)) as pilot:
        await _apply_minus_20(app, pilot)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert backend.knob("sim0").current == 0


async def test_ui_never_offers_an_overvolt(app, backend):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2", "right", "pageup", "a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert not isinstance(app.screen, KeepOrRevertDialog)
        assert backend.knob("sim0").current == 0


async def test_quit_with_unconfirmed_setting_reverts_it(app, backend):
    async with app.run_test(size=(80, 24)) as pilot:
        await _apply_minus_20(app, pilot)
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await pilot.pause()
    assert backend.knob("sim0").current == -20  # the App has stopped; run_app now makes the card safe
    done = app.make_safe()
    assert backend.knob("sim0").current == 0, done


async def test_a_revert_that_went_to_stock_says_why(app, backend):
    """Another tool left the card at an off-grid -7 mV: the revert cannot write it back and resets to stock. The
    CLI said why; the UI said only "reverted, now +0 mV", as if the card had been at stock before."""
    backend._write_setting("sim0", -7)  # not a tuner write: off the 5 mV grid
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.apply_setting("sim0", -20)
        await until(pilot, lambda: isinstance(app.screen, KeepOrRevertDialog), what="the keep-or-revert dialog")
        await pilot.press("enter")  # Revert
        await until(pilot, lambda: any("now +0 mV" in n.message for n in app._notifications), what="the revert")
        [said] = [n.message for n in app._notifications if "now +0 mV" in n.message]
        assert said.startswith("sim0: reverted (the previous value -7 mV could not be written back"), said
        assert "reset to stock instead" in said and backend.knob("sim0").current == 0


async def test_the_countdown_reverts_while_the_palette_is_open(app, backend, clock):
    """ctrl+p opens the command palette over the keep-or-revert dialog; the countdown ticked only while its dialog
    was on top, so with the palette left open the unconfirmed setting stayed on the card past its 15 s (and from
    the palette another screen could be chosen, leaving the dialog hidden on the Tune screen's stack)."""
    from textual.command import CommandPalette

    async with app.run_test(size=(80, 24)) as pilot:
        await _apply_minus_20(app, pilot)
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette), what="the palette")
        clock.advance(15.5)
        await until(pilot, lambda: app.pending is None and backend.knob("sim0").current == 0,
                    what="the revert at 15 s")
        await pilot.press("escape")  # the palette closes, and the answered dialog with it
        await until(pilot, lambda: type(app.screen).__name__ == "TuneScreen", what="the Tune screen again")



async def test_a_second_cards_apply_before_the_first_is_announced_does_not_orphan_the_first(tmp_path):
    """`a` on two cards before the first apply's worker is heard back from (sim0 from the Tune screen, then `d` and
    sim1): apply_setting refused only a change already announced (`pending`), so both were applied, and the second
    announced change took `pending`'s place over the first. The first, unconfirmed, was then in no list: its
    dialog's answer (or countdown) settled nothing, quitting did not revert it, and it stayed on the card."""
    from tests.tui.helpers import make_app, sim_backend

    backend = sim_backend(tmp_path, gpus=2)
    app = make_app(tmp_path, backend=backend, samples=0)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.apply_setting("sim0", -10)
        app.apply_setting("sim1", -10)  # before the first's worker posted ChangeApplied
        await app.workers.wait_for_complete()
        for _ in range(2):  # answer every keep-or-revert dialog there is: revert
            await pilot.pause()
            if isinstance(app.screen, KeepOrRevertDialog):
                await pilot.press("escape")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: not isinstance(app.screen, KeepOrRevertDialog), what="no dialog left")
        await app.workers.wait_for_complete()
        unconfirmed = [c.device_ids for c in app._unconfirmed_changes()]
        knobs = {d: backend.knob(d).current for d in ("sim0", "sim1")}
        assert knobs == {"sim0": 0, "sim1": 0} or unconfirmed, f"left on the cards, in no list: {knobs}"
        assert not unconfirmed
        said = [n.message for n in app._notifications if "already waiting for keep-or-revert" in n.message]
        assert len(said) == 1 and "apply -10 on sim1" in said[0], said


async def test_the_kept_callback_belongs_to_the_change_that_was_applied_not_to_a_refused_second_apply(app, backend,
                                                                                                     monkeypatch):
    """The Bisect screen applies its result with an `on_kept` (offer to save it as a profile). A second apply asked
    for before the first was announced is refused in its worker (one change at a time), but it had already set the
    App's `_on_kept` to its own (here none): keeping the first change then offered nothing."""
    import threading

    entered, release = threading.Event(), threading.Event()
    real_apply = type(backend).apply

    def held_apply(self, device_id, value, **kw):
        if value == -20:  # the first apply: held inside its write, under the App's write lock
            entered.set()
            release.wait(20)
        return real_apply(self, device_id, value, **kw)

    monkeypatch.setattr(type(backend), "apply", held_apply)
    kept: list[str] = []
    async with app.run_test(size=(80, 24)) as pilot:
        app.apply_setting("sim0", -20, on_kept=lambda: kept.append("first"))
        await until(pilot, entered.is_set, what="the first apply inside its write")
        app.apply_setting("sim0", -30)  # no keep-or-revert is announced yet: refused in its worker, later
        release.set()
        await until(pilot, lambda: isinstance(app.screen, KeepOrRevertDialog), what="the first change's dialog")
        await app.workers.wait_for_complete()
        assert backend.knob("sim0").current == -20  # the second apply was refused
        await pilot.press("k")
        await until(pilot, lambda: not isinstance(app.screen, KeepOrRevertDialog) and app.pending is None,
                    what="the dialog answered")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: bool(kept) or app.histories["sim0"].knob.current == -20, what="the keep settled")
        assert backend.knob("sim0").current == -20 and kept == ["first"]


async def test_the_key_bar_under_keep_or_revert_says_the_dialogs_keys_not_the_screens(app, backend):
    """With the dialog open, the bottom line still showed the Tune screen's keys, `r Reset to stock` among them,
    where `r` means Revert in the dialog: the bar a user reads must be the dialog's."""
    from tests.tui.helpers import screen_text

    async with app.run_test(size=(80, 24)) as pilot:
        await _apply_minus_20(app, pilot)
        await until(pilot, lambda: "Reverting in" in screen_text(app), what="the dialog drawn")
        bottom = "\n".join(screen_text(app).splitlines()[-3:])  # the screen's own bar takes two lines at 80
        assert "Reset to stock" not in bottom and "r Revert" in bottom and "k Keep" in bottom, bottom
