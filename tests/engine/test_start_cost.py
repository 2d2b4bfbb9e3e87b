"""What an engine's start-up imports (every trial starts one): no sympy on the eager path. torch.autograd imports
sympy (with torch.fx's symbolic shapes) when a backward is given an explicit gradient tensor, about a second of
CPU per engine on a 2-core box (measured: `import torch` 2.8-3.6 s user, with symbolic shapes +0.8-1.0 s). This
asserts the import, not a time."""

from __future__ import annotations

import subprocess
import sys

from tests.cli_helpers import REPO

PROBE = """
import atexit, runpy, sys
atexit.register(lambda: print("sympy imported" if "sympy" in sys.modules else "no sympy", file=sys.__stderr__))
sys.argv = ["tuner.engine", "--steps", "2", "--canary-every", "1"]
runpy.run_module("tuner.engine", run_name="__main__")
"""


def test_an_eager_tiny_run_never_imports_sympy():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip().endswith("no sympy"), proc.stderr[-2000:]
