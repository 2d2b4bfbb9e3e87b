"""Engine throughput against a bare training loop of the same model, in one run on one device.

"Bare": the preset's model and optimizers, forward, backward, Muon + AdamW, `loss.item()`, nothing else: no
detectors, no deterministic algorithms, torch.compile'd like the engine when compile is on. It runs first, before
the engine turns determinism on for the process.
"Engine": `Engine.run()` in this process with every detector on: a reference recorded by a first engine run,
then a second run compared against it at every step with --reference-loop (digests, parameter checksums), the
canary replay and GEMM check every --canary-every steps, soft signals, heartbeats, deterministic kernels.
Throughput is tokens over wall time across the steady steps (so canaries and checks between steps count).
The pair runs `--rounds` times (bare, engine, bare, engine, ...) and the table shows the median of each and the
median of the per-round ratios, so a burst of load from other processes hits one round, not the verdict.

    python bench/engine_throughput.py [--preset tiny] [--device cpu] [--steps 300] [--compile] [--json]

Goal: engine / bare >= 0.95 on the CPU with `tiny`, >= 0.85 on a GPU with `nanochat`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch

from tuner.engine import optim
from tuner.engine.data import WindowSampler, load_corpus, tokenize
from tuner.engine.model import GPT, GPTConfig
from tuner.engine.options import PRESETS, EngineOptions, default_preset
from tuner.engine.platform import DTYPES, choose_dtype, resolve_device, synchronize
from tuner.engine.protocol import Emitter
from tuner.engine.runner import Engine


def bare_loop(preset: str, device: str, steps: int, warmup: int, compile_on: bool, batch: int | None,
              cache_dir: str, data: str | None) -> dict:
    p = PRESETS[preset]
    spec = resolve_device(device)
    dtype = choose_dtype("auto", spec)
    corpus = load_corpus(data)
    if p.bpe:
        from tuner.engine.tokenizer import load_or_train

        corpus = tokenize(corpus, load_or_train(corpus.text(), corpus.sha256, p.vocab, Path(cache_dir)))
    sampler = WindowSampler(corpus, p.seq_len, 0)
    cfg = GPTConfig(depth=p.depth, width=p.width, head_dim=p.head_dim, seq_len=p.seq_len, vocab=p.vocab,
                    window_pattern=p.window_pattern, value_embeds=p.value_embeds)
    embed_dtype = dtype if p.bf16_embeddings and dtype != torch.float16 else torch.float32
    if spec.type == "cpu" and preset == "tiny":
        torch.set_num_threads(1)  # as the engine does for tiny on the CPU
    model = GPT(cfg, dtype, embed_dtype=embed_dtype)
    model.init_weights(torch.Generator().manual_seed(0))
    model = model.to(spec.device)
    ns_dtype = dtype if spec.type == "cuda" else torch.float32
    muon, adam = optim.build_optimizers(model, ns_dtype=ns_dtype, weight_decay=p.weight_decay,
                                        lr_warmup_steps=p.lr_warmup_steps,
                                        momentum_warmup_steps=p.momentum_warmup_steps,
                                        embedding_lr=p.embedding_lr)
    run_model = model
    if compile_on:
        optim.compile_updates()
        run_model = torch.compile(model, dynamic=False)
    batch = batch or p.batch_size
    times: list[float] = []
    for step in range(1, steps + warmup + 1):
        x, y = sampler.train_batch(step, batch)
        x, y = x.to(spec.device, non_blocking=True), y.to(spec.device, non_blocking=True)
        loss = run_model(x, y)
        loss.backward()
        muon.step()
        adam.step()
        model.zero_grad(set_to_none=True)
        loss.item()
        synchronize(spec)
        times.append(time.perf_counter())
    optim.eager_updates()
    steady = times[warmup:]
    tok = batch * p.seq_len
    return {"tok_s": tok * (len(steady) - 1) / (steady[-1] - steady[0]), "batch": batch,
            "median_step_ms": statistics.median(b - a for a, b in itertools.pairwise(steady)) * 1e3,
            "dtype": next(k for k, v in DTYPES.items() if v is dtype)}


def engine_run(preset: str, device: str, steps: int, warmup: int, compile_on: bool, batch: int | None,
               canary_every: int, cache_dir: str, data: str | None) -> dict:
    events: list[dict] = []
    common = {"preset": preset, "device": device, "warmup_steps": warmup, "batch_size": batch,
              "compile": compile_on, "canary_every": canary_every, "canary_every_s": 0.0, "cache_dir": cache_dir,
              "data": data}
    with tempfile.TemporaryDirectory() as tmp:
        ref = os.path.join(tmp, "ref.json")
        rec = Engine(EngineOptions(steps=max(10, warmup + 5), record=ref, **common), Emitter(sink=lambda e: None),
                     log=lambda m: None)
        if rec.run() != 0:
            raise SystemExit("engine_throughput: the recording run did not pass")
        eng = Engine(EngineOptions(steps=steps + warmup, reference=ref, reference_loop=True, **common),
                     Emitter(sink=events.append), log=lambda m: None)
        code = eng.run()
    if code != 0:
        raise SystemExit(f"engine_throughput: the engine run ended {code}: {events[-1].get('reason')}")
    start = next(e for e in events if e["event"] == "start")
    steps_ev = [e for e in events if e["event"] == "step"][warmup:]
    tok = start["tokens_per_step"]
    span = steps_ev[-1]["t"] - steps_ev[0]["t"]
    end = events[-1]
    return {"tok_s": tok * (len(steps_ev) - 1) / span, "batch": start["batch_size"],
            "median_step_ms": end["median_step_ms"], "canaries": end["canaries"],
            "compared_steps": end["reference"]["compared_steps"], "repeatable": start["repeatable"],
            "deterministic": start["deterministic"], "compile": start["compile"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default=None, help="default: nanochat on GPUs, tiny on the CPU")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--canary-every", type=int, default=100)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="both sides compiled (default: on for GPUs, off on the CPU, as the engine)")
    ap.add_argument("--data", default=None)
    ap.add_argument("--rounds", type=int, default=None, help="bare/engine pairs (default 3 on the CPU, 1 on GPUs)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    preset = a.preset or default_preset(a.device)
    compile_on = a.compile if a.compile is not None else a.device.startswith(("cuda", "hip"))
    rounds = a.rounds or (1 if a.device.startswith(("cuda", "hip")) else 3)
    bares, engines = [], []
    with tempfile.TemporaryDirectory() as cache:
        cache_dir = os.environ.get("TUNER_BENCH_CACHE", cache)
        for _ in range(rounds):
            bares.append(bare_loop(preset, a.device, a.steps, a.warmup, compile_on, a.batch_size, cache_dir,
                                   a.data))
            engines.append(engine_run(preset, a.device, a.steps, a.warmup, compile_on,
                                      a.batch_size or bares[-1]["batch"], a.canary_every, cache_dir, a.data))
    ratios = [e["tok_s"] / b["tok_s"] for b, e in zip(bares, engines, strict=True)]
    ratio = statistics.median(ratios)
    bare = dict(bares[0], tok_s=statistics.median(b["tok_s"] for b in bares),
                median_step_ms=statistics.median(b["median_step_ms"] for b in bares))
    eng = dict(engines[0], tok_s=statistics.median(e["tok_s"] for e in engines),
               median_step_ms=statistics.median(e["median_step_ms"] for e in engines))
    goal = 0.85 if a.device.startswith(("cuda", "hip")) else 0.95
    result = {"device": a.device, "preset": preset, "compile": compile_on, "steps": a.steps, "rounds": rounds,
              "bare": bare, "engine": eng, "ratios": ratios, "ratio": ratio, "goal": goal,
              "meets_goal": ratio >= goal}
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"engine throughput, {preset} on {a.device} ({bare['dtype']}, batch {bare['batch']}, compile "
          f"{'on' if compile_on else 'off'}, {a.steps} steady steps, canary every {a.canary_every}, "
          f"median of {rounds} rounds)")
    print(f"{'':<8} {'tok/s':>12} {'median step ms':>15}  notes")
    print(f"{'bare':<8} {bare['tok_s']:>12,.0f} {bare['median_step_ms']:>15.2f}  no detectors, no determinism")
    print(f"{'engine':<8} {eng['tok_s']:>12,.0f} {eng['median_step_ms']:>15.2f}  every detector, deterministic, "
          f"{eng['compared_steps']} steps compared, {eng['canaries']} canaries")
    print(f"{'ratio':<8} {ratio:>12.3f} {'':>15}  goal >= {goal:.2f}: {'met' if ratio >= goal else 'NOT met'} "
          f"(rounds: {', '.join(f'{r:.3f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
