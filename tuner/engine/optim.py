"""Muon for the transformer matrices, AdamW for the rest, as in nanochat (`nanochat/optim.py`, see docs/engine.md).

Muon, nanochat's current variant, one fused update per group of same-shape matrices (stacked):
Nesterov momentum -> MuonEq row equilibration -> Polar Express orthogonalisation (5 iterations, in the compute
dtype) -> Muon+ renormalisation to sqrt(min(rows, cols)) -> NorMuon variance reduction (a factored second
moment, beta2 0.95) -> cautious weight decay and the update, scaled by sqrt(max(1, rows/cols)).
AdamW: per parameter, the math in fp32 even for bf16 parameters (nanochat's embeddings), cast back after.

Hyper-parameters reach the update functions as 0-D CPU tensors, as nanochat does, so a compiled update is not
recompiled when the warm-up changes the learning rate or the momentum. `compile_updates()` swaps in compiled
versions (`torch.compile(fullgraph=True, dynamic=False)`); the eager ones compute the same thing.

Warm-up (presets that ask for it): the learning rates rise linearly over `lr_warmup_steps`, and Muon's
momentum goes from 0.85 to 0.95 over `momentum_warmup_steps` (nanochat's `get_muon_momentum`). Both count the
optimizer's own steps, so a fresh optimizer (a `--reference-loop` restart) warms up the same way again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from tuner.engine.model import GPT

# Polar Express coefficients for 5 iterations (Amsel et al., arXiv:2505.16932), as nanochat lists them.
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
MOMENTUM_START, MOMENTUM_END = 0.85, 0.95


def polar_express(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Approximately orthogonalise each matrix of a (..., rows, cols) stack (MuonEq first, Muon+ after)."""
    x = g.to(dtype)
    target = x.float().norm(dim=(-2, -1), keepdim=True) / (x.size(-2) ** 0.5)
    row_norm = x.float().norm(dim=-1, keepdim=True).clamp_min(1e-6)
    x = x * (target / row_norm).to(x.dtype)
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-6)
    if x.size(-2) > x.size(-1):  # tall
        for a, b, c in POLAR_EXPRESS[:steps]:
            m = x.mT @ x
            x = a * x + x @ (b * m + c * (m @ m))
    else:
        for a, b, c in POLAR_EXPRESS[:steps]:
            m = x @ x.mT
            x = a * x + (b * m + c * (m @ m)) @ x
    x = x.to(g.dtype)
    target_norm = min(x.size(-2), x.size(-1)) ** 0.5
    return x * (target_norm / x.float().norm(dim=(-2, -1), keepdim=True).clamp_min(1e-6)).to(x.dtype)


