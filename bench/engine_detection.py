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
Part D, every site of a training step, in fp32 and in bf16 (--trials per site and dtype): weights (fp32 masters,
persistent), Linear outputs, attention q, k, v, scores and output, gradients out of the backward GEMMs (dW of a
matrix, dX into a Linear), optimizer state (Muon momentum, AdamW moments; persistent) and the Newton-Schulz
matmuls (one X X^T product). Each site runs with the same hooks installed in its clean run, so a flip is
*consequential* when any later step's digest (loss bits, gradient-norm bits, parameter bit checksum) differs
from the clean run's within the horizon. Per site: consequential flips, caught on their own step bit for bit,
steps to detection, and what the tolerance comparison (`--tolerance`: loss 5 %, gradient norm 100 %) catches.
In bf16 the Newton-Schulz iteration runs in bf16, as on GPUs.
Part E, the tolerance mode of `tuner screen --tolerance` beside the bitwise mode, on the same flips (--tolerance-
trials): single-bit flips (a weight element, persistent, or one Linear output during a step) at a step in
[1, --max-flip-step]; the run trains --tolerance-steps steps and scores the fixed held-out windows, as a screen does.
Bitwise: any step's digest differs from the clean run's (the flip is consequential). Tolerance: the paired held-out
loss comparison (tuner/actions/screen/tolerance.py, margin --margin) says fail. Also the healthy spread it must
absorb: the clean run on another "platform" (another CPU thread count: another reduction order), compared the same
way. Prints detection per bit field and the smallest corruption (relative change of the flipped value) each mode
catches.

    python bench/engine_detection.py [--parts ABCD] [--trials 200] [--horizon 30] [--max-flip-step 20]
        [--site-horizon 5] [--seed 0] [--json]

Parts A-C take about three minutes on two CPU cores; `--parts D --trials 10` about one. Prints fractions and
median steps from flip to detection; `--json` prints one JSON document instead.

Every part injects (forward hooks, gradient hooks, patched functions), so the engine runs eager kernels whatever
the device: a hook registered after torch.compile is not called by the compiled graph, and each patched closure
would recompile until Dynamo's limit. `--compile` is refused (exit 2, one line); on a GPU, where the engine would
compile by default, one line on stderr says compile is off.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import warnings
from collections import Counter
from contextlib import contextmanager

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from tuner.engine import optim
from tuner.engine.detectors import NonFiniteDetector, ReferenceTrajectory, SoftSignals
from tuner.engine.faults import FaultInjector, flip_bit_
from tuner.engine.options import EngineOptions
from tuner.engine.protocol import Emitter
from tuner.engine.reference import step_digest
from tuner.engine.runner import Engine


def quiet(_msg: str) -> None:
    pass


COMPILE_REFUSED = ("engine_detection: --compile cannot be combined with fault injection, and every part injects "
                   "(a hook registered after torch.compile is not called by the compiled graph); drop --compile")


def detection_options(args, **fields) -> EngineOptions:
    """The engine's options for a detection run: always eager (compile off), since every part injects."""
    return EngineOptions(canary_every=0, canary_every_s=0, seed=args.seed, compile=False, **fields)


def reset(engine: Engine) -> None:
    engine._restore_initial()  # initial weights and fresh optimizers with the preset's settings


# --- Part D: every site of a training step ------------------------------------------------------------------------
# Each site is a context manager around one training step: `flip` says whether to flip one bit this step; with
# flip=False the same code path runs (the clean run the flipped one is compared with).

def _flip_clone(t: torch.Tensor, rng: random.Random) -> torch.Tensor:
    t = t.clone(memory_format=torch.contiguous_format)
    flip_bit_(t, rng.randrange(t.numel()), rng.randrange(torch.finfo(t.dtype).bits))
    return t


