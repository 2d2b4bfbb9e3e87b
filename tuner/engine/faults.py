"""Fault injection, for tests and the simulated GPU. Kept apart from the detectors, which never see it.

- `bitflip@STEP[:weight|activation][:BIT]`: before step STEP's forward, flip bit BIT (default 22, the top
  mantissa bit: the value changes by up to half, stays finite) of one seeded-random element of a transformer
  matrix (weight), or of the output of one residual-stream projection during that forward (activation).
- `nan@STEP`: one element of a projection's output becomes NaN during step STEP's forward.
- `hang@STEP`: the engine stops everything, heartbeats included, at STEP (the runner does the hanging).
- `fault_rate` P: per training step, with probability P, one flip of a uniformly random bit in a random
  weight element (any parameter) or activation element (any Linear output, weighted by width); and, with the
  same P, one in each canary replay and each GEMM check (a miscomputing device gets those wrong too).

- simulated platform flaws (`PlatformFlaw`, the simulated GPU's `--sim-nondeterministic` and
  `--sim-contention-after`): before a training step, with probability 1/2, the lowest mantissa bit of one
  weight element flips, drawn from a generator seeded by the OS (so two processes differ, as two runs on a
  platform whose kernels are not deterministic do); with a contention time, only from that wall-clock time on.

All draws come from generators seeded by (fault seed, what, index), so a run's faults do not depend on timing
(platform flaws excepted: they must differ between runs).
The fault seed is the engine's `--fault-seed` (default `--seed`), apart from the seed of the data and weights, so
runs that share a reference trajectory can fail at different steps (the bisect gives every setting its own).
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tuner.engine.options import Injection
from tuner.engine.platform import INT_VIEW

if TYPE_CHECKING:
    from tuner.engine.model import GPT

EXPLICIT_BIT = 22


@dataclass(frozen=True)
class FlipRecord:
    step: int | None  # training step (None for canary / GEMM flips)
    where: str  # "weight", "activation", "canary", "gemm"
    tensor: str
    index: int
    bit: int  # -1 for a NaN write
    before: float
    after: float
    source: str  # "inject" or "rate"


def flip_bit_(t: torch.Tensor, index: int, bit: int) -> tuple[float, float]:
    """Flip bit `bit` of element `index` of the contiguous float tensor `t`, in place. Returns (before, after)."""
    view, nbits = INT_VIEW[t.dtype], torch.finfo(t.dtype).bits
    if not 0 <= bit < nbits:
        raise ValueError(f"bit {bit} out of range for {t.dtype}")
    flat = t.detach().view(-1)
    elem = flat[index : index + 1]
    before = float(elem.item())
    mask = (1 << bit) if bit < nbits - 1 else -(1 << bit)
    with torch.no_grad():
        elem.view(view).bitwise_xor_(mask)
    return before, float(elem.item())


def set_nan_(t: torch.Tensor, index: int) -> float:
    flat = t.detach().view(-1)
    before = float(flat[index].item())
    with torch.no_grad():
        flat[index] = float("nan")
    return before


class PlatformFlaw:
    """A simulated platform that does not repeat bit for bit: always (`nondeterministic`) or from the wall-clock
    time `contention_at` on (another process starts using the GPU); how, the module docstring says."""

    PROBABILITY = 0.5

    def __init__(self, nondeterministic: bool = False, contention_at: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.nondeterministic, self.contention_at, self.clock = nondeterministic, contention_at, clock
        self.rng = random.Random(int.from_bytes(os.urandom(8), "little"))

    def active(self) -> bool:
        return self.nondeterministic or (self.contention_at is not None and self.clock() >= self.contention_at)

    def perturb(self, model: torch.nn.Module) -> None:
        if not self.active() or self.rng.random() >= self.PROBABILITY:
            return
        params = [p for p in model.parameters() if p.ndim == 2]
        p = params[self.rng.randrange(len(params))]
        flip_bit_(p.data, self.rng.randrange(p.numel()), 0)


class FaultInjector:
    def __init__(self, injections: list[Injection] | None = None, fault_rate: float = 0.0, seed: int = 0,
                 log: Callable[[str], None] | None = None, flaw: PlatformFlaw | None = None) -> None:
        self.flaw = flaw or PlatformFlaw()
        self.injections = list(injections or [])
        self.fault_rate, self.seed = fault_rate, seed
        self.records: list[FlipRecord] = []
        self._handles: list = []
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    def _rng(self, what: str, index: int) -> random.Random:
        return random.Random(f"tuner-engine-faults:{self.seed}:{what}:{index}")

    def _record(self, rec: FlipRecord) -> None:
        self.records.append(rec)
        change = "NaN" if rec.bit < 0 else f"bit {rec.bit}"
        where = f"step {rec.step}" if rec.step is not None else rec.where
        self._log(f"inject ({rec.source}): {where}: {change} of {rec.tensor}[{rec.index}]: "
                  f"{rec.before!r} -> {rec.after!r}")

    def hang_at(self, step: int) -> bool:
        return any(i.kind == "hang" and i.step == step for i in self.injections)

    # --- training steps ---------------------------------------------------------------------------------------

    def before_train_step(self, step: int, model: GPT) -> None:
        self.flaw.perturb(model)  # the simulated platform flaw, if any (the start-up check's steps too)
        for inj in self.injections:
            if inj.step != step or inj.kind == "hang":
                continue
            rng = self._rng(f"inject-{inj.kind}", step)
            bit = EXPLICIT_BIT if inj.bit is None else inj.bit  # unused by a NaN write
            if inj.kind == "bitflip" and inj.target == "weight":
                params = [(n, p) for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("blocks.")]
                name, p = self._pick_weighted(params, rng)
                self.flip_weight(p, name, rng.randrange(p.numel()), bit, step=step, source="inject")
            else:  # a NaN, or a flip, in the output of one residual-stream projection
                residual = [(n, m) for n, m in model.linear_modules() if n.endswith("c_proj")]
                name, module = residual[rng.randrange(len(residual))]
                self.arm_activation(module, name, rng, step=step, source="inject", bit=bit, nan=inj.kind == "nan")
        if self.fault_rate > 0:
            rng = self._rng("rate-train", step)
            if rng.random() < self.fault_rate:
                if rng.random() < 0.5:
                    params = list(model.named_parameters())
                    name, p = self._pick_weighted(params, rng)
                    self.flip_weight(p, name, rng.randrange(p.numel()), rng.randrange(torch.finfo(p.dtype).bits),
                                     step=step, source="rate")
                else:
                    self._arm_random_activation(model, rng, step=step, where="activation")

    # --- canary and GEMM --------------------------------------------------------------------------------------

    @contextmanager
    def during_canary(self, model: GPT, index: int) -> Iterator[None]:
        try:
            if self.fault_rate > 0:
                rng = self._rng("rate-canary", index)
                if rng.random() < self.fault_rate:
                    self._arm_random_activation(model, rng, step=None, where="canary")
            yield
        finally:
            self.disarm()

    def tamper_gemm(self, outputs: list[torch.Tensor], index: int) -> None:
        if self.fault_rate <= 0:
            return
        rng = self._rng("rate-gemm", index)
        if rng.random() < self.fault_rate:
            i = rng.randrange(len(outputs))
            out = outputs[i]
            elem = rng.randrange(out.numel())
            bit = rng.randrange(torch.finfo(out.dtype).bits)
            before, after = flip_bit_(out, elem, bit)
            self._record(FlipRecord(None, "gemm", f"gemm_output_{i}", elem, bit, before, after, "rate"))

    # --- primitives (also used by bench/engine_detection.py) --------------------------------------------------

    @staticmethod
    def _pick_weighted(named: Sequence[tuple[str, torch.Tensor]], rng: random.Random) -> tuple[str, torch.Tensor]:
        total = sum(t.numel() for _, t in named)
        r = rng.randrange(total)
        for name, t in named:
            if r < t.numel():
                return name, t
            r -= t.numel()
        return named[-1]

    def flip_weight(self, p: torch.Tensor, name: str, index: int, bit: int, *, step: int | None,
                    source: str) -> FlipRecord:
        before, after = flip_bit_(p.data, index, bit)
        rec = FlipRecord(step, "weight", name, index, bit, before, after, source)
        self._record(rec)
        return rec

    def _arm_random_activation(self, model: GPT, rng: random.Random, *, step: int | None,
                               where: str) -> None:
        modules = model.linear_modules()
        name, _ = self._pick_weighted([(n, m.weight[:, 0]) for n, m in modules], rng)  # weight by width
        self.arm_activation(dict(modules)[name], name, rng, step=step, source="rate", where=where)

    def arm_activation(self, module: torch.nn.Module, name: str, rng: random.Random, *, step: int | None,
                       source: str, where: str = "activation", bit: int | None = None, nan: bool = False) -> None:
        """On `module`'s next forward, flip one bit (random if `bit` is None) of one random element of its output,
        or write a NaN there."""

        def hook(_module: torch.nn.Module, _inputs: tuple[object, ...], output: torch.Tensor) -> torch.Tensor:
            handle.remove()
            out = output.clone()
            idx = rng.randrange(out.numel())
            if nan:
                before, after, b = set_nan_(out, idx), float("nan"), -1
            else:
                b = rng.randrange(torch.finfo(out.dtype).bits) if bit is None else bit
                before, after = flip_bit_(out, idx, b)
            self._record(FlipRecord(step, where, f"{name}.output", idx, b, before, after, source))
            return out

        handle = module.register_forward_hook(hook)
        self._handles.append(handle)

    def disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
