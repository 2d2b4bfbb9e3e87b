"""Every screen at 80x24 and 120x40: simulated GPU, seeded, frozen clocks, sampler off (pre-filled history).

Update after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update` and look at the SVGs.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.tui.helpers import make_app, sim_backend
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
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause(0.6)

    assert snap_compare(app, terminal_size=size, run_before=run_before)
