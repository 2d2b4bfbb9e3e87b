"""bench/engine_detection.py injects faults through hooks and patched functions, which a compiled graph would not
see (a forward hook registered after torch.compile is not called): it refuses --compile with one line, and runs
its engine eager on every device, a GPU included (where the engine compiles by default)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from tests.cli_helpers import REPO

BENCH = REPO / "bench" / "engine_detection.py"


def _detection_module():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import engine_detection

        return engine_detection
    finally:
        sys.path.remove(str(REPO / "bench"))


def test_compile_with_its_injections_is_refused_with_one_line():
    proc = subprocess.run([sys.executable, str(BENCH), "--compile", "--parts", "D", "--trials", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    ours = [line for line in proc.stderr.splitlines() if line.startswith("engine_detection:")]
    assert ours == [_detection_module().COMPILE_REFUSED] and "Traceback" not in proc.stderr


def test_the_engine_it_builds_is_eager_on_a_gpu_too():
    detection = _detection_module()
    args = argparse.Namespace(seed=0)
    for device in ("cuda:0", "cpu"):
        opts = detection.detection_options(args, steps=1, device=device, preset="tiny", dtype="bf16")
        opts.validate()
        assert opts.compile is False
        assert not opts.compile_enabled("cuda" if device.startswith("cuda") else device)


def test_part_d_still_runs_eager_on_the_cpu():
    proc = subprocess.run([sys.executable, str(BENCH), "--parts", "D", "--trials", "1", "--dtypes", "fp32",
                           "--max-site-step", "2", "--site-horizon", "1", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {s["site"] for s in doc["sites"]} == set(_detection_module().SITES)
    assert not [line for line in proc.stderr.splitlines() if line.startswith("engine_detection:")]  # CPU: no note
