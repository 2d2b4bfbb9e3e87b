"""Code another account can run: for the tests that drop to a throwaway uid for real (`setpriv`).

The dropped account needs an interpreter it may run and a `tuner` package (with this venv's packages) it may
read. A venv built on a Python under /root gives it neither; a checkout in a mode-0700 directory (`mktemp -d`, a
home directory) gives it no `tuner`. Then the checkout's `tuner/` and `tests/` and the venv's site-packages are
mirrored once per test process into a world-readable directory under /tmp, as hard links (no data copied; a copy
only where a link cannot cross file systems). The mirror is removed when the process ends.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pytest

from tests.cli_helpers import REPO

_SITE_PACKAGES = [p for p in sys.path if p.endswith("site-packages")]


def reachable_by_others(path: str | Path, *, run: bool = False) -> bool:
    """Whether any account may reach `path` (every directory above it searchable) and read it (or run it). A
    directory must be listable too: Python's import lists it, and finds nothing in one it cannot list."""
    real = Path(os.path.realpath(path))
    need = 0o001 if run else 0o005 if real.is_dir() else 0o004
    return all(p.stat().st_mode & 0o001 for p in real.parents) and bool(real.stat().st_mode & need)


def runnable_by_others(executable: str) -> bool:
    return reachable_by_others(executable, run=True)


def python_for_others() -> list[str]:
    """An interpreter the test accounts may run (with `pythonpath_for_others()`): the venv's own, or the system's
    of the same version (a venv built on a Python under /root is closed to them)."""
    if runnable_by_others(sys.executable):
        return [sys.executable]
    system = Path("/usr/bin/python3")
    if system.exists() and runnable_by_others(str(system)):
        version = subprocess.run([str(system), "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True).stdout.strip()
        if version == str(sys.version_info[:2]):
            return [str(system)]
    pytest.skip("no interpreter of this Python version that other accounts may run")


def _link_tree(source: Path, destination: Path) -> None:
    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:  # another file system (EXDEV): a copy, the same bytes
            shutil.copy2(src, dst)

    # __pycache__ too: a hard link keeps the source's mtime and size, so the compiled files stay valid; without
    # them every process of another account compiled what it imported from source (`import torch, textual.app`
    # as uid 65534: 5.7 CPU-seconds instead of 2.8)
    shutil.copytree(source, destination, symlinks=True, copy_function=link_or_copy)


@cache
def _code() -> tuple[Path, tuple[str, ...]]:
    if reachable_by_others(REPO / "tuner" / "__init__.py") and all(reachable_by_others(p) for p in _SITE_PACKAGES):
        return REPO, (str(REPO), *_SITE_PACKAGES)
    mirror = Path(tempfile.mkdtemp(prefix="tunertest-code-", dir="/tmp"))
    atexit.register(shutil.rmtree, mirror, True)
    mirror.chmod(0o755)
    for package in ("tuner", "tests"):
        _link_tree(REPO / package, mirror / "repo" / package)
    paths = [str(mirror / "repo")]
    for n, site in enumerate(_SITE_PACKAGES):
        _link_tree(Path(site), mirror / f"site{n}")
        paths.append(str(mirror / f"site{n}"))
    for directory, _dirs, _files in os.walk(mirror):  # the copy's directories keep the source's modes
        os.chmod(directory, os.stat(directory).st_mode | 0o555)
    return mirror / "repo", tuple(paths)


def code_for_others() -> Path:
    """A directory another account may use as its working directory, with `tuner` and `tests` in it."""
    return _code()[0]


def pythonpath_for_others() -> str:
    """PYTHONPATH for another account: the checkout (or its mirror) and this venv's packages."""
    return os.pathsep.join(_code()[1])
