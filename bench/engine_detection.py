"""Which detector catches a single bit flip, and how fast: seeded flips against the tiny preset on the CPU.

Part A, the training computation (the default 200 trials): for each trial a seeded RNG picks a step in
[1, --max-flip-step], a target (a weight element of any parameter, uniform over elements, persistent; or an
element of one Linear layer's output during that step's forward, layers weighted by width), and a bit in
0..31 (fp32). The model is reset to its initial state, trained with the flip, and observed for --horizon steps
after it. For each detector we record the first step it would fire, with every detector observing (none stops
the run):
  - non-finite alone: the raw loss or gradient norm is NaN/Inf;
  - canary alone: the canary replay (frozen initial weights, fixed batch) every --canary-every steps;
  - reference trajectory: the step's (loss bits, grad-norm bits) differ from a clean run's;
  - soft signals (warning only): a loss or gradient-norm spike.
Part B, flips in the canary's own computation (--canary-trials): half in the canary's frozen weights
(persistent), half in its activations (transient, one replay): caught by the canary at that replay?
Part C, flips in a GEMM check's output (--gemm-trials): caught by the bitwise comparison?

    python bench/engine_detection.py [--trials 200] [--horizon 30] [--max-flip-step 20] [--seed 0]

Takes about three minutes on two CPU cores. Prints fractions and median steps from flip to detection.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import warnings
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from tuner.engine.detectors import NonFiniteDetector, SoftSignals
from tuner.engine.faults import FaultInjector, flip_bit_
from tuner.engine.optim import build_optimizers
from tuner.engine.options import EngineOptions
from tuner.engine.protocol import Emitter
from tuner.engine.reference import step_digest
from tuner.engine.runner import Engine


def quiet(_msg: str) -> None:
    pass


def reset(engine: Engine) -> None:
    engine.model.load_state_dict(engine.initial_state)
    engine.muon, engine.adam = build_optimizers(engine.model)


def part_a(engine: Engine, args, clean: list[str]) -> list[dict]:
    params = list(engine.model.named_parameters())
    modules = engine.model.linear_modules()
    by_name = dict(modules)
    out = []
    for trial in range(args.trials):
        rng = random.Random(f"engine-detection:{args.seed}:{trial}")
        flip_step = rng.randint(1, args.max_flip_step)
        target = rng.choice(("weight", "activation"))
        bit = rng.randrange(32)
        reset(engine)
        injector = FaultInjector(log=quiet)
        nonfinite, soft = NonFiniteDetector(), SoftSignals(min_history=10)
        first = {"nonfinite": None, "canary": None, "reference": None, "loss_gn": None, "soft": None}
        where = ""
        for step in range(1, flip_step + args.horizon + 1):
            if step == flip_step:
                if target == "weight":
                    name, p = FaultInjector._pick_weighted(params, rng)
                    rec = injector.flip_weight(p, name, rng.randrange(p.numel()), bit, step=step, source="bench")
                    where = f"{name}[{rec.index}]"
                else:
                    name, _ = FaultInjector._pick_weighted([(n, m.weight[:, 0]) for n, m in modules], rng)
                    injector.arm_activation(by_name[name], name, rng, step=step, source="bench", bit=bit)
                    where = f"{name}.output"
            r = engine.train_step(step)
            injector.disarm()
            if step < flip_step:
                continue
            if first["nonfinite"] is None and nonfinite.check(r.loss, r.grad_norm) is not None:
                first["nonfinite"] = step
            got = step_digest(r.loss, r.grad_norm, r.param_sum)
            if first["reference"] is None and got != clean[step - 1]:
                first["reference"] = step
            if first["loss_gn"] is None and got[:16] != clean[step - 1][:16]:
                first["loss_gn"] = step
            if first["soft"] is None and soft.observe(step, r.loss, r.grad_norm, None, steady=False):
                first["soft"] = step
            if (step % args.canary_every == 0 and first["canary"] is None
                    and engine.canary.check(engine.canary.measure()) is not None):
                first["canary"] = step
            if first["nonfinite"] is not None and first["reference"] is not None and first["loss_gn"] is not None:
                break  # non-finite stays non-finite; nothing more to learn
        out.append({"trial": trial, "step": flip_step, "target": target, "bit": bit, "where": where, **first})
    return out


def part_b(engine: Engine, trials: int, seed: int) -> list[dict]:
    canary = engine.canary
    params = list(canary.model.named_parameters())
    modules = canary.model.linear_modules()
    by_name = dict(modules)
    out = []
    for trial in range(trials):
        rng = random.Random(f"engine-detection-canary:{seed}:{trial}")
        target = "weight" if trial % 2 == 0 else "activation"
        bit = rng.randrange(32)
        injector = FaultInjector(log=quiet)
        if target == "weight":
            name, p = FaultInjector._pick_weighted(params, rng)
            index = rng.randrange(p.numel())
            flip_bit_(p.data, index, bit)
            caught = canary.check(canary.measure()) is not None
            flip_bit_(p.data, index, bit)  # undo: the next trial starts clean
        else:
            name, _ = FaultInjector._pick_weighted([(n, m.weight[:, 0]) for n, m in modules], rng)
            injector.arm_activation(by_name[name], name, rng, step=None, source="bench", bit=bit)
            caught = canary.check(canary.measure()) is not None
            injector.disarm()
        out.append({"target": target, "bit": bit, "caught": caught})
    assert canary.check(canary.measure()) is None, "canary state leaked between trials"
    return out


def part_c(engine: Engine, trials: int, seed: int) -> int:
    caught = 0
    for trial in range(trials):
        rng = random.Random(f"engine-detection-gemm:{seed}:{trial}")
        outputs = engine.gemm.compute()
        out = outputs[rng.randrange(len(outputs))]
        flip_bit_(out, rng.randrange(out.numel()), rng.randrange(32))
        caught += engine.gemm.compare(outputs) is not None
    return caught


def pct(n: int, d: int) -> str:
    return f"{n:>3}/{d} ({100 * n / d:5.1f} %)"


def latency(rows: list[dict], key: str) -> str:
    lat = [r[key] - r["step"] for r in rows if r[key] is not None]
    if not lat:
        return "n/a"
    return f"median {statistics.median(lat):g} steps (max {max(lat)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--horizon", type=int, default=30, help="steps observed after the flip (default 30)")
    ap.add_argument("--max-flip-step", type=int, default=20)
    ap.add_argument("--canary-every", type=int, default=10)
    ap.add_argument("--canary-trials", type=int, default=200)
    ap.add_argument("--gemm-trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.monotonic()
    engine = Engine(EngineOptions(steps=1, canary_every=0, canary_every_s=0, seed=args.seed), Emitter(),
                    log=quiet)
    engine.setup()
    reset(engine)
    clean = [step_digest(r.loss, r.grad_norm, r.param_sum) for r in
             (engine.train_step(s) for s in range(1, args.max_flip_step + args.horizon + 1))]
    rows = part_a(engine, args, clean)
    n = len(rows)
    print(f"Part A: {n} single-bit flips in the training computation (tiny preset, fp32, {engine.spec.name}); "
          f"flip at a step in 1..{args.max_flip_step}, observed {args.horizon} steps after; canary every "
          f"{args.canary_every} steps")
    for label, key in (("non-finite alone", "nonfinite"), ("canary alone", "canary"),
                       ("reference: loss+grad bits", "loss_gn"), ("reference trajectory", "reference"),
                       ("soft signals (warning)", "soft")):
        caught = sum(r[key] is not None for r in rows)
        print(f"  {label:<24} {pct(caught, n)}   {latency(rows, key)}")
    same_step = sum(r["reference"] == r["step"] for r in rows)
    print(f"  reference trajectory on the flip's own step: {pct(same_step, n)}   (\"reference: loss+grad bits\" "
          "compares only the raw loss and gradient-norm bits; the engine also compares a bit checksum of every "
          "parameter after each update)")
    for target in ("weight", "activation"):
        sub = [r for r in rows if r["target"] == target]
        print(f"  {target:<10} flips: reference {pct(sum(r['reference'] is not None for r in sub), len(sub))}, "
              f"non-finite {pct(sum(r['nonfinite'] is not None for r in sub), len(sub))}")
    missed = [r for r in rows if r["reference"] is None]
    if missed:
        by_bit = Counter("exponent/sign" if r["bit"] >= 23 else "mantissa" for r in missed)
        print(f"  missed by the reference within the horizon ({len(missed)}): {dict(by_bit)}; e.g. " +
              "; ".join(f"{r['where']} bit {r['bit']}" for r in missed[:4]))
    b = part_b(engine, args.canary_trials, args.seed)
    for target in ("weight", "activation"):
        sub = [r for r in b if r["target"] == target]
        print(f"Part B: flip in the canary's own {target + 's':<11}: caught by the canary at that replay "
              f"{pct(sum(r['caught'] for r in sub), len(sub))}")
    c = part_c(engine, args.gemm_trials, args.seed)
    print(f"Part C: flip in a GEMM check's output ({engine.gemm.n}x{engine.gemm.n} fp32): caught "
          f"{pct(c, args.gemm_trials)}")
    print(f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
