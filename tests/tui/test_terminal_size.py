"""Issue 24: below 80x24 a screen says the terminal is too small (one line) instead of a body cut anywhere; the
SIMULATED badge is never dropped, at any size; at 120x40 the Profiles table shows every column in full."""

from __future__ import annotations

import pytest

from tests.tui.helpers import make_app, open_profiles, screen_text, sim_backend, until
from tuner.profiles import build_profile, save_profile
from tuner.widgets.nav_bar import NavBar

SCREEN_KEYS = "123456"


@pytest.mark.parametrize("size", [(60, 20), (79, 24), (80, 23)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_below_80x24_every_screen_says_so_in_one_line_and_keeps_simulated(app, size):
    async with app.run_test(size=size) as pilot:
        for key in SCREEN_KEYS:
            await pilot.press(key)
            await until(pilot, lambda: "tuner needs 80x24" in screen_text(app), what=f"the notice on screen {key}")
            lines = screen_text(app).splitlines()
            assert "SIMULATED" in lines[0], lines[0]
            assert lines[1].strip() == f"terminal {size[0]}x{size[1]}: tuner needs 80x24; enlarge it (q quits)"
            assert not any(line.strip() for line in lines[2:]), "\n".join(lines)


async def test_the_screens_own_keys_do_nothing_while_it_is_too_small_and_work_again_once_enlarged(app, backend):
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: "tuner needs 80x24" in screen_text(app))
        await pilot.press("left", "left", "a")  # would apply -10 mV
        await app.workers.wait_for_complete()
        assert app.pending is None and backend.knob("sim0").current == 0
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: "tuner needs" not in screen_text(app) and "target" in screen_text(app))
        await pilot.press("left")
        await until(pilot, lambda: "target -5 mV" in screen_text(app))


async def test_q_quits_while_the_terminal_is_too_small(app):
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running)
    assert app.return_value == 0


@pytest.mark.parametrize("width", [120, 80, 60, 40, 30, 20])
@pytest.mark.parametrize("screen", ["Dashboard", "Tune", "Bisect", "Profiles", "Doctor", "Help"])
def test_the_nav_bar_never_drops_simulated(screen, width):
    line = NavBar(screen, simulated=True).build(width).plain
    assert "SIMULATED" in line[:width], (width, line)
    assert f"{screen}]" in line


def _table_row(app, name: str) -> str:
    """The table's part of the line that shows profile `name` (the detail is right of the border)."""
    tables = (line.split("│")[0] for line in screen_text(app).splitlines())
    return next((cells for cells in tables if name in cells), "")


@pytest.mark.parametrize("first", [(120, 40), (80, 24)], ids=["at-120x40", "resized-from-80x24"])
async def test_at_120x40_the_profiles_table_shows_every_column_in_full(tmp_path, first):
    backend = sim_backend(tmp_path)
    save_profile(build_profile("a-much-longer-profile-name", backend.device("sim0"), backend.knob("sim0"), -25))
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=first) as pilot:
        await open_profiles(pilot, app)
        # at 80 columns: name and setting in full, the card in the detail
        name = "a-much-longer-profile-name"
        await until(pilot, lambda: f"{name}  -25 mV" in _table_row(app, name))
        await pilot.resize_terminal(120, 40)
        await until(pilot, lambda: f"{name}  -25 mV   Simulated RDNA-class GPU [SIMULATED]" in _table_row(app, name))