def muon_update(grads: torch.Tensor, params: torch.Tensor, momentum_buf: torch.Tensor, second_buf: torch.Tensor,
                momentum_t: torch.Tensor, lr_t: torch.Tensor, wd_t: torch.Tensor, beta2_t: torch.Tensor,
                ns_steps: int, red_dim: int, ns_dtype: torch.dtype) -> None:
    """One Muon step of a stack of same-shape matrices, in place on `params` and the buffers."""
    momentum = momentum_t.to(grads.dtype)
    momentum_buf.lerp_(grads, 1 - momentum)
    g = grads.lerp_(momentum_buf, momentum)  # Nesterov
    g = polar_express(g, ns_steps, ns_dtype).to(params.dtype)
    # NorMuon: per-row (or per-column) second moment, then rescale so the overall norm is kept
    beta2 = beta2_t.to(g.dtype)
    v_mean = g.float().square().mean(dim=red_dim, keepdim=True)
    red_size = g.size(red_dim)
    v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * red_size).sqrt()
    second_buf.lerp_(v_mean.to(second_buf.dtype), 1 - beta2)
    step_size = second_buf.clamp_min(1e-10).rsqrt()
    v_norm_new = ((v_mean * red_size) * step_size.float().square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    g = g * (step_size * (v_norm / v_norm_new.clamp_min(1e-10))).to(g.dtype)
    # cautious weight decay: only where the update and the weight agree in sign
    lr, wd = lr_t.to(g.dtype), wd_t.to(g.dtype)
    mask = (g * params) >= 0
    params.sub_(lr * g + lr * wd * params * mask)


def adamw_update(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                 step_t: torch.Tensor, lr_t: torch.Tensor, beta1_t: torch.Tensor, beta2_t: torch.Tensor,
                 eps_t: torch.Tensor, wd_t: torch.Tensor) -> None:
    """One AdamW step of one parameter, the math in fp32 (moments kept in fp32), the result cast back."""
    p32, g32 = p.float(), grad.float()
    p32.mul_(1 - lr_t * wd_t)
    exp_avg.lerp_(g32, 1 - beta1_t)
    exp_avg_sq.lerp_(g32.square(), 1 - beta2_t)
    bias1 = 1 - beta1_t ** step_t
    bias2 = 1 - beta2_t ** step_t
    denom = (exp_avg_sq / bias2).sqrt() + eps_t
    p32.add_(-(lr_t / bias1) * (exp_avg / denom))
    p.copy_(p32)


# the two signatures differ; each call site passes its kernel's arguments
_KERNELS: dict[str, Callable[..., None]] = {"muon": muon_update, "adamw": adamw_update}


def compile_updates() -> None:
    """Use compiled update functions from now on (each shape compiles once; hyper-parameters are tensors)."""
    if getattr(_KERNELS["muon"], "_tuner_compiled", False):
        return
    for name, fn in (("muon", muon_update), ("adamw", adamw_update)):
        compiled = torch.compile(fn, fullgraph=True, dynamic=False)
        compiled._tuner_compiled = True  # type: ignore[attr-defined]  # a marker: a Callable's type has no attributes
        _KERNELS[name] = compiled


def eager_updates() -> None:
    _KERNELS.update(muon=muon_update, adamw=adamw_update)


def _scalar(value: float) -> torch.Tensor:
    return torch.tensor(float(value), dtype=torch.float32)


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Learning-rate multiplier at optimizer step `step` (from 1): linear from 1/warmup to 1."""
    return 1.0 if warmup_steps <= 0 else min(1.0, step / warmup_steps)


def muon_momentum(step: int, warmup_steps: int, end: float = MOMENTUM_END) -> float:
    if warmup_steps <= 0:
        return end
    frac = min(step / warmup_steps, 1.0)
    return (1 - frac) * MOMENTUM_START + frac * end


class Muon:
    """Plain class, not a torch.optim.Optimizer: that base class imports torch._dynamo (seconds of start-up)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 0.02, momentum: float = 0.95,
                 weight_decay: float = 0.0, ns_steps: int = 5, ns_dtype: torch.dtype = torch.float32,
                 beta2: float = 0.95, lr_warmup_steps: int = 0, momentum_warmup_steps: int = 0) -> None:
        by_shape: dict[tuple[int, ...], list[torch.Tensor]] = {}
        for p in params:
            by_shape.setdefault(tuple(p.shape), []).append(p)
        self.groups = [ps for _, ps in sorted(by_shape.items())]
        self.lr, self.momentum, self.weight_decay, self.ns_steps = lr, momentum, weight_decay, ns_steps
        self.ns_dtype, self.beta2 = ns_dtype, beta2
        self.lr_warmup_steps, self.momentum_warmup_steps = lr_warmup_steps, momentum_warmup_steps
        self.t = 0
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._momentum_t, self._lr_t = _scalar(0), _scalar(0)
        self._wd_t, self._beta2_t = _scalar(weight_decay), _scalar(beta2)

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        self._momentum_t.fill_(muon_momentum(self.t, self.momentum_warmup_steps, self.momentum))
        base_lr = self.lr * warmup_factor(self.t, self.lr_warmup_steps)
        for gi, group in enumerate(self.groups):
            ps = [p for p in group if p.grad is not None]
            if not ps:
                continue
            rows, cols = ps[0].shape
            grads = torch.stack([p.grad for p in ps if p.grad is not None])  # all of ps (the test narrows the type)
            stacked = torch.stack(ps)
            bufs = self.buffers.get(gi)
            if bufs is None or bufs[0].shape != grads.shape:
                second_shape = (len(ps), rows, 1) if rows >= cols else (len(ps), 1, cols)
                bufs = self.buffers[gi] = (torch.zeros_like(grads),
                                           torch.zeros(second_shape, dtype=grads.dtype, device=grads.device))
            self._lr_t.fill_(base_lr * max(1.0, rows / cols) ** 0.5)
            _KERNELS["muon"](grads, stacked, bufs[0], bufs[1], self._momentum_t, self._lr_t, self._wd_t,
                             self._beta2_t, self.ns_steps, -1 if rows >= cols else -2, self.ns_dtype)
            torch._foreach_copy_(ps, list(stacked.unbind(0)))


