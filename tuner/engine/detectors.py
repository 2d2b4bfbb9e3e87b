"""Failure detectors. Each is a small unit that is given measurements and says whether they are wrong.

None of them knows anything about fault injection: the runner measures, the injector (faults.py) may tamper
with the computation, and the detectors only compare.

Hard detectors return a `Finding` (the run fails):
- NonFiniteDetector   raw per-step loss and gradient norm; the first NaN/Inf fails.   kind "nonfinite"
- ReferenceTrajectory per-step digests vs a recorded stock run, bitwise.               kind "mismatch"
- CanaryReplay        fixed batch through frozen initial weights, vs its first result.  kind "canary"
- GemmCheck           the same matmul N times, each bitwise vs the first (gpu-burn).    kind "gemm"
- device errors       CUDA/HIP runtime errors (see patterns.py).                        kind "device-error"
The soft detector returns `SoftWarning`s (never a failure by itself; the runner schedules an extra canary):
- SoftSignals         loss spike (rolling median + 6 MAD), gradient-norm spike, throughput drop.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import statistics
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tuner.core.errors import first_line
from tuner.engine.patterns import match_device_error
from tuner.engine.platform import INT_VIEW
from tuner.engine.reference import digest_values, f32_bits, step_digest

if TYPE_CHECKING:
    from tuner.engine.model import GPT


@dataclass(frozen=True)
class Finding:
    kind: str
    detail: str
    figure: str | None = None  # the first figure that differed: "loss", "grad_norm", "state" (reference only)


@dataclass(frozen=True)
class SoftWarning:
    kind: str  # "loss-spike", "grad-spike", "throughput-drop"
    detail: str


# each figure of a step digest (reference.step_digest): its hex digits, and the checksums' names in a finding
DIGEST_SPANS = {"loss": slice(0, 8), "grad_norm": slice(8, 16), "state": slice(16, 32), "grads": slice(32, 48)}
CHECKSUMS = {"state": "the training state's bit checksum (parameters and optimizer state)",
             "grads": "this rank's own gradients' bit checksum"}


def first_differing(got: str, want: str) -> str | None:
    """The figure two step digests are said to differ in (None if they do not): the rank's own figures first;
    with data-parallel ranks "state" (after the all-reduce) is the group's."""
    return next((name for name in ("loss", "grad_norm", "grads", "state")
                 if got[DIGEST_SPANS[name]] != want[DIGEST_SPANS[name]]), None)


class NonFiniteDetector:
    kind = "nonfinite"

    def check(self, loss: float, grad_norm: float) -> Finding | None:
        bad = [name for name, v in (("loss", loss), ("grad_norm", grad_norm)) if not math.isfinite(v)]
        if not bad:
            return None
        return Finding(self.kind, f"non-finite {' and '.join(bad)} (loss {loss!r}, grad_norm {grad_norm!r})")