@contextmanager
def _patched(obj, name: str, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def site_weight(engine, flip, rng):
    if flip:
        params = [(n, p) for n, p in engine.model.named_parameters() if p.ndim == 2]
        _, p = FaultInjector._pick_weighted(params, rng)
        flip_bit_(p.data, rng.randrange(p.numel()), rng.randrange(32))
    yield


def site_activation(engine, flip, rng):
    injector = FaultInjector(log=quiet)
    if flip:
        modules = engine.model.linear_modules()
        name, _ = FaultInjector._pick_weighted([(n, m.weight[:, 0]) for n, m in modules], rng)
        injector.arm_activation(dict(modules)[name], name, rng, step=None, source="bench")
    try:
        yield
    finally:
        injector.disarm()


def _attention_site(part: str):
    def site(engine, flip, rng):
        real = F.scaled_dot_product_attention
        target_call = rng.randrange(engine.opts.preset_spec.depth) if flip else -1
        calls = [0]

        def sdpa(q, k, v, is_causal=True, **kw):
            hit = calls[0] == target_call
            calls[0] += 1
            if part == "scores":  # the explicit math path, with a flip between the two matmuls
                t = q.size(-2)
                scores = (q @ k.transpose(-2, -1)) * (q.size(-1) ** -0.5)
                mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
                if hit:
                    flat = scores.clone()
                    i = rng.randrange(t)
                    j = rng.randrange(i + 1)  # an unmasked entry
                    b = rng.randrange(scores.size(0))
                    h = rng.randrange(scores.size(1))
                    bit = rng.randrange(torch.finfo(flat.dtype).bits)
                    cell = flat[b, h, i, j].clone().reshape(1)
                    flip_bit_(cell, 0, bit)
                    flat[b, h, i, j] = cell[0]
                    scores = flat
                scores = scores.masked_fill(~mask, float("-inf"))
                return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
            if hit and part in ("q", "k", "v"):
                q, k, v = (_flip_clone(x, rng) if part == name else x for x, name in ((q, "q"), (k, "k"), (v, "v")))
            y = real(q, k, v, is_causal=is_causal, **kw)
            return _flip_clone(y, rng) if hit and part == "output" else y

        with _patched(F, "scaled_dot_product_attention", sdpa):
            yield
    return site


def site_grad_weight(engine, flip, rng):
    handle = None
    if flip:
        params = [p for p in engine.model.parameters() if p.ndim == 2]
        p = params[rng.randrange(len(params))]
        handle = p.register_hook(lambda g: _flip_clone(g, rng))
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def site_grad_input(engine, flip, rng):
    handles = []
    if flip:
        modules = engine.model.linear_modules()
        _, module = modules[rng.randrange(len(modules))]

        def pre(_m, inputs):
            x = inputs[0]
            if x.requires_grad:
                x.register_hook(lambda g: _flip_clone(g, rng))
            handles[0].remove()

        handles.append(module.register_forward_pre_hook(pre))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def site_optimizer_state(engine, flip, rng):
    if flip:
        states = [b for bufs in engine.muon.buffers.values() for b in bufs]  # momentum, second moment
        for pairs in engine.adam.state.values():
            states += [t for mv in pairs for t in mv]
        t = states[rng.randrange(len(states))]
        flip_bit_(t, rng.randrange(t.numel()), rng.randrange(32))
    yield


def site_newton_schulz(engine, flip, rng):
    """One X X^T product of one Polar Express iteration (Muon's orthogonalisation) flipped."""
    real = optim.polar_express
    state = {"target": rng.randrange(len(engine.muon.groups)) if flip else -1, "call": 0,
             "iteration": rng.randrange(5)}

    def pe(g, steps=5, dtype=torch.float32):
        hit = state["call"] == state["target"]
        state["call"] += 1
        if not hit:
            return real(g, steps, dtype)
        x = g.to(dtype)  # optim.polar_express, with one product flipped
        target = x.float().norm(dim=(-2, -1), keepdim=True) / (x.size(-2) ** 0.5)
        x = x * (target / x.float().norm(dim=-1, keepdim=True).clamp_min(1e-6)).to(x.dtype)
        x = x / (x.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-6)
        tall = x.size(-2) > x.size(-1)
        for i, (a, b, c) in enumerate(optim.POLAR_EXPRESS[:steps]):
            m = x.mT @ x if tall else x @ x.mT
            if i == state["iteration"]:
                m = _flip_clone(m, rng)
            x = a * x + x @ (b * m + c * (m @ m)) if tall else a * x + (b * m + c * (m @ m)) @ x
        x = x.to(g.dtype)
        norm = min(x.size(-2), x.size(-1)) ** 0.5
        return x * (norm / x.float().norm(dim=(-2, -1), keepdim=True).clamp_min(1e-6)).to(x.dtype)

    with _patched(optim, "polar_express", pe):
        yield


SITES = {
    "weight": site_weight, "activation": site_activation,
    "attention.q": _attention_site("q"), "attention.k": _attention_site("k"), "attention.v": _attention_site("v"),
    "attention.scores": _attention_site("scores"), "attention.output": _attention_site("output"),
    "grad.dW (backward GEMM)": site_grad_weight, "grad.dX (backward GEMM)": site_grad_input,
    "optimizer state": site_optimizer_state, "polar-express matmul": site_newton_schulz,
}


def _run(engine, site, steps: int, flip_step: int | None, rng: random.Random) -> list[str]:
    reset(engine)
    out = []
    for step in range(1, steps + 1):
        with contextmanager(site)(engine, step == flip_step, rng):
            r = engine.train_step(step)
        out.append(step_digest(r.loss, r.grad_norm, r.param_sum))
    return out


def part_d(args) -> list[dict]:
    rows = []
    for dtype in args.dtypes.split(","):
        engine = Engine(detection_options(args, steps=1, dtype=dtype, device=args.device, preset=args.preset),
                        Emitter(), log=quiet)
        engine.setup()
        steps = args.max_site_step + args.site_horizon
        for name, site in SITES.items():
            clean = _run(engine, site, steps, None, random.Random(0))
            per = {"dtype": dtype, "site": name, "trials": 0, "consequential": 0, "caught_own_step": 0,
                   "caught": 0, "latency": [], "tolerance_own_step": 0, "tolerance_caught": 0}
            for trial in range(args.trials):
                rng = random.Random(f"engine-detection-site:{args.seed}:{dtype}:{name}:{trial}")
                flip_step = rng.randint(2, args.max_site_step)  # from step 2: optimizer state exists
                got = _run(engine, site, steps, flip_step, rng)
                per["trials"] += 1
                diff = [s for s in range(flip_step, steps + 1) if got[s - 1] != clean[s - 1]]
                if not diff:
                    continue  # the flip changed nothing the run keeps (e.g. a masked or rounded-away value)
                per["consequential"] += 1
                per["caught"] += 1
                per["caught_own_step"] += diff[0] == flip_step
                per["latency"].append(diff[0] - flip_step)
                tol = ReferenceTrajectory(clean, tolerance=0.05)
                fired = []
                for s in range(flip_step, steps + 1):
                    loss, gn = _values(got[s - 1])
                    if tol.check(s, loss, gn) is not None or not (math_finite(loss) and math_finite(gn)):
                        fired.append(s)
                        break
                per["tolerance_caught"] += bool(fired)
                per["tolerance_own_step"] += bool(fired) and fired[0] == flip_step
            rows.append(per)
    return rows


def _values(digest: str) -> tuple[float, float]:
    from tuner.engine.reference import digest_values

    return digest_values(digest)


def math_finite(x: float) -> bool:
    import math

    return math.isfinite(x)


def print_part_d(rows: list[dict], args) -> None:
    print(f"Part D: single-bit flips at every site of a training step ({args.preset} preset, {args.device}), "
          f"{args.trials} per site "
          f"and dtype, flip at a step in 2..{args.max_site_step}, observed {args.site_horizon} steps after")
    print(f"  {'dtype':<5} {'site':<25} {'consequential':>13} {'bitwise own step':>17} {'median lag':>10} "
          f"{'tolerance own step':>19} {'tolerance ever':>15}")
    for r in rows:
        c = r["consequential"]
        lag = statistics.median(r["latency"]) if r["latency"] else None

        def frac(n, c=c):
            return f"{n}/{c}" + (f" ({100 * n / c:.0f}%)" if c else "")
        print(f"  {r['dtype']:<5} {r['site']:<25} {c:>6}/{r['trials']:<6} {frac(r['caught_own_step']):>17} "
              f"{'-' if lag is None else f'{lag:g}':>10} {frac(r['tolerance_own_step']):>19} "
              f"{frac(r['tolerance_caught']):>15}")
    tot = sum(r["consequential"] for r in rows)
    own = sum(r["caught_own_step"] for r in rows)
    tol = sum(r["tolerance_own_step"] for r in rows)
    if tot:
        print(f"  all sites: {own}/{tot} ({100 * own / tot:.1f} %) caught bit for bit on their own step; "
              f"tolerance: {tol}/{tot} ({100 * tol / tot:.1f} %)")


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


# --- Part E: the tolerance mode (paired held-out losses) beside the bitwise mode, on the same flips ---------------


def _train_and_score(engine: Engine, steps: int, flip=None) -> tuple[list[str], list[float], float | None]:
    """`steps` training steps from the initial state (with `flip(step)` called before each), then the held-out
    windows as a screen's engine scores them. Returns the digests, the per-window losses and the flip's relative
    change (None without a flip)."""
    reset(engine)
    digests, change = [], None
    for step in range(1, steps + 1):
        if flip is not None:
            got = flip(step)  # called every step: it also disarms an activation flip after its step
            change = got if got is not None else change
        r = engine.train_step(step)
        digests.append(step_digest(r.loss, r.grad_norm, r.param_sum))
    _bpb, losses = engine.evaluate()
    engine.state = "train"
    return digests, losses, change


def part_e(args) -> dict:
    import math

    from tuner.actions.screen.tolerance import paired

    engine = Engine(detection_options(args, steps=1, preset=args.preset, device=args.device, dtype="fp32"),
                    Emitter(), log=quiet)
    engine.setup()
    steps = args.tolerance_steps
    clean, clean_losses, _ = _train_and_score(engine, steps)
    threads = torch.get_num_threads()
    other_threads = 1 if threads > 1 else 2
    torch.set_num_threads(other_threads)
    try:
        other, other_losses, _ = _train_and_score(engine, steps)
    finally:
        torch.set_num_threads(threads)
    platform = paired(clean_losses, other_losses, args.margin)
    params = list(engine.model.named_parameters())
    modules = engine.model.linear_modules()
    by_name = dict(modules)
    rows = []
    for trial in range(args.tolerance_trials):
        rng = random.Random(f"engine-detection-tolerance:{args.seed}:{trial}")
        flip_step = rng.randint(1, args.max_flip_step)
        target = rng.choice(("weight", "activation"))
        bit = rng.randrange(32)
        injector = FaultInjector(log=quiet)

        def flip(step, rng=rng, target=target, bit=bit, flip_step=flip_step, injector=injector):
            injector.disarm()
            if step != flip_step:
                return None
            if target == "weight":
                name, p = FaultInjector._pick_weighted(params, rng)
                rec = injector.flip_weight(p, name, rng.randrange(p.numel()), bit, step=step, source="bench")
                return _relative(rec.before, rec.after)
            name, _ = FaultInjector._pick_weighted([(n, m.weight[:, 0]) for n, m in modules], rng)
            injector.arm_activation(by_name[name], name, rng, step=step, source="bench", bit=bit)
            return math.nan  # the activation's own value is not known here: its size is the bit's
        got, losses, change = _train_and_score(engine, steps, flip)
        injector.disarm()
        consequential = got != clean
        verdict = paired(clean_losses, losses, args.margin).verdict if all(map(math_finite, losses)) else "fail"
        rows.append({"trial": trial, "target": target, "bit": bit, "step": flip_step, "change": change,
                     "consequential": consequential, "bitwise": consequential, "tolerance": verdict})
    # the smallest corruption the tolerance mode sees: one weight element scaled by 2^k at step 5 (an exponent flip
    # that grows it), a few elements per k; the bitwise mode sees every one of them on its step
    sweep = []
    for k in args.sweep_powers:
        for element in range(args.sweep_elements):
            rng = random.Random(f"engine-detection-sweep:{args.seed}:{k}:{element}")
            name, p = FaultInjector._pick_weighted(params, rng)
            index = rng.randrange(p.numel())

            def scale(step, p=p, index=index, k=k):
                if step == 5:
                    with torch.no_grad():
                        p.view(-1)[index] *= 2.0 ** k
                return float(2.0 ** k) if step == 5 else None
            got, losses, _ = _train_and_score(engine, steps, scale)
            verdict = paired(clean_losses, losses, args.margin).verdict if all(map(math_finite, losses)) else "fail"
            sweep.append({"power": k, "tensor": name, "bitwise": got != clean, "tolerance": verdict})
    return {"steps": steps, "windows": len(clean_losses), "margin_nats": args.margin, "sweep": sweep,
            "platform": {"threads": [threads, other_threads], "bitwise_equal": other == clean,
                         "mean_nats": platform.mean_nats, "ci95_nats": [platform.low_nats, platform.high_nats],
                         "verdict": platform.verdict},
            "flips": rows}


def _relative(before: float, after: float) -> float:
    import math

    if not (math_finite(before) and math_finite(after)):
        return math.inf
    return abs(after - before) / abs(before) if before else math.inf


BIT_FIELDS = (("mantissa 0-15", range(16)), ("mantissa 16-22", range(16, 23)), ("exponent 23-30", range(23, 31)),
              ("sign 31", range(31, 32)))


def print_part_e(doc: dict) -> None:

    rows = doc["flips"]
    p = doc["platform"]
    print(f"Part E: tolerance mode (held-out losses, {doc['windows']} windows after {doc['steps']} steps, margin "
          f"±{doc['margin_nats']:g} nats) beside bitwise, on the same {len(rows)} flips (tiny preset, fp32)")
    print(f"  healthy spread it must absorb (threads {p['threads'][0]} vs {p['threads'][1]}: bitwise equal "
          f"{p['bitwise_equal']}): {p['mean_nats']:+.5f} nats, 95 % [{p['ci95_nats'][0]:+.5f}, "
          f"{p['ci95_nats'][1]:+.5f}] -> {p['verdict']}")
    cons = [r for r in rows if r["consequential"]]
    print(f"  {'bit field':<16} {'flips':>5} {'consequential':>13} {'bitwise':>8} {'tolerance':>9} {'retest':>6}")
    for label, bits in BIT_FIELDS:
        sub = [r for r in rows if r["bit"] in bits]
        c = [r for r in sub if r["consequential"]]
        print(f"  {label:<16} {len(sub):>5} {len(c):>13} {sum(r['bitwise'] for r in c):>8} "
              f"{sum(r['tolerance'] == 'fail' for r in c):>9} {sum(r['tolerance'] == 'retest' for r in c):>6}")
    tol = [r for r in cons if r["tolerance"] == "fail"]
    print(f"  all: bitwise {pct(len(cons), len(cons))} of consequential flips, tolerance "
          f"{pct(len(tol), len(cons))}")
    if doc.get("sweep"):
        print("  one weight element scaled by 2^k at step 5 (bitwise / tolerance fail / tolerance retest, of each k):")
        for k in sorted({r["power"] for r in doc["sweep"]}):
            sub = [r for r in doc["sweep"] if r["power"] == k]
            print(f"    2^{k:<3} bitwise {sum(r['bitwise'] for r in sub)}/{len(sub)}, tolerance "
                  f"{sum(r['tolerance'] == 'fail' for r in sub)}/{len(sub)} fail, "
                  f"{sum(r['tolerance'] == 'retest' for r in sub)} retest")
        caught = [r["power"] for r in doc["sweep"] if r["tolerance"] == "fail"]
        print("  smallest scaling the tolerance mode fails: " + (f"2^{min(caught)}" if caught else "none of them"))
    sized = [r for r in cons if r["change"] is not None and math_finite(r["change"]) and r["target"] == "weight"]
    if sized:
        smallest_bitwise = min(r["change"] for r in sized)
        caught = [r["change"] for r in sized if r["tolerance"] == "fail"]
        print(f"  smallest weight corruption caught (relative change of the flipped value): bitwise "
              f"{smallest_bitwise:.2e}, tolerance " + (f"{min(caught):.2e}" if caught else "none caught"))


def pct(n: int, d: int) -> str:
    return f"{n:>3}/{d} ({100 * n / d:5.1f} %)"


def latency(rows: list[dict], key: str) -> str:
    lat = [r[key] - r["step"] for r in rows if r[key] is not None]
    if not lat:
        return "n/a"
    return f"median {statistics.median(lat):g} steps (max {max(lat)})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--horizon", type=int, default=30, help="steps observed after the flip (default 30)")
    ap.add_argument("--max-flip-step", type=int, default=20)
    ap.add_argument("--canary-every", type=int, default=10)
    ap.add_argument("--canary-trials", type=int, default=200)
    ap.add_argument("--gemm-trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", default="ABCD", help="which parts to run (default ABCD; E: the tolerance mode)")
    ap.add_argument("--site-horizon", type=int, default=5, help="Part D: steps observed after the flip (default 5)")
    ap.add_argument("--max-site-step", type=int, default=6, help="Part D: last step a flip may land on (default 6)")
    ap.add_argument("--device", default="cpu", help="Part D: engine device (default cpu; e.g. cuda:0)")
    ap.add_argument("--preset", default="tiny", help="Part D: model preset (default tiny)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="Part D: compute dtypes (default fp32,bf16)")
    ap.add_argument("--tolerance-trials", type=int, default=60, help="Part E: flips (default 60)")
    ap.add_argument("--tolerance-steps", type=int, default=200, help="Part E: steps before the held-out windows "
                    "(default 200)")
    ap.add_argument("--margin", type=float, default=0.02, help="Part E: the tolerance mode's margin in nats (0.02)")
    ap.add_argument("--sweep-powers", type=lambda t: [int(x) for x in t.split(",")], default=[1, 2, 4, 8, 16, 32, 64],
                    help="Part E: scale one weight element by 2^k for these k (default 1,2,4,8,16,32,64)")
    ap.add_argument("--sweep-elements", type=int, default=2, help="Part E: elements per k (default 2)")
    ap.add_argument("--json", action="store_true", help="print one JSON document (Part D's table and Part A's "
                    "counts) instead of text")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="refused: every part injects faults, which needs eager kernels (compile is always off)")
    args = ap.parse_args(argv)
    if args.compile:
        print(COMPILE_REFUSED, file=sys.stderr)
        return 2
    if EngineOptions(device=args.device).compile_enabled("cuda" if args.device.startswith(("cuda", "hip")) else
                                                          args.device):
        print(f"engine_detection: compile off on {args.device} (every part injects faults, which needs eager "
              "kernels)", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    doc: dict = {"seed": args.seed, "trials": args.trials}
    if "D" in args.parts:
        rows = part_d(args)
        doc["sites"] = [{**r, "median_latency_steps": statistics.median(r["latency"]) if r["latency"] else None}
                        for r in rows]
        if not args.json:
            print_part_d(rows, args)
    if "E" in args.parts:
        doc["tolerance"] = part_e(args)
        if not args.json:
            print_part_e(doc["tolerance"])
    if not set("ABC") & set(args.parts):
        if args.json:
            print(json.dumps(doc, default=list))
        else:
            print(f"({time.monotonic() - t0:.0f} s)")
        return 0
    engine = Engine(detection_options(args, steps=1), Emitter(), log=quiet)
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
