"""Overhead of the engine's checks: engine steps with every detector on vs a bare training loop.

Same process, same model, optimizer and batch size, alternating steps between the two so that CPU
noise (other processes, frequency changes) hits both alike. "Engine" is `Engine.step_once()`: fault-injection
hooks (none armed), the raw gradient norm, one host sync for loss and norm, the `step` event serialised to
/dev/null, the non-finite check, the reference comparison (its verdict ignored: the alternating bare steps make
the trajectory diverge from any recording), the recorder, soft signals, a canary replay + GEMM check every
--canary-every steps, and the heartbeat thread. "Bare" is forward, backward, Muon + AdamW, and `loss.item()`.

    python bench/engine_overhead.py [--preset tiny] [--pairs 1500] [--canary-every 100]

Steps alternate one by one (bare, engine, engine, bare, ...). Prints the median step time of each, the canary's
cost amortised over its interval, and the throughput ratio engine/bare (the goal is >= 0.95).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from tuner.engine.detectors import ReferenceTrajectory, TrajectoryRecorder
from tuner.engine.options import EngineOptions
from tuner.engine.protocol import Emitter, Heartbeat
from tuner.engine.reference import step_digest
from tuner.engine.runner import Engine


class _ComparingButNeverFailing(ReferenceTrajectory):
    def check(self, step, loss, grad_norm, param_sum=None, grad_sum=None):  # compares, then drops the verdict
        super().check(step, loss, grad_norm, param_sum, grad_sum)


class _AnyStepRecorder(TrajectoryRecorder):
    def append(self, step, loss, grad_norm, param_sum=None, grad_sum=None):
        self.digests.append(step_digest(loss, grad_norm, param_sum, grad_sum))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--pairs", type=int, default=1500, help="alternating (bare, engine) step pairs (default 1500)")
    ap.add_argument("--canary-every", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()

    total = 2 * a.pairs + 2 * a.warmup + 10
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the run
    canary_ms: list[float] = []

    def sink(ev: dict) -> None:
        if ev["event"] == "canary":
            canary_ms.append(ev["dt_ms"])

    opts = EngineOptions(device=a.device, preset=a.preset, steps=total, canary_every=a.canary_every,
                         canary_every_s=60.0)
    engine = Engine(opts, Emitter(devnull, sink=sink), log=lambda m: None)
    engine.setup()
    engine.heartbeat = Heartbeat(engine.em, engine.heartbeat_status, opts.heartbeat_s).start()
    engine._loop_start = time.monotonic()
    engine.trajectory = _ComparingButNeverFailing([step_digest(1.0, 1.0, 0)] * total)
    engine.recorder = _AnyStepRecorder()
    model, bare_step_no = engine.model, [0]

    def bare_step() -> None:
        bare_step_no[0] += 1
        x, y = engine.sampler.train_batch(10**6 + bare_step_no[0], engine.batch_size)
        loss = model(x.to(engine.device), y.to(engine.device))
        loss.backward()
        engine.muon.step()
        engine.adam.step()
        model.zero_grad(set_to_none=True)
        loss.item()

    for _ in range(a.warmup):
        bare_step()
        engine.step_once()
    times = {"bare": [], "engine": []}
    steps = {"bare": bare_step, "engine": engine.step_once}
    t_all = {"bare": 0.0, "engine": 0.0}
    for i in range(a.pairs):
        for name in (("bare", "engine") if i % 2 == 0 else ("engine", "bare")):
            t0 = time.perf_counter()
            steps[name]()
            dt = time.perf_counter() - t0
            times[name].append(dt)
            t_all[name] += dt
    engine.heartbeat.stop()
    bare_ms = statistics.median(times["bare"]) * 1e3
    eng_ms = statistics.median(times["engine"]) * 1e3
    canary_cost = (statistics.fmean(canary_ms) / a.canary_every) if canary_ms and a.canary_every else 0.0
    tokens = engine.batch_size * opts.preset_spec.seq_len
    print(f"preset {a.preset} on {engine.spec.name}, batch {engine.batch_size} x {opts.preset_spec.seq_len} "
          f"({tokens} tokens/step), {a.pairs} alternating (bare, engine) step pairs; canary + GEMM check every "
          f"{a.canary_every} steps ({len(canary_ms)} ran, mean {statistics.fmean(canary_ms or [0]):.1f} ms)")
    print(f"bare loop:  median {bare_ms:.3f} ms/step ({tokens / bare_ms * 1e3:,.0f} tok/s)")
    print(f"engine:     median {eng_ms:.3f} ms/step ({tokens / eng_ms * 1e3:,.0f} tok/s) + canaries amortised "
          f"{canary_cost:.3f} ms/step")
    print(f"throughput engine/bare: {bare_ms / (eng_ms + canary_cost):.3f} (medians, canaries amortised; "
          f"goal >= 0.95); total wall time ratio {t_all['bare'] / t_all['engine']:.3f} (noisier)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
