"""A bisect through the helper with the fake engine (tests/tuning/fake_engine.py), run as a test account: the
tuner's own BisectJob and HelperBackend, only the engine is the fake (fast and deterministic; it hangs where the
simulated card says it hangs). `python -m tests.helper.bisect_as_user SOCKET STEP RESOLUTION` prints one JSON
line: the exit code, the settings the engine was asked to run and this user's own unsafe list."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.tuning.fake_engine import FakeEngine
from tuner.backends.helper_client import HelperBackend
from tuner.tuning import journal
from tuner.tuning.job import BisectJob, BisectParams

if __name__ == "__main__":
    socket_path, step, resolution = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    backend = HelperBackend.connect(socket_path, client="test bisect")
    engine = FakeEngine()
    params = BisectParams(trial_s=1, confirm_s=2, step=step, resolution=resolution, restart=len(sys.argv) > 4)
    try:
        outcome = BisectJob(backend, "sim0", params, lambda event: None, engine_factory=engine).run().card
    finally:
        backend.close()
    print(json.dumps({"exit_code": outcome.exit_code, "tried": [r.options.fault_seed for r in engine.requests],
                      "own_unsafe": sorted({e["setting"] for e in journal.unsafe_entries("sim0")})}))
