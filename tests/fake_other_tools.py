"""A fake other tool for the tests of tuner.actions.other_tools and of every write path that asks it."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.conftest import machine_wide_exclusive
from tuner.actions import other_tools


@pytest.fixture
def fake_lactd(tmp_path, _machine_wide_processes):
    """A real process whose name (comm) is lactd: a copy of `sleep` under that name, found by the real process
    scan (psutil), as a running LACT daemon is. The whole machine sees it: no other test runs while it lives
    (tests/conftest.py, `machine_wide_exclusive`)."""
    machine_wide_exclusive(_machine_wide_processes)
    exe = tmp_path / "bin/lactd"
    exe.parent.mkdir()
    shutil.copy(shutil.which("sleep"), exe)
    proc = subprocess.Popen([str(exe), "300"])
    try:
        deadline = time.monotonic() + 30
        while not any(f.tool.name == "lactd" for f in other_tools.detect(unit_active=lambda u: False)):
            assert time.monotonic() < deadline, "the fake lactd never showed up in the process table"
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()
