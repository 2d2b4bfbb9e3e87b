"""Screens on keys 1-6, telemetry into ring buffers, errors as notifications, quitting."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.tui.helpers import make_app, screen_text, sim_backend, until
from tuner.app.state import HISTORY_SAMPLES
from tuner.core.errors import DeviceLost
from tuner.screens.dialogs import ConfirmDialog

SCREENS = {"1": "DashboardScreen", "2": "TuneScreen", "3": "BisectScreen", "4": "ProfilesScreen",
           "5": "DoctorScreen", "6": "HelpScreen"}


async def test_number_keys_switch_screens(app):
    async with app.run_test(size=(80, 24)) as pilot:
        for key, name in [*SCREENS.items(), ("1", "DashboardScreen")]:
            await pilot.press(key)
            await pilot.pause()
            assert type(app.screen).__name__ == name


async def test_hidden_screen_stops_repainting(app):
    async with app.run_test(size=(80, 24)) as pilot:
        dashboard = app.screen
        await pilot.press("2")
        await pilot.pause()
        assert dashboard._repaint_timer._active.is_set() is False
        await pilot.press("1")
        await pilot.pause()
        assert dashboard._repaint_timer._active.is_set() is True


async def test_sampler_fills_ring_buffer(tmp_path):
    app = make_app(tmp_path, samples=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.workers.wait_for_complete()  # the first sample (on mount) ends before the test asks for more
        for _ in range(3):
            app.sample_now()
            await app.workers.wait_for_complete()
            await pilot.pause()
        history = app.histories["sim0"]
        assert len(history.time_s) >= 3 and history.time_s.maxlen == HISTORY_SAMPLES
        assert history.knob.current == 0




async def test_backend_error_is_a_notification_and_app_keeps_running(tmp_path):
    backend = sim_backend(tmp_path)

    def lost(device_id):
        raise DeviceLost("the GPU stopped answering", "reboot, then run `tuner doctor`")

    backend.telemetry = lost
    app = make_app(tmp_path, backend=backend)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.sample_now()
        await app.workers.wait_for_complete()
        await pilot.pause()
        texts = [n.message for n in app._notifications]
        assert any("stopped answering; reboot" in t for t in texts), texts
        await pilot.press("2")
        await pilot.pause()
        assert app.is_running


async def test_quit_without_jobs_exits(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert app.return_value == 0


async def test_reset_to_stock_from_tune(tmp_path, backend):
    backend.apply("sim0", -40)
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2", "r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert backend.knob("sim0").current == 0
        assert app.histories["sim0"].knob.current == 0


async def test_doctor_shows_checks_with_remedies(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("5")
        await until(pilot, lambda: "[FAIL] kernel log" in screen_text(app))
        assert "systemd-journal" in screen_text(app)


async def test_quit_asks_when_a_job_runs(app):
    class Pending:  # a PendingChange's shape, as far as the quit question reads it
        device_id, value, device_ids = "sim0", -10, ("sim0",)

    async with app.run_test(size=(80, 24)) as pilot:
        app.pending = Pending()
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("escape")  # the default is to stay
        await pilot.pause()
        assert app.is_running
        app.pending = None


def test_ui_process_never_imports_torch(tmp_path):
    """Start the App in a fresh interpreter, draw a frame on every screen, and look at sys.modules."""
    code = f"""
import asyncio, json, sys, pathlib
from tests.tui.helpers import make_app
async def main():
    app = make_app(pathlib.Path({str(tmp_path)!r}), samples=3)
    async with app.run_test(size=(80, 24)) as pilot:
        for key in "1234561":
            await pilot.press(key)
            await pilot.pause()
asyncio.run(main())
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy"))))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "torch" not in json.loads(out.stdout.strip().splitlines()[-1])


async def test_no_color_is_honoured(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(tmp_path, samples=3)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "STOCK" in str(app.screen.query_one("#setting").render()))
        assert app.no_color


async def test_command_palette_has_one_quit_the_safe_one(app):
    """Textual's own Quit exits at once, skipping the safe quit: only ours (tuner.app.palette) is offered."""
    from tuner.app.palette import entries

    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        textual_titles = [c.title for c in app.get_system_commands(app.screen)]
        ours = [e.title for e in entries(app, app.current_mode)]
        assert "Quit" not in textual_titles and ours.count("Quit (q)") == 1
        for title in ("Screen: Dashboard (1)", "Screen: Auto-bisect (3)", "Screen: Help (6)", "Tune: Apply (a)",
                      "Tune: Reset to stock (r)", "Tune: Stress on/off (s)"):
            assert title in ours


async def test_a_screen_has_one_repaint_timer_paused_while_hidden(app):
    """Textual calls every class's on_mount and the screens also called the base's: Profiles and Doctor had two
    repaint timers, one never paused while hidden."""
    async with app.run_test(size=(80, 24)) as pilot:
        for key in "123456":
            await pilot.press(key)
            await pilot.pause()
            screen = app.screen
            timers = [t for t in screen._timers if t.name == "repaint"]
            assert len(timers) == 1, (type(screen).__name__, timers)