def bit_checksum(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """An exact, order-independent checksum of the tensors' bits: the int64 sum of their elements viewed as
    integers (wrapping). Any single bit flip changes it by +-2^bit, so it can never cancel out by itself."""
    return torch.stack([t.detach().view(INT_VIEW[t.dtype]).sum(dtype=torch.int64) for t in tensors]).sum()


class ReferenceTrajectory:
    """Compares each step's digest (raw loss bits, raw gradient-norm bits and the parameters' bit checksum
    after the update) with a recorded run's.

    Bitwise by default. With `tolerance` (the platform was not repeatable) it compares values instead:
    relative loss difference above `tolerance`, or a gradient norm off by more than 100 %, fails ("reduced
    sensitivity": it only catches gross divergence). Steps past the reference's end are counted, not compared.
    """

    kind = "mismatch"

    def __init__(self, digests: list[str], tolerance: float | None = None) -> None:
        self.digests, self.tolerance = digests, tolerance
        self.compared = 0
        self.beyond = 0

    @property
    def reference_steps(self) -> int:
        return len(self.digests)

    def check(self, step: int, loss: float, grad_norm: float, param_sum: int | None = None,
              grad_sum: int | None = None) -> Finding | None:
        i = step - 1
        if i >= len(self.digests):
            self.beyond += 1
            return None
        self.compared += 1
        want = self.digests[i]
        got = step_digest(loss, grad_norm, param_sum if len(want) > 16 else None, grad_sum if len(want) > 32 else None)
        if self.tolerance is None and got == want:
            return None
        ref_loss, ref_gn = digest_values(want)
        figure = first_differing(got, want)
        if self.tolerance is not None:
            if _rel_diff([loss], [ref_loss]) <= self.tolerance and _rel_diff([grad_norm], [ref_gn]) <= 1.0:
                return None
        elif figure in CHECKSUMS:  # the same loss and grad_norm bits
            what = CHECKSUMS[figure] + (" (before the all-reduce)" if figure == "grads" else "")
            span = DIGEST_SPANS[figure]
            return Finding(self.kind, f"step {step} differs from the reference: same loss and grad_norm bits, but "
                                      f"{what} is {got[span]}, not {want[span]}", figure)
        # Name only the figures whose bits differ: a one-ulp grad-norm change prints like "x vs x" otherwise.
        named = {"loss": f"loss {loss!r} vs {ref_loss!r}", "grad_norm": f"grad_norm {grad_norm!r} vs {ref_gn!r}",
                 **CHECKSUMS}
        differing = [named[name] for name, span in DIGEST_SPANS.items() if got[span] != want[span]]
        return Finding(
            self.kind,
            f"step {step} differs from the reference: {', '.join(differing)} (digest {got} vs {want})",
            figure,
        )


class TrajectoryRecorder:
    def __init__(self) -> None:
        self.digests: list[str] = []

    def append(self, step: int, loss: float, grad_norm: float, param_sum: int | None = None,
               grad_sum: int | None = None) -> None:
        if step != len(self.digests) + 1:
            raise ValueError(f"recorder got step {step} after {len(self.digests)}")
        self.digests.append(step_digest(loss, grad_norm, param_sum, grad_sum))


@dataclass(frozen=True)
class CanarySample:
    loss: float
    stats: tuple[float, ...]  # per parameter: gradient sum, then gradient L2 norm
    bits: tuple[int, ...] = ()  # bit checksums of all gradients and of all (frozen) weights

    def values(self) -> tuple[float, ...]:
        return (self.loss, *self.stats)

    def digest(self) -> str:
        packed = struct.pack(f"<{len(self.values())}f", *self.values())
        packed += struct.pack(f"<{len(self.bits)}Q", *(b & 0xFFFFFFFFFFFFFFFF for b in self.bits))
        return hashlib.sha256(packed).hexdigest()[:16]

    def same_bits(self, other: CanarySample) -> bool:
        """Bit for bit the same result: every figure's float32 bits and every checksum."""
        return self.bits == other.bits and [*map(f32_bits, self.values())] == [*map(f32_bits, other.values())]


class CanaryReplay:
    """A fixed batch through frozen weights, forward and backward; the result must never change.

    `measure()` runs it; `calibrate(samples)` takes the first of several start-up runs as the golden result and
    says whether they were all bitwise equal (if not, later comparisons use a tolerance of 4x the observed
    spread: "reduced sensitivity"); `check(sample)` compares a later run with the golden one.
    """

    kind = "canary"

    def __init__(self, model: GPT, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.model, self.inputs, self.targets = model, inputs, targets
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.golden: CanarySample | None = None
        self.tolerance: float | None = None

    def measure(self) -> CanarySample:
        self.model.zero_grad(set_to_none=True)
        loss = self.model(self.inputs, self.targets)
        loss.backward()
        raw: list[torch.Tensor] = []
        for p in self.params:
            assert p.grad is not None  # the backward just gave every trainable parameter a gradient
            raw.append(p.grad)
        grads = [g.float() for g in raw]
        sums = torch.stack([g.sum() for g in grads])
        norms = torch.stack(torch._foreach_norm(grads))
        vals = torch.cat([loss.detach().float().reshape(1), sums, norms]).cpu().tolist()
        bits = torch.stack([bit_checksum(raw), bit_checksum(self.params)]).cpu().tolist()
        self.model.zero_grad(set_to_none=True)
        return CanarySample(vals[0], tuple(vals[1:]), tuple(bits))

    def calibrate(self, samples: list[CanarySample]) -> bool:
        self.golden = samples[0]
        repeatable = all(s.same_bits(self.golden) for s in samples)
        if not repeatable:
            spread = max(_rel_diff(s.values(), self.golden.values()) for s in samples)
            self.tolerance = max(4 * spread, 1e-6)
        return repeatable

    def check(self, sample: CanarySample) -> Finding | None:
        if self.golden is None:
            raise RuntimeError("canary not calibrated")
        a, b = sample.values(), self.golden.values()
        agrees = sample.same_bits(self.golden) if self.tolerance is None else _rel_diff(a, b) <= self.tolerance
        if agrees:
            return None
        where = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if f32_bits(x) != f32_bits(y)), None)
        if where is None:
            names = ("gradients", "frozen weights")
            what = "bit checksum of the " + " and ".join(
                n for n, x, y in zip(names, sample.bits, self.golden.bits, strict=False) if x != y)
        else:
            what = f"{'loss' if where == 0 else f'gradient statistic #{where}'} {a[where]!r} vs {b[where]!r}"
        return Finding(self.kind, f"canary replay differs from its first result: {what} "
                                  f"(digest {sample.digest()} vs {self.golden.digest()})")


