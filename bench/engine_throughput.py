"""Engine throughput against a bare training loop of the same model, in one run on one device; and what
determinism itself costs.

"Bare deterministic": the preset's model and optimizers, forward, backward, Muon + AdamW, `loss.item()`, nothing
else (no detectors), under the engine's own kernel switches: strict deterministic algorithms, the SDPA backends
and BLAS preference of `platform.choose_kernels`, the attention kernel of each layer from `attention.layer_kernels`
(flash with a window on CUDA), Inductor's deterministic mode when compiled. So engine / bare deterministic is the
cost of the detectors alone.
"Bare default": the same loop and the same per-layer attention kernels under torch's defaults (deterministic
algorithms off, cuDNN not forced deterministic, every SDPA backend enabled: cuDNN attention first on Hopper,
Inductor's autotuning allowed). Bare deterministic / bare default is the cost of determinism itself. The
environment variables the engine sets before torch is imported (a deterministic cuBLAS workspace, TunableOp off,
hipBLAS preferred on ROCm) stay for both: they are read once per process.
"Engine": `Engine.run()` in this process with every detector on: a reference recorded by a first engine run,
then a second run compared against it at every step with --reference-loop (digests, parameter checksums), the
canary replay and GEMM check every --canary-every steps, soft signals, heartbeats, deterministic kernels.
Throughput is tokens over wall time across the steady steps (so canaries and checks between steps count).
The three run `--rounds` times (bare deterministic, bare default, engine, ...) and the table shows the median of
each and the median of the per-round ratios, so a burst of load from other processes hits one round, not the
verdict.

    python bench/engine_throughput.py [--preset tiny] [--device cpu] [--steps 300] [--compile] [--json]

Goal: engine / bare deterministic >= 0.95 on the CPU with `tiny`, >= 0.85 on a GPU with `nanochat`.
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

from tuner.engine.environment import prepare_environment

prepare_environment()  # before torch is imported, as the engine's CLI does (both bare loops run under it)

import torch

from tuner.engine import attention, compiled, optim
from tuner.engine.data import WindowSampler, load_corpus, tokenize
from tuner.engine.model import GPT
from tuner.engine.options import PRESETS, EngineOptions, default_preset
from tuner.engine.platform import (
    DTYPES,
    choose_dtype,
    choose_kernels,
    deterministic_mode,
    enable_determinism,
    resolve_device,
    synchronize,
)
from tuner.engine.protocol import Emitter
from tuner.engine.runner import Engine

SDPA_SWITCHES = ("enable_cudnn_sdp", "enable_mem_efficient_sdp", "enable_flash_sdp", "enable_math_sdp")


def torch_default_kernels() -> dict:
    """torch's own defaults for what `enable_determinism` and `choose_kernels` switch (for the bare default loop)."""
    torch.use_deterministic_algorithms(False)  # also Inductor's `deterministic` flag
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = False  # torch's default
    for name in SDPA_SWITCHES:
        fn = getattr(torch.backends.cuda, name, None)
        if fn is not None:
            fn(True)
    return {"deterministic": deterministic_mode(), "attention": "default (every SDPA backend enabled)",
            "cudnn_benchmark": False, "float32_matmul_precision": torch.get_float32_matmul_precision()}


def bare_loop(preset: str, device: str, steps: int, warmup: int, compile_on: bool, batch: int | None,
              cache_dir: str, data: str | None, deterministic: bool) -> dict:
    p = PRESETS[preset]
    spec = resolve_device(device)
    enable_determinism()  # the engine's switches first: the attention plan is the engine's in both loops
    kernels = choose_kernels(spec)
    dtype = choose_dtype("auto", spec)
    corpus = load_corpus(data)
    if p.bpe:
        from tuner.engine.tokenizer import load_or_train

        corpus = tokenize(corpus, load_or_train(corpus.text(), corpus.sha256, p.vocab, Path(cache_dir)))
    sampler = WindowSampler(corpus, p.seq_len, 0)
    cfg = p
    where = attention.attention_platform(spec.type, spec.device, dtype, cfg.n_head, cfg.head_dim, cfg.seq_len)
    layers = attention.layer_kernels(cfg.windows(), cfg.seq_len, where)
    if not deterministic:
        kernels = torch_default_kernels()
    embed_dtype = dtype if p.bf16_embeddings and dtype != torch.float16 else torch.float32
    if spec.type == "cpu" and preset == "tiny":
        torch.set_num_threads(1)  # as the engine does for tiny on the CPU
    model = GPT(cfg, dtype, embed_dtype=embed_dtype, attention_kernels=layers)
    model.init_weights(torch.Generator().manual_seed(0))
    model = model.to(spec.device)
    ns_dtype = dtype if spec.type == "cuda" else torch.float32
    muon, adam = optim.build_optimizers(model, ns_dtype=ns_dtype, weight_decay=p.weight_decay,
                                        lr_warmup_steps=p.lr_warmup_steps,
                                        momentum_warmup_steps=p.momentum_warmup_steps,
                                        embedding_lr=p.embedding_lr)
    run_model = model
    if compile_on:
        torch._dynamo.reset()  # each loop compiles its own graphs (no recompile limit across rounds)
        optim.eager_updates()
        if deterministic:
            run_model = compiled.compile_model(model)  # as the engine: Inductor deterministic
        else:
            import torch._inductor.config as inductor_config

            inductor_config.deterministic = False
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
            "dtype": next(k for k, v in DTYPES.items() if v is dtype), "kernels": kernels,
            "attention_kernels": layers}


