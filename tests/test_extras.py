"""torch is the `engine` extra (issue 23): the base requirements hold no torch, and the engine names the extra
when torch is missing."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_base_requirements_hold_no_torch_and_the_engine_extra_does():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [req.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
             for req in project["dependencies"]]
    assert "torch" not in names and "rustbpe" not in names and "tiktoken" not in names
    assert any(r.startswith("nvidia-ml-py>=12.555") for r in project["dependencies"])
    engine = [r.split(">")[0] for r in project["optional-dependencies"]["engine"]]
    assert engine == ["torch", "rustbpe", "tiktoken"]


def test_the_engine_names_the_missing_extra(tmp_path):
    """A `torch` package that cannot be found: a sitecustomize hides it from the engine's interpreter."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nclass _Hide:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n            raise ModuleNotFoundError('hidden')\n        return None\n"
        "sys.meta_path.insert(0, _Hide())\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}
    proc = subprocess.run([sys.executable, "-m", "tuner.engine", "--steps", "1"], capture_output=True, text=True,
                          env=env, timeout=120, cwd=REPO)
    assert proc.returncode == 4, proc.stderr
    assert "undervolt-tuner[engine]" in proc.stderr and "Traceback" not in proc.stderr
    assert '"kind":"usage"' in proc.stdout and '"exit_code":4' in proc.stdout