def _rel_diff(a: Iterable[float], b: Iterable[float]) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=False):
        if not (math.isfinite(x) and math.isfinite(y)):
            return math.inf
        worst = max(worst, abs(x - y) / max(abs(y), 1e-12))
    return worst


class GemmCheck:
    """gpu-burn's method: C = A @ B computed `repeats` times from the same A and B, each compared bitwise with
    the first result (`calibrate`) or, on a platform that is not repeatable, within 4x the observed spread."""

    kind = "gemm"

    def __init__(self, n: int, dtype: torch.dtype, device: torch.device, repeats: int = 4, seed: int = 10) -> None:
        g = torch.Generator().manual_seed(seed)
        self.n, self.repeats = n, repeats
        self.a = (torch.rand(n, n, generator=g) * 2 - 1).to(device=device, dtype=dtype)
        self.b = (torch.rand(n, n, generator=g) * 2 - 1).to(device=device, dtype=dtype)
        self.golden: torch.Tensor | None = None
        self.tolerance: float | None = None

    @property
    def flops(self) -> int:
        return 2 * self.n**3 * self.repeats

    def compute(self) -> list[torch.Tensor]:
        return [self.a @ self.b for _ in range(self.repeats)]

    def calibrate(self, outputs: list[torch.Tensor]) -> bool:
        self.golden = outputs[0].clone()
        diffs = [self._max_abs_diff(o) for o in outputs]
        if all(d == 0 and self._bit_equal(o) for d, o in zip(diffs, outputs, strict=False)):
            return True
        self.tolerance = max(4 * max(diffs), 1e-6)
        return False

    def _bit_equal(self, out: torch.Tensor) -> bool:
        assert self.golden is not None  # set by `calibrate`, before any comparison
        view = INT_VIEW[out.dtype]
        return torch.equal(out.view(view), self.golden.view(view))

    def _max_abs_diff(self, out: torch.Tensor) -> float:
        assert self.golden is not None  # set by `calibrate`, before any comparison
        return float((out.float() - self.golden.float()).abs().max())

    def compare(self, outputs: list[torch.Tensor]) -> Finding | None:
        if self.golden is None:
            raise RuntimeError("GEMM check not calibrated")
        for i, out in enumerate(outputs):
            if self.tolerance is None and self._bit_equal(out):
                continue
            diff = self._max_abs_diff(out)
            if self.tolerance is not None and diff <= self.tolerance:
                continue
            view = INT_VIEW[out.dtype]
            wrong = int((out.view(view) != self.golden.view(view)).sum())
            return Finding(self.kind, f"GEMM {self.n}x{self.n} repeat {i + 1}/{len(outputs)}: {wrong} element(s) "
                                      f"differ from the first result, max |diff| {diff:.6g}")
        return None


