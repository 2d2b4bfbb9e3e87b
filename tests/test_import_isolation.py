"""The headless core never loads the UI toolkit, and nothing outside the engine loads torch (STYLE.md 1-2, 6)."""

import pkgutil
import shutil
import subprocess
import sys

import pytest

import tuner
import tuner.commands
from tests.cli_helpers import REPO

HEADLESS = ["tuner.cli", "tuner.models", "tuner.errors", "tuner.context", "tuner.doctor", "tuner.paths",
            "tuner.backends", "tuner.backends.simulated", "tuner.backends.amd", "tuner.backends.nvidia",
            "tuner.durations", "tuner.atomic", "tuner.stress_client", "tuner.trial", "tuner.bisect_plan",
            "tuner.bisect_job", "tuner.bisect_events", "tuner.journal", "tuner.kernel_log", "tuner.telemetry_sampler",
            "tuner.profiles", "tuner.profiles.verify", "tuner.profiles.boot", "tuner.keep_or_revert",
            "tuner.ui_state"]
OPTIONAL: list[str] = []  # modules that may not exist in every build


def _existing(names):
    import importlib.util

    return [n for n in names if importlib.util.find_spec(n) is not None]


def _loaded_after_import(modules):
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules) +
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('textual', 'torch', 'textual_plotext', 'plotext', 'rich'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_core_and_backends_import_neither_textual_nor_torch():
    commands = [f"tuner.commands.{m.name}" for m in pkgutil.iter_modules(tuner.commands.__path__)]
    loaded = _loaded_after_import(HEADLESS + _existing(OPTIONAL) + commands)
    assert not loaded, f"headless modules pulled in {sorted(loaded)}"


def test_the_ui_does_not_import_torch():
    loaded = _loaded_after_import(["tuner.app"])
    assert "textual" in loaded  # the check would be vacuous otherwise
    assert not any(m.split(".")[0] == "torch" for m in loaded)


def test_import_linter_contracts_hold():
    lint = shutil.which("lint-imports") or str(REPO / ".venv" / "bin" / "lint-imports")
    if not shutil.os.path.exists(lint):
        pytest.skip("import-linter not installed")
    proc = subprocess.run([lint], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
