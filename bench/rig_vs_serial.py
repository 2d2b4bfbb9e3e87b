"""N simulated cards bisected at once (`tuner bisect --device all`) against one after another, with the same
answers: wall time of each, measured (not a test: it prints figures).

Each run gets a fresh state directory. "Concurrent" is one `BisectJob` of every card (one thread and one engine per
card, every card's lock held); "serial" is one `BisectJob` of one card per card in card order. Both use the real CPU
stress engine on the simulated cards unless `--engine fake` (the tests' fake engine: checks the plumbing in seconds,
times nothing meaningful). The whole-rig confirmation is timed separately: `--rig real` runs tuner.tuning.trial's
data-parallel trial after the searches; `--rig none` (default while that module is a placeholder) stops the clock
when the last card's search ends and runs no rig confirmation. The CPU engines share the host's cores, so with
more cards than cores each engine runs slower (the trials are time-bound, so the search takes as long, but each
trial compares fewer steps; a trial that compares too few is re-run longer).

Measured 2026-12-01 on the shared 2-core host (load average 6-7 from other work), real CPU engine, `--trial 10s
--confirm 20s`, `--rig none`: N=2 concurrent 252 s vs serial 364 s (1.44x); N=4 concurrent 245 s vs serial 634 s
(2.59x); same answers (-40, -55, -30, -45 mV). The searches are time-bound, so concurrency gains even with more
cards than cores; each trial then compares fewer steps (here still above the 50-step minimum).

    .venv/bin/python bench/rig_vs_serial.py [--cards 2,4] [--trial 10s] [--confirm 20s] [--engine real|fake]
                                            [--rig none|real] [--limits -52,-67,-40,-58]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.backends.simulated import SimulatedBackend
from tuner.core.durations import parse_duration_s
from tuner.tuning import trial
from tuner.tuning.events import BisectFailed, Recommendation
from tuner.tuning.job import BisectJob, BisectParams
from tuner.tuning.trial import TrialOutcome


class _Clock:
    """The moment the last card's search ended (its recommendation or failure event)."""

    def __init__(self, cards: int):
        self.left, self.t0, self.search_s = cards, time.monotonic(), None

    def __call__(self, event) -> None:
        if isinstance(event, (Recommendation, BisectFailed)) and event.device:
            self.left -= 1
            if self.left == 0:
                self.search_s = time.monotonic() - self.t0


def _fresh_state() -> None:
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="rig-bench-state-")


def _engine(kind: str):
    if kind == "real":
        return None
    from tests.tuning.fake_engine import FakeEngine

    return FakeEngine()


def run_concurrent(limits: list[int], params: BisectParams, engine: str, rig: str) -> tuple[dict, float, float]:
    _fresh_state()
    backend = SimulatedBackend(gpus=len(limits), vmin_mv=tuple(limits))
    devices = tuple(d.id for d in backend.devices())
    clock = _Clock(len(devices))
    job = BisectJob(backend, devices, params, clock, engine_factory=_engine(engine))
    if rig == "none":
        job._run_trial = _StopAfterSearch(job)  # the clock stops at the searches' end; nothing is confirmed
    outcome = job.run()
    total = time.monotonic() - clock.t0
    answers = {d: (o.recommendation.setting if o.recommendation else o.summary) for d, o in outcome.per_card.items()}
    return answers, clock.search_s or total, total


class _StopAfterSearch:
    """--rig none: a card's own trials run; the first rig call stops the job (as Ctrl-C would), so no rig trial runs
    and no card is touched by one."""

    def __init__(self, job: BisectJob):
        self.job = job

    def __call__(self, backend, settings, params, on_event, stop, **kw) -> TrialOutcome:
        if len(settings) == 1:
            return trial.run_trial(backend, settings, params, on_event, stop, **kw)
        self.job.stop()
        return TrialOutcome({}, stopped=True)


def run_serial(limits: list[int], params: BisectParams, engine: str) -> tuple[dict, float]:
    _fresh_state()
    backend = SimulatedBackend(gpus=len(limits), vmin_mv=tuple(limits))
    t0 = time.monotonic()
    answers = {}
    for device in backend.devices():
        outcome = BisectJob(backend, device.id, params, engine_factory=_engine(engine)).run().card
        answers[device.id] = outcome.recommendation.setting if outcome.recommendation else outcome.summary
    return answers, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cards", default="2,4", help="card counts to compare (default 2,4)")
    ap.add_argument("--trial", default="10s")
    ap.add_argument("--confirm", default="20s")
    ap.add_argument("--engine", choices=("real", "fake"), default="real")
    ap.add_argument("--rig", choices=("none", "real"), default="none")
    ap.add_argument("--limits", default="-52,-67,-40,-58,-45,-61,-38,-70",
                    help="hidden limits of sim0, sim1, ... (mV)")
    args = ap.parse_args()
    limits_all = [int(x) for x in args.limits.split(",")]
    params = BisectParams(trial_s=parse_duration_s(args.trial), confirm_s=parse_duration_s(args.confirm))
    print(f"engine {args.engine}, trial {args.trial}, confirm {args.confirm}, rig confirmation {args.rig}, "
          f"host cores {os.cpu_count()}")
    for n in (int(x) for x in args.cards.split(",")):
        limits = limits_all[:n]
        answers_c, search_s, total_s = run_concurrent(limits, params, args.engine, args.rig)
        answers_s, serial_s = run_serial(limits, params, args.engine)
        same = "same answers" if answers_c == answers_s else f"DIFFERENT answers: serial {answers_s}"
        rig_part = f" (+ rig confirmation: total {total_s:.0f} s)" if args.rig == "real" else ""
        print(f"N={n} limits {limits}: concurrent {search_s:.0f} s{rig_part}, serial {serial_s:.0f} s, "
              f"ratio {serial_s / search_s:.2f}x; {answers_c} {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
