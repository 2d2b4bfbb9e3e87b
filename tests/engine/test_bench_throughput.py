"""bench/engine_throughput.py isolates the detectors: its bare loop runs under the engine's own deterministic
switches and attention kernels (checked against the engine's `start` event, not assumed), and a second bare loop
under torch's defaults gives the cost of determinism itself."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cli_helpers import REPO


def test_the_bare_loop_runs_the_engines_kernels_and_the_default_loop_torchs():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "engine_throughput.py"), "--steps", "3", "--warmup",
                           "1", "--rounds", "1", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    bare, default, engine = doc["bare"], doc["bare_default"], doc["engine"]
    assert doc["same_switches_as_engine"] is True
    assert bare["kernels"] == engine["kernels"] and bare["kernels"]["deterministic"] == "strict"
    assert bare["attention_kernels"] == engine["attention_kernels"] == default["attention_kernels"]
    assert default["kernels"]["deterministic"] == "off"
    assert doc["determinism_ratio"] > 0 and doc["ratio"] > 0
