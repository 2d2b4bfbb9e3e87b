"""The screen tests' shared reference: recorded once per session on a simulated card, through the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import run_tuner
from tests.screen.helpers import LOAD, state


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("ref")
    out = tmp / "A.ref"
    r = run_tuner("--simulate", "reference", "record", "--device", "sim0", "--tier", "quick", *LOAD, "--out",
                  str(out), env=state(tmp, "recorder"), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "replayed bit for bit" in r.stdout and out.exists()
    return out
