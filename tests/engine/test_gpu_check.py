"""bench/gpu_check.py, the prepared GPU check, runs on the CPU with tiny settings: two engine processes per preset
compared bit for bit, the reference file says so, and the report is one JSON document."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cli_helpers import REPO


def test_gpu_check_runs_on_the_cpu_and_proves_repeatability_across_processes(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--device", "cpu", "--presets",
                           "tiny", "--steps", "4", "--detection-trials", "0", "--dp-steps", "4", "--json", "--out",
                           str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc == json.loads(out.read_text()) | {"presets": doc["presets"]}
    (row,) = doc["presets"]
    assert (row["preset"], row["record_verdict"], row["replay_exit"]) == ("tiny", "pass", 0)
    assert row["repeatable"] is True and row["first_difference"] is None
    assert row["kernels"]["deterministic"] == "strict" and row["kernels"]["sdpa_backend"] == "math"
    assert row["median_tok_s"] is None or row["median_tok_s"] > 0
    # the data-parallel section: two gloo ranks, each replaying its own stock recording bit for bit
    dp = doc["data_parallel"]
    assert [(r["rank"], r["library"], r["bitwise_replay"]) for r in dp["ranks"]] == [(0, "gloo", True),
                                                                                    (1, "gloo", True)]
