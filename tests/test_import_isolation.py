"""The headless core never loads the UI toolkit, and nothing outside the engine loads torch (STYLE.md 1-2, 6).

The package lists come from the import-linter contracts in pyproject.toml, so a module added to any of those
packages is covered the day it is written, and the list is kept in one place.
"""

import importlib
import pkgutil
import shutil
import subprocess
import sys
import tomllib

import pytest

from tests.cli_helpers import REPO


def _contract(contract_id: str) -> dict:
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    return next(c for c in doc["tool"]["importlinter"]["contracts"] if c.get("id") == contract_id)


def _modules_under(packages: list[str]) -> list[str]:
    """Every module of these packages (walked from disk, not listed by hand)."""
    found = []
    for name in packages:
        found.append(name)
        module = importlib.import_module(name)
        if hasattr(module, "__path__"):
            found += [m.name for m in pkgutil.walk_packages(module.__path__, prefix=f"{name}.")]
    return found


def _loaded_after_import(modules):
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules) +
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('textual', 'torch', 'textual_plotext', 'plotext', 'rich'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_the_headless_packages_cover_every_module_outside_the_ui_and_the_engine():
    """A new top-level module (outside every named package) would escape the contracts: none may exist."""
    import tuner

    headless = set(_contract("headless")["source_modules"])
    allowed_elsewhere = {"tuner.cli", "tuner.app", "tuner.screens", "tuner.widgets", "tuner.engine",
                         "tuner.__main__"}
    top = {f"tuner.{m.name}" for m in pkgutil.iter_modules(tuner.__path__)}
    assert top - headless - allowed_elsewhere == set()


def test_core_and_backends_import_neither_textual_nor_torch():
    modules = _modules_under(_contract("headless")["source_modules"])
    assert len(modules) > 40  # the walk found the core, not an empty list
    loaded = _loaded_after_import([*modules, "tuner.cli"])
    assert not loaded, f"headless modules pulled in {sorted(loaded)}"


def test_the_ui_does_not_import_torch():
    ui = [p for p in _contract("no-torch")["source_modules"] if p in ("tuner.app", "tuner.screens", "tuner.widgets")]
    loaded = _loaded_after_import(_modules_under(ui))
    assert "textual" in loaded  # the check would be vacuous otherwise
    assert not any(m.split(".")[0] == "torch" for m in loaded)


def test_import_linter_contracts_hold():
    lint = shutil.which("lint-imports") or str(REPO / ".venv" / "bin" / "lint-imports")
    if not shutil.os.path.exists(lint):
        pytest.skip("import-linter not installed")
    proc = subprocess.run([lint], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_root_helper_loads_only_core_the_backends_and_the_rules_it_rechecks():
    """What runs as root stays small: its modules, the backends and core; of the tuning only the kernel-log line
    classifier (the `helper` contract in pyproject.toml says the same statically)."""
    helper = _modules_under(["tuner.helper"])
    assert "tuner.helper.cli" in helper and "tuner.helper.server" in helper
    code = ("import sys\n" + "".join(f"import {m}\n" for m in helper if not m.endswith("__main__")) +
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('tuner', 'torch', 'textual'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    allowed = ("tuner.core", "tuner.backends", "tuner.helper", "tuner.tuning.kernel_log")
    assert {m for m in loaded if m not in ("tuner", "tuner.tuning") and not m.startswith(allowed)} == set()
    assert "tuner.tuning.kernel_log" in loaded  # the check would be vacuous if nothing of the tuning were seen
