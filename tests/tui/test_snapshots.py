"""Every screen at 80x24 and 120x40: simulated GPU, seeded, frozen clocks, sampler off (pre-filled history).

Update after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update` and look at the SVGs.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.polling import until
from tests.tui.helpers import make_app, rig_in_confirmation, sim_backend
from tuner.profiles import Profile, build_profile, save_profile

SIZES = [(80, 24), (120, 40)]
SCREEN_KEYS = {"dashboard": "1", "tune": "2", "bisect": "3", "profiles": "4", "doctor": "5", "help": "6"}


def _fixed_profile(backend) -> None:
    profile = build_profile("lab-card", backend.device("sim0"), backend.knob("sim0"), -45, kernel="6.8.0-sim")
    doc = profile.to_dict()
    doc["profile"]["created"] = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    doc["profile"]["tool_version"] = "0.1.0"
    save_profile(Profile.from_dict(doc))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("screen", list(SCREEN_KEYS))
def test_screen_snapshot(screen, size, snap_compare, tmp_path):
    backend = sim_backend(tmp_path)
    backend.apply("sim0", -30)
    if screen == "profiles":
        _fixed_profile(backend)
    app = make_app(tmp_path, backend=backend, samples=90)

    async def run_before(pilot):
        await pilot.press(SCREEN_KEYS[screen])
        await until(pilot, lambda: app.current_mode == screen and app.screen.is_current)
        if screen == "doctor":  # its checks run in a worker; the body replaces "running the checks"
            await until(pilot, lambda: not app.screen.query_one("#doctor-loading").display)
        if screen == "profiles":  # the list and the boot service's status are read in workers
            await until(pilot, lambda: app.screen.lists_read >= 1 and app.boot_status is not None)
        await app.workers.wait_for_complete()
        await pilot.pause()  # the workers' last messages, handled

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def _three_cards_in_a_rig_confirmation(tmp_path):
    backend = sim_backend(tmp_path, gpus=3)
    for device_id, value in (("sim0", -40), ("sim1", -50), ("sim2", -30)):  # attempt 2's settings, on the cards
        backend.apply(device_id, value)
    app = make_app(tmp_path, backend=backend, samples=90)
    app.bisect = rig_in_confirmation()
    return app


def test_multi_card_dashboard_snapshot(snap_compare, tmp_path):
    """Three cards at 80x24: a row per card (setting, power, temperature, job), the first card's panel below."""
    app = _three_cards_in_a_rig_confirmation(tmp_path)

    async def run_before(pilot):
        await until(pilot, lambda: app.current_mode == "dashboard" and bool(app.screen.query("#card-rows")))
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_all_cards_bisect_snapshot(snap_compare, tmp_path):
    """The Bisect screen's ALL CARDS target at 80x24 during the rig confirmation: a line per card, the rig
    attempts, the first card's trial table."""
    app = _three_cards_in_a_rig_confirmation(tmp_path)
    app.bisect_all = True

    async def run_before(pilot):
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect" and bool(app.screen.query("#rig-cards")))
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