class AdamW:
    """AdamW per parameter, math in fp32, per-group lr and betas."""

    def __init__(self, groups: list[dict[str, Any]], betas: tuple[float, float] = (0.8, 0.95), eps: float = 1e-10,
                 weight_decay: float = 0.0, lr_warmup_steps: int = 0) -> None:
        self.groups = [{"betas": betas, "weight_decay": weight_decay, **g} for g in groups]
        self.eps = eps
        self.lr_warmup_steps = lr_warmup_steps
        self.t = 0
        self.state: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._step_t, self._lr_t, self._b1_t, self._b2_t = _scalar(0), _scalar(0), _scalar(0), _scalar(0)
        self._eps_t, self._wd_t = _scalar(eps), _scalar(0)

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        self._step_t.fill_(self.t)
        scale = warmup_factor(self.t, self.lr_warmup_steps)
        for gi, g in enumerate(self.groups):
            ps = [p for p in g["params"] if p.grad is not None]
            if not ps:
                continue
            if gi not in self.state:
                self.state[gi] = [(torch.zeros_like(p, dtype=torch.float32),
                                   torch.zeros_like(p, dtype=torch.float32)) for p in ps]
            self._lr_t.fill_(g["lr"] * scale)
            self._b1_t.fill_(g["betas"][0])
            self._b2_t.fill_(g["betas"][1])
            self._wd_t.fill_(g["weight_decay"])
            for p, (m, v) in zip(ps, self.state[gi], strict=True):
                _KERNELS["adamw"](p, p.grad, m, v, self._step_t, self._lr_t, self._b1_t, self._b2_t,
                                  self._eps_t, self._wd_t)


def build_optimizers(model: GPT, *, lr_scale: float = 1.0, ns_dtype: torch.dtype = torch.float32,
                     weight_decay: float = 0.0, lr_warmup_steps: int = 0, momentum_warmup_steps: int = 0,
                     embedding_lr: float = 0.2) -> tuple[Muon, AdamW]:
    """(muon, adamw) with nanochat's learning rates, scaled by (width/768)^-0.5 for the AdamW groups."""
    s = (model.cfg.width / 768) ** -0.5
    muon = Muon(model.matrix_params(), lr=0.02 * lr_scale, momentum=0.95, ns_dtype=ns_dtype,
                weight_decay=weight_decay, lr_warmup_steps=lr_warmup_steps,
                momentum_warmup_steps=momentum_warmup_steps)
    groups = [
        {"params": [model.wte.weight], "lr": embedding_lr * s * lr_scale},
        {"params": [model.lm_head.weight], "lr": 0.004 * s * lr_scale},
        {"params": [model.resid_lambdas], "lr": 0.005 * lr_scale},
        {"params": [model.x0_lambdas], "lr": 0.5 * lr_scale, "betas": (0.96, 0.95)},
    ]
    ve = model.embedding_params()[1:]
    if ve:
        groups.append({"params": ve, "lr": embedding_lr * s * lr_scale})
    adam = AdamW(groups, betas=(0.8, 0.95), eps=1e-10, lr_warmup_steps=lr_warmup_steps)
    return muon, adam