def device_error(exc: BaseException) -> Finding | None:
    """A CUDA/HIP runtime error in an exception (illegal memory access and friends), else None."""
    label = match_device_error(f"{type(exc).__name__}: {exc}")
    if label is None and type(exc).__name__ == "AcceleratorError":
        label = "accelerator error"
    if label is None:
        return None
    return Finding("device-error", f"{label}: {first_line(exc)}")


class SoftSignals:
    """Warnings, never failures: loss above rolling median + k x MAD, gradient norm above `grad_factor` x its
    rolling median, recent throughput below `tput_ratio` of the run's median. Each kind is quiet for
    `cooldown_steps` after it fires. Non-finite values are ignored (the non-finite detector owns them)."""

    def __init__(self, window: int = 100, min_history: int = 20, mad_k: float = 6.0, grad_factor: float = 10.0,
                 tput_ratio: float = 0.9, tput_window: int = 20, tput_min_history: int = 50,
                 cooldown_steps: int = 50) -> None:
        self.mad_k, self.grad_factor, self.tput_ratio = mad_k, grad_factor, tput_ratio
        self.min_history, self.tput_window, self.tput_min_history = min_history, tput_window, tput_min_history
        self.cooldown_steps = cooldown_steps
        self.losses: deque[float] = deque(maxlen=window)
        self.grad_norms: deque[float] = deque(maxlen=window)
        self.recent_tput: deque[float] = deque(maxlen=tput_window)
        self.all_tput: list[float] = []  # sorted
        self._last: dict[str, int] = {}

    def _ready(self, kind: str, step: int) -> bool:
        last = self._last.get(kind)
        return last is None or step - last >= self.cooldown_steps

    def observe(self, step: int, loss: float, grad_norm: float, tok_s: float | None,
                steady: bool) -> list[SoftWarning]:
        out: list[SoftWarning] = []
        if math.isfinite(loss):
            if len(self.losses) >= self.min_history and self._ready("loss-spike", step):
                med = statistics.median(self.losses)
                mad = statistics.median(abs(x - med) for x in self.losses)
                limit = med + self.mad_k * max(mad, 1e-3 * abs(med), 1e-6)
                if loss > limit:
                    out.append(SoftWarning("loss-spike", f"loss {loss:.4f} > median {med:.4f} + "
                                                         f"{self.mad_k:g} MAD ({limit:.4f})"))
            self.losses.append(loss)
        if math.isfinite(grad_norm):
            if len(self.grad_norms) >= self.min_history and self._ready("grad-spike", step):
                med = statistics.median(self.grad_norms)
                if med > 0 and grad_norm > self.grad_factor * med:
                    out.append(SoftWarning("grad-spike", f"grad_norm {grad_norm:.4g} > {self.grad_factor:g} x "
                                                         f"median {med:.4g}"))
            self.grad_norms.append(grad_norm)
        if steady and tok_s is not None and tok_s > 0:
            self.recent_tput.append(tok_s)
            bisect.insort(self.all_tput, tok_s)
            if (len(self.all_tput) >= self.tput_min_history and len(self.recent_tput) == self.tput_window
                    and self._ready("throughput-drop", step)):
                run_med = self.all_tput[len(self.all_tput) // 2]
                recent = statistics.median(self.recent_tput)
                if recent < self.tput_ratio * run_med:
                    out.append(SoftWarning("throughput-drop", f"last {self.tput_window} steps {recent:,.0f} tok/s "
                                                              f"< {self.tput_ratio:.0%} of the run's median "
                                                              f"{run_med:,.0f}"))
        for w in out:
            self._last[w.kind] = step
        return out
