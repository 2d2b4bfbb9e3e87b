"""Run the real `tuner` entry point in a subprocess, with the test's isolated environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_tuner(*args: str, env: dict | None = None, timeout: float = 120, input: str | None = None):
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO, input=input,
    )
