"""bench/fleet_screen.py keeps running: a small fleet through the real screen with modelled engine runs, every
host's verdict document validated; a bad card at a high rate is drained and no healthy one."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cli_helpers import REPO


def test_small_fleet():
    r = subprocess.run([sys.executable, str(REPO / "bench" / "fleet_screen.py"), "--cards", "10", "--bad", "2",
                        "--rate", "0.05", "--tiers", "quick", "--step-ms", "20", "--setup-s", "1", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)["tiers"]
    assert (row["drained_bad"], row["bad"], row["drained_healthy"]) == (2, 2, 0)
    assert row["wall_s"] >= 30
