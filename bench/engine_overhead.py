"""Overhead of the engine's checks: engine steps with every detector on vs a bare training loop.

Same process, same model, optimizer and batch size, alternating blocks of steps between the two so that CPU
noise (other processes, frequency changes) hits both alike. "Engine" is `Engine.step_once()`: fault-injection
hooks (none armed), the raw gradient norm, one host sync for loss and norm, the `step` event serialised to
/dev/null, the non-finite check, the reference comparison (its verdict ignored: the alternating bare steps make
the trajectory diverge from any recording), the recorder, soft signals, a canary replay + GEMM check every
--canary-every steps, and the heartbeat thread. "Bare" is forward, backward, Muon + AdamW, and `loss.item()`.

    python bench/engine_overhead.py [--preset tiny] [--blocks 30] [--block-steps 20] [--canary-every 100]

Prints the median step time of each, and throughput ratio engine/bare (the goal is >= 0.95).
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
    def check(self, step, loss, grad_norm):  # compares, then drops the verdict
        super().check(step, loss, grad_norm)


class _AnyStepRecorder(TrajectoryRecorder):
    def append(self, step, loss, grad_norm):
        self.digests.append(step_digest(loss, grad_norm))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--blocks", type=int, default=30, help="blocks of each kind (default 30)")
    ap.add_argument("--block-steps", type=int, default=20, help="steps per block (default 20)")
    ap.add_argument("--canary-every", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()

    total = 2 * a.blocks * a.block_steps + a.warmup + 10
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the run
    opts = EngineOptions(device=a.device, preset=a.preset, steps=total, canary_every=a.canary_every,
                         canary_every_s=60.0)
    engine = Engine(opts, Emitter(devnull), log=lambda m: None)
    engine.setup()
    engine.heartbeat = Heartbeat(engine.em, engine.heartbeat_status, opts.heartbeat_s).start()
    engine._loop_start = time.monotonic()
    engine.trajectory = _ComparingButNeverFailing([step_digest(1.0, 1.0)] * total)
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

    def engine_step() -> None:
        engine.step_once()

    for _ in range(a.warmup):
        bare_step()
        engine_step()
    per_block = {"bare": [], "engine": []}
    for b in range(a.blocks):
        order = (("bare", bare_step), ("engine", engine_step)) if b % 2 == 0 else \
                (("engine", engine_step), ("bare", bare_step))
        for name, fn in order:
            t0 = time.perf_counter()
            for _ in range(a.block_steps):
                fn()
            per_block[name].append((time.perf_counter() - t0) / a.block_steps)
    engine.heartbeat.stop()
    bare_ms = statistics.median(per_block["bare"]) * 1e3
    eng_ms = statistics.median(per_block["engine"]) * 1e3
    ratios = [b / e for b, e in zip(per_block["bare"], per_block["engine"])]
    tokens = engine.batch_size * opts.preset_spec.seq_len
    print(f"preset {a.preset} on {engine.spec.name}, batch {engine.batch_size} x {opts.preset_spec.seq_len} "
          f"({tokens} tokens/step), {a.blocks} alternating blocks of {a.block_steps} steps each, "
          f"canary every {a.canary_every} steps ({engine.canary_count} canaries ran)")
    print(f"bare loop:   median {bare_ms:.2f} ms/step  ({tokens / bare_ms * 1e3:,.0f} tok/s)")
    print(f"engine:      median {eng_ms:.2f} ms/step  ({tokens / eng_ms * 1e3:,.0f} tok/s)")
    print(f"throughput engine/bare: {bare_ms / eng_ms:.3f} (ratio of medians); per block pair: median "
          f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}  (goal >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
