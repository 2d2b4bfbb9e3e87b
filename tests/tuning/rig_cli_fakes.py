"""`python -m tests.tuning.rig_cli_fakes ARGS...`: the real `tuner` entry point in its own process, with the fake
engine and the fake rig trial standing in for the CPU engine (so a kill -9 test takes seconds, not minutes).

RIG_FAKE_BLOCK=engine:SETTING blocks every engine run at SETTING (mV) forever; RIG_FAKE_BLOCK=rig:PHASE blocks the
rig trial of that phase (rig-baseline or rig-confirm) once every card holds its setting: the test then kills the
process with SIGKILL, as a crash would.
"""

from __future__ import annotations

import os
import sys
import time

from tests.tuning.fake_engine import FakeEngine
from tests.tuning.rig_fakes import FakeRigTrial
from tuner.tuning import trial


def _block_forever() -> None:
    while True:
        time.sleep(1)


def main() -> int:
    what, _, where = os.environ.get("RIG_FAKE_BLOCK", "").partition(":")
    engine = FakeEngine()
    fake_rig = FakeRigTrial()
    if what == "engine":
        engine.on_start = lambda req: _block_forever() if (
            not req.options.record and req.options.fault_seed == int(where)) else None
    elif what == "rig":
        fake_rig.on_start = lambda settings, params: _block_forever() if params.phase == where else None
    trial.default_engine_factory = engine
    trial.run_trial = fake_rig  # several cards at once: the fake; one card: the real trial, the fake engine
    from tuner.cli import main as tuner_main

    return tuner_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
