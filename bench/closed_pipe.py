"""`tuner ... | head -1` 30 times for each of status, list, profile list and report: how often each exit code and
any stderr output occur (issue 24: no traceback, exit 0 or 141). Run: .venv/bin/python bench/closed_pipe.py"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_closed_pipe import COMMANDS, head_one


def main(rounds: int = 30) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(XDG_STATE_HOME=f"{tmp}/state", XDG_CONFIG_HOME=f"{tmp}/config")
        from tuner.backends.simulated import SimulatedBackend
        from tuner.profiles.store import read_profile_file, save_profile
        from tuner.tuning import journal

        journal.Journal.create("sim0", params={}, knob={}, backend=SimulatedBackend(state_path=Path(tmp) / "sim"))
        save_profile(read_profile_file(Path(__file__).resolve().parent.parent / "tests/profiles/data/v1-sim.toml"))
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        for name, args in COMMANDS.items():
            codes: collections.Counter[str] = collections.Counter()
            noisy = 0
            for _ in range(rounds):
                proc = head_one(args.format(tmp=tmp), env)
                codes[proc.stdout.strip()] += 1
                noisy += bool(proc.stderr)
            print(f"{name:13s} {rounds} runs: {dict(sorted(codes.items()))}, with stderr output: {noisy}")


if __name__ == "__main__":
    main()
