"""Muon for the transformer matrices, AdamW for the rest, as in nanochat (`nanochat/optim.py`), simplified.

Muon: Nesterov momentum, then Newton-Schulz orthogonalisation (5 quintic iterations of X X^T matmuls, batched
over all matrices of one shape, in the compute dtype), scaled by sqrt(max(1, rows/cols)). nanochat's extras
(Polar Express coefficients, NorMuon, cautious weight decay) are left out; the matmul load is the same kind.
"""

from __future__ import annotations

from collections import defaultdict

import torch

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Approximately orthogonalise each matrix of a (..., rows, cols) stack."""
    a, b, c = NS_COEFFS
    x = g.to(dtype)
    transposed = x.size(-2) > x.size(-1)
    if transposed:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        m = x @ x.mT
        x = a * x + (b * m + c * (m @ m)) @ x
    if transposed:
        x = x.mT
    return x


class Muon:
    """Plain class, not a torch.optim.Optimizer: that base class imports torch._dynamo (seconds of start-up)."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0,
                 ns_steps: int = 5, ns_dtype: torch.dtype = torch.float32):
        by_shape: dict[tuple, list] = defaultdict(list)
        for p in params:
            by_shape[tuple(p.shape)].append(p)
        self.groups = [ps for _, ps in sorted(by_shape.items())]
        self.lr, self.momentum, self.weight_decay, self.ns_steps = lr, momentum, weight_decay, ns_steps
        self.ns_dtype = ns_dtype
        self.buffers: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def step(self) -> None:
        lr, mom, wd = self.lr, self.momentum, self.weight_decay
        for gi, group in enumerate(self.groups):
            ps = [p for p in group if p.grad is not None]
            if not ps:
                continue
            grads = torch.stack([p.grad for p in ps])
            buf = self.buffers.get(gi)
            if buf is None or buf.shape != grads.shape:
                buf = self.buffers[gi] = torch.zeros_like(grads)
            buf.lerp_(grads, 1 - mom)
            update = grads.lerp_(buf, mom)  # Nesterov
            update = newton_schulz(update, self.ns_steps, self.ns_dtype).to(grads.dtype)
            rows, cols = ps[0].shape
            update.mul_(max(1.0, rows / cols) ** 0.5)
            if wd:
                torch._foreach_mul_(ps, 1 - lr * wd)
            torch._foreach_add_(ps, list(update.unbind(0)), alpha=-lr)


class AdamW:
    """AdamW with foreach kernels, math in fp32 (the master weights' dtype), per-group lr and betas."""

    def __init__(self, groups: list[dict], betas=(0.8, 0.95), eps: float = 1e-10, weight_decay: float = 0.0):
        self.groups = [{"betas": betas, "weight_decay": weight_decay, **g} for g in groups]
        self.eps = eps
        self.t = 0
        self.state: dict[int, tuple[list, list]] = {}

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        for gi, g in enumerate(self.groups):
            ps = [p for p in g["params"] if p.grad is not None]
            if not ps:
                continue
            grads = [p.grad for p in ps]
            if gi not in self.state:
                self.state[gi] = ([torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps])
            m, v = self.state[gi]
            b1, b2 = g["betas"]
            torch._foreach_lerp_(m, grads, 1 - b1)
            torch._foreach_mul_(v, b2)
            torch._foreach_addcmul_(v, grads, grads, 1 - b2)
            bc1, bc2 = 1 - b1**self.t, 1 - b2**self.t
            denom = torch._foreach_sqrt(v)
            torch._foreach_div_(denom, bc2**0.5)
            torch._foreach_add_(denom, self.eps)
            if g["weight_decay"]:
                torch._foreach_mul_(ps, 1 - g["lr"] * g["weight_decay"])
            torch._foreach_addcdiv_(ps, m, denom, -g["lr"] / bc1)


def build_optimizers(model, *, lr_scale: float = 1.0, ns_dtype: torch.dtype = torch.float32):
    """(muon, adamw) with nanochat's learning rates, scaled by (width/768)^-0.5 for the AdamW groups."""
    s = (model.cfg.width / 768) ** -0.5
    muon = Muon(model.matrix_params(), lr=0.02 * lr_scale, momentum=0.95, ns_dtype=ns_dtype)
    adam = AdamW(
        [
            {"params": [model.wte.weight], "lr": 0.2 * s * lr_scale},
            {"params": [model.lm_head.weight], "lr": 0.004 * s * lr_scale},
            {"params": [model.resid_lambdas], "lr": 0.005 * lr_scale},
            {"params": [model.x0_lambdas], "lr": 0.5 * lr_scale, "betas": (0.96, 0.95)},
        ],
        betas=(0.8, 0.95), eps=1e-10,
    )
    return muon, adam
