"""Auto-bisect versus a plain 5 mV step-down on the simulated GPU, over 20 seeds.

Runs the real state machine (`tuner.tuning.plan.BisectPlan`) against an oracle built from the simulator's own
fault model (`fault_rate_per_step`, `hangs_at`), so it takes seconds instead of days:

- a trial of T seconds runs N = T / step_s training steps; it passes with probability (1 - p)^N where p is the
  simulated per-step fault rate at that setting (drawn with a seeded RNG, so the run is repeatable);
- a setting at or below vmin - 40 mV hangs: the trial fails after the watchdog (max(60 s, 20 x step) of silence
  plus the 30 s SIGTERM grace), a hang is an edge (15 mV margin).

Wall time is computed, not measured: sum over trials of (the trial's running time + a fixed per-trial overhead
for starting the engine, applying, resetting and verifying). A passing trial runs its full length; a failing
one stops at its first fault (step ~ geometric(p)); a hang costs the watchdog time. Both baselines are one trial
long (later runs loop the bisect's reference with `--reference-loop`, so it need not be as long as the
confirmation); the step-down has no confirmation. Both use the same trial length.

"True limit" = the most aggressive 5 mV grid value at or above the card's hidden vmin (e.g. vmin -52 -> -50).

    .venv/bin/python bench/bisect_vs_stepdown.py [--seeds 20] [--trial 300] [--confirm 1800]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.backends.simulated import (
    HANG_DEPTH_MV,
    KNOB_MAX_MV,
    KNOB_MIN_MV,
    KNOB_STEP_MV,
    draw_vmin_mv,
    fault_rate_per_step,
    hangs_at,
)
from tuner.core.models import Knob, KnobKind
from tuner.tuning.plan import CONFIRM, BisectPlan, NextTrial, PlanParams, PlanResult, Recommend

STEP_S = 0.085  # the "small" preset on an R9700 (the seed's 85 ms/step)
OVERHEAD_S = 20.0  # engine start, apply + read back, reset + verify, per trial
WATCHDOG_S = 60.0 + 30.0  # min silence + SIGTERM grace


def knob() -> Knob:
    return Knob(KnobKind.VOLTAGE_OFFSET, "mV", stock=0, current=0, min=KNOB_MIN_MV, max=KNOB_MAX_MV,
                step=KNOB_STEP_MV, aggressive_direction=-1)


def true_limit(vmin_mv: int) -> int:
    return -((-vmin_mv) // 5) * 5


class Oracle:
    """One simulated trial: (passed, kind, seconds it ran)."""

    def __init__(self, vmin_mv: int, seed: int):
        self.vmin_mv, self.rng = vmin_mv, random.Random(f"bench:{seed}")

    def __call__(self, setting: int, duration_s: float) -> tuple[bool, str | None, float]:
        if hangs_at(setting, self.vmin_mv):
            return False, "hang", 3 * STEP_S + WATCHDOG_S
        p = fault_rate_per_step(setting, self.vmin_mv)
        steps = int(duration_s / STEP_S)
        if p <= 0:
            return True, None, duration_s
        first_fault = int(math.log(1 - self.rng.random()) / math.log(1 - p)) + 1 if p < 1 else 1
        if first_fault > steps:
            return True, None, duration_s
        return False, "mismatch", first_fault * STEP_S


def run_bisect(vmin_mv: int, seed: int, trial_s: float, confirm_s: float) -> dict:
    k = knob()
    plan = BisectPlan(k, PlanParams.defaults_for(k))
    oracle = Oracle(vmin_mv, seed)
    results: list[PlanResult] = []
    wall_s = search_s = 0.0
    while True:
        d = plan.decide(results)
        if not isinstance(d, NextTrial):
            break
        duration = confirm_s if d.phase == CONFIRM else trial_s
        ok, kind, ran_s = oracle(d.setting, duration)
        wall_s += ran_s + OVERHEAD_S
        if d.phase != CONFIRM:
            search_s += ran_s + OVERHEAD_S
        results.append(PlanResult(d.setting, d.phase, "pass" if ok else "fail", kind, None, kind == "hang"))
    assert isinstance(d, Recommend), d
    return {"trials": len(results), "wall_s": wall_s, "search_s": search_s, "lowest": d.confirmed,
            "recommended": d.setting, "confirms": sum(r.phase == CONFIRM for r in results)}


def run_stepdown(vmin_mv: int, seed: int, trial_s: float) -> dict:
    oracle = Oracle(vmin_mv, seed)
    wall_s, trials, last_pass = 0.0, 0, 0
    setting = 0
    while setting >= KNOB_MIN_MV:
        ok, _kind, ran_s = oracle(setting, trial_s)
        trials += 1
        wall_s += ran_s + OVERHEAD_S
        if not ok:
            break
        last_pass = setting
        setting -= 5
    return {"trials": trials, "wall_s": wall_s, "lowest": last_pass}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--trial", type=float, default=300.0, help="trial length, seconds (default 300)")
    ap.add_argument("--confirm", type=float, default=1800.0, help="confirmation length, seconds (default 1800)")
    args = ap.parse_args(argv)
    rows = []
    print(f"trial {args.trial:g} s, confirm {args.confirm:g} s, {STEP_S * 1e3:g} ms/step, {OVERHEAD_S:g} s overhead "
          f"per trial, hang at vmin - {HANG_DEPTH_MV} mV\n")
    print(f"{'seed':>4} {'vmin':>5} {'limit':>5} | {'bisect':>6} {'found':>5} {'rec':>4} {'h':>6} {'search h':>8} | "
          f"{'step':>4} {'found':>5} {'h':>6}")
    for seed in range(args.seeds):
        vmin = draw_vmin_mv(seed, 0)
        limit = true_limit(vmin)
        b = run_bisect(vmin, seed, args.trial, args.confirm)
        s = run_stepdown(vmin, seed, args.trial)
        rows.append((seed, vmin, limit, b, s))
        print(f"{seed:>4} {vmin:>5} {limit:>5} | {b['trials']:>6} {b['lowest']:>5} {b['recommended']:>4} "
              f"{b['wall_s'] / 3600:>6.2f} {b['search_s'] / 3600:>8.2f} | {s['trials']:>4} {s['lowest']:>5} "
              f"{s['wall_s'] / 3600:>6.2f}")
    bt = [r[3]["trials"] for r in rows]
    st = [r[4]["trials"] for r in rows]
    bw = [r[3]["wall_s"] for r in rows]
    bs = [r[3]["search_s"] for r in rows]
    sw = [r[4]["wall_s"] for r in rows]
    b_hit = sum(r[3]["lowest"] == r[2] for r in rows)
    s_hit = sum(r[4]["lowest"] == r[2] for r in rows)
    n = len(rows)
    print()
    print(f"trials to the recommendation: bisect mean {statistics.fmean(bt):.1f} (incl. baseline and confirm), "
          f"step-down mean {statistics.fmean(st):.1f}; ratio bisect/step-down {sum(bt) / sum(st):.2f}")
    print(f"wall time: bisect mean {statistics.fmean(bw) / 3600:.2f} h (with the {args.confirm / 60:g} min confirm; "
          f"baseline one trial long), step-down mean {statistics.fmean(sw) / 3600:.2f} h; ratio "
          f"{sum(bw) / sum(sw):.2f}")
    print(f"search only (no confirmation, like the step-down): bisect mean "
          f"{statistics.fmean(bs) / 3600:.2f} h; ratio {sum(bs) / sum(sw):.2f}")
    print(f"lands on the true limit: bisect {b_hit}/{n}, step-down {s_hit}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
