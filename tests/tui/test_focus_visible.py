"""Issue 24: which field has focus is seen without colour (NO_COLOR), on every screen's forms: a framed field's
frame turns heavy, a one-line field is reversed while focused (underlined otherwise), a table's cursor row is
reversed while the table has focus."""

from __future__ import annotations

from textual.widgets import Input

from tests.tui.helpers import make_app, open_profiles, screen_text, until
from tuner.profiles import build_profile, save_profile
from tuner.screens.dialogs import TextInputDialog


def _styles(app, widget) -> list:
    """The text styles of what `widget` shows on the screen now (colour dropped: only what NO_COLOR keeps)."""
    region = widget.region
    strips = app.screen._compositor.render_strips()
    styles = []
    for y in range(region.y, region.bottom):
        for segment in strips[y].crop(region.x, region.right):
            if segment.style is not None and segment.text.strip():
                styles.append(segment.style)
    return styles


async def test_a_focused_one_line_field_is_reversed_and_the_others_underlined(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(tmp_path, samples=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")  # the Tune screen: a form's fields, as any screen would lay them out
        await until(pilot, lambda: "target" in screen_text(app))
        first, second = Input(value="10", compact=True), Input(value="20", compact=True)
        await app.screen.query_one("#screen-body").mount(first, second, before=0)
        first.focus()
        await until(pilot, lambda: first.has_focus)
        await pilot.pause()
        assert app.no_color
        assert any(s.reverse for s in _styles(app, first))
        assert all(s.underline and not s.reverse for s in _styles(app, second))
        second.focus()
        await until(pilot, lambda: second.has_focus)
        await pilot.pause()
        assert any(s.reverse for s in _styles(app, second))
        assert not any(s.reverse for s in _styles(app, first))


async def test_a_focused_framed_field_has_a_heavy_frame(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("NO_COLOR", "1")
    save_profile(build_profile("mine", backend.device("sim0"), backend.knob("sim0"), -40))
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: "mine" in screen_text(app))
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog))
        field = app.screen.query_one(Input)
        await until(pilot, lambda: field.has_focus)
        await pilot.pause()
        assert "┏" in screen_text(app) and "┗" in screen_text(app)  # the heavy frame: not a colour
        await pilot.press("tab")  # the OK button takes focus: the field's frame is light again
        await until(pilot, lambda: not field.has_focus)
        await pilot.pause()
        assert "┏" not in screen_text(app)
        await pilot.press("escape")


async def test_the_focused_tables_cursor_row_is_reversed_under_no_color(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("NO_COLOR", "1")
    save_profile(build_profile("mine", backend.device("sim0"), backend.knob("sim0"), -40))
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: "mine" in screen_text(app))
        table = app.screen.query_one("#profiles-table")
        await until(pilot, lambda: table.has_focus)
        await pilot.pause()
        row = table.region
        strips = app.screen._compositor.render_strips()
        cursor = [s.style for s in strips[row.y + 1].crop(row.x, row.right) if s.text.strip()]  # under the header
        assert cursor and all(style.reverse for style in cursor)