def engine_run(preset: str, device: str, steps: int, warmup: int, compile_on: bool, batch: int | None,
               canary_every: int, cache_dir: str, data: str | None) -> dict:
    events: list[dict] = []
    common = {"preset": preset, "device": device, "warmup_steps": warmup, "batch_size": batch,
              "compile": compile_on, "canary_every": canary_every, "canary_every_s": 0.0, "cache_dir": cache_dir,
              "data": data}
    if compile_on:
        torch._dynamo.reset()
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
            "deterministic": start["deterministic"], "compile": start["compile"],
            "kernels": {k: v for k, v in start["kernels"].items() if k != "sdpa_backend"},
            "attention_kernels": start["attention_kernels"]}


def main(argv: list[str] | None = None) -> int:
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
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds of the three (default 3 on the CPU, 1 on GPUs)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    preset = a.preset or default_preset(a.device)
    compile_on = a.compile if a.compile is not None else a.device.startswith(("cuda", "hip"))
    rounds = a.rounds or (1 if a.device.startswith(("cuda", "hip")) else 3)
    bares, defaults, engines = [], [], []
    with tempfile.TemporaryDirectory() as cache:
        cache_dir = os.environ.get("TUNER_BENCH_CACHE", cache)
        for _ in range(rounds):
            bares.append(bare_loop(preset, a.device, a.steps, a.warmup, compile_on, a.batch_size, cache_dir,
                                   a.data, deterministic=True))
            defaults.append(bare_loop(preset, a.device, a.steps, a.warmup, compile_on, bares[-1]["batch"],
                                      cache_dir, a.data, deterministic=False))
            engines.append(engine_run(preset, a.device, a.steps, a.warmup, compile_on,
                                      a.batch_size or bares[-1]["batch"], a.canary_every, cache_dir, a.data))
    ratios = [e["tok_s"] / b["tok_s"] for b, e in zip(bares, engines, strict=True)]
    det_ratios = [b["tok_s"] / d["tok_s"] for b, d in zip(bares, defaults, strict=True)]
    ratio, det_ratio = statistics.median(ratios), statistics.median(det_ratios)

    def med(runs: list[dict]) -> dict:
        return dict(runs[0], tok_s=statistics.median(r["tok_s"] for r in runs),
                    median_step_ms=statistics.median(r["median_step_ms"] for r in runs))

    bare, default, eng = med(bares), med(defaults), med(engines)
    # the bare deterministic loop ran under the engine's switches and attention kernels (checked, not assumed)
    same = bare["kernels"] == eng["kernels"] and bare["attention_kernels"] == eng["attention_kernels"]
    goal = 0.85 if a.device.startswith(("cuda", "hip")) else 0.95
    result = {"device": a.device, "preset": preset, "compile": compile_on, "steps": a.steps, "rounds": rounds,
              "bare": bare, "bare_default": default, "engine": eng, "ratios": ratios, "ratio": ratio,
              "determinism_ratios": det_ratios, "determinism_ratio": det_ratio, "same_switches_as_engine": same,
              "goal": goal, "meets_goal": ratio >= goal}
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"engine throughput, {preset} on {a.device} ({bare['dtype']}, batch {bare['batch']}, compile "
          f"{'on' if compile_on else 'off'}, {a.steps} steady steps, canary every {a.canary_every}, "
          f"median of {rounds} rounds; attention {'/'.join(bare['attention_kernels'])})")
    print(f"{'':<14} {'tok/s':>12} {'median step ms':>15}  notes")
    print(f"{'bare default':<14} {default['tok_s']:>12,.0f} {default['median_step_ms']:>15.2f}  no detectors, "
          "torch's default kernels (deterministic algorithms off)")
    print(f"{'bare determ.':<14} {bare['tok_s']:>12,.0f} {bare['median_step_ms']:>15.2f}  no detectors, the "
          f"engine's deterministic kernels (same switches as the engine: {'yes' if same else 'NO'})")
    print(f"{'engine':<14} {eng['tok_s']:>12,.0f} {eng['median_step_ms']:>15.2f}  every detector, deterministic, "
          f"{eng['compared_steps']} steps compared, {eng['canaries']} canaries")
    print(f"{'detectors':<14} {ratio:>12.3f} {'':>15}  engine / bare deterministic; goal >= {goal:.2f}: "
          f"{'met' if ratio >= goal else 'NOT met'} (rounds: {', '.join(f'{r:.3f}' for r in ratios)})")
    print(f"{'determinism':<14} {det_ratio:>12.3f} {'':>15}  bare deterministic / bare default (rounds: "
          f"{', '.join(f'{r:.3f}' for r in det_ratios)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
