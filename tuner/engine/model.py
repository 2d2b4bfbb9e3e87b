"""A decoder-only transformer in nanochat's style (karpathy/nanochat `nanochat/gpt.py`), byte-level.

Rotary embeddings (base 100,000), QK-norm, parameter-free RMSNorm pre-norm, ReLU^2 MLP, no biases, untied
embedding and head, logit soft-cap 15, per-layer residual and x0 mixing scalars. Master weights are fp32;
`CastedLinear` casts its weight to the activation (compute) dtype in forward, which replaces autocast.

Differences from nanochat, on purpose: vocabulary 256 (token = byte, so loss / ln 2 = bits per byte); no value
embeddings, smear gate, backout or sliding windows (SDPA full causal attention everywhere, as on ROCm); the
output projections start small instead of zero, so the canary (frozen initial weights) exercises every path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256
SOFTCAP = 15.0
ROPE_BASE = 100_000.0


@dataclass(frozen=True)
class GPTConfig:
    depth: int
    width: int
    head_dim: int
    seq_len: int
    vocab: int = VOCAB

    @property
    def n_head(self) -> int:
        return self.width // self.head_dim


def norm(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm over the last dimension."""
    return F.rms_norm(x, (x.size(-1),))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, H, D); cos/sin: (1, T, 1, D/2)."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


class CastedLinear(nn.Linear):
    """A bias-free Linear whose fp32 master weight is cast to the input's dtype in forward."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        inner = cfg.n_head * cfg.head_dim
        self.c_q = CastedLinear(cfg.width, inner)
        self.c_k = CastedLinear(cfg.width, inner)
        self.c_v = CastedLinear(cfg.width, inner)
        self.c_proj = CastedLinear(inner, cfg.width)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.c_q(x).view(b, t, self.n_head, self.head_dim)
        k = self.c_k(x).view(b, t, self.n_head, self.head_dim)
        v = self.c_v(x).view(b, t, self.n_head, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k = norm(q) * 1.2, norm(k) * 1.2  # QK-norm, then nanochat's 1.2 gain
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = CastedLinear(cfg.width, 4 * cfg.width)
        self.c_proj = CastedLinear(4 * cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.attn = CausalSelfAttention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(norm(x), cos, sin)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg, self.compute_dtype = cfg, compute_dtype
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.lm_head = CastedLinear(cfg.width, cfg.vocab)
        self.resid_lambdas = nn.Parameter(torch.ones(cfg.depth))
        self.x0_lambdas = nn.Parameter(torch.zeros(cfg.depth))
        cos, sin = self._rotary(cfg.seq_len, cfg.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @staticmethod
    def _rotary(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
        return freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """nanochat's init (see module docstring for the projections), drawn from `generator` on the CPU."""

        def fill(p: torch.Tensor, kind: str, scale: float) -> None:
            cpu = torch.empty(p.shape, dtype=torch.float32)
            if kind == "normal":
                cpu.normal_(0.0, scale, generator=generator)
            else:
                cpu.uniform_(-scale, scale, generator=generator)
            p.copy_(cpu)

        d = self.cfg.width
        bound = math.sqrt(3.0) / math.sqrt(d)
        fill(self.wte.weight, "normal", 0.8)
        fill(self.lm_head.weight, "normal", 0.001)
        for i, block in enumerate(self.blocks):
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v):
                fill(lin.weight, "uniform", bound)
            fill(block.mlp.c_fc.weight, "uniform", 0.4 * bound)
            fill(block.attn.c_proj.weight, "uniform", 0.1 * bound)
            fill(block.mlp.c_proj.weight, "uniform", 0.05 * bound)
            frac = i / max(1, self.cfg.depth - 1)
            self.resid_lambdas[i] = 1.15 - 0.10 * frac
            self.x0_lambdas[i] = 0.20 - 0.15 * frac

    def set_compute_dtype(self, dtype: torch.dtype) -> None:
        self.compute_dtype = dtype

    def forward(self, idx: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy (nats per byte) of `targets` given `idx`, both (B, T) int64. fp32 logits, soft-capped."""
        t = idx.size(1)
        cos = self.cos[:, :t].to(self.compute_dtype)
        sin = self.sin[:, :t].to(self.compute_dtype)
        x = norm(self.wte(idx).to(self.compute_dtype))
        x0 = x
        for i, block in enumerate(self.blocks):
            x = self.resid_lambdas[i].to(x.dtype) * x + self.x0_lambdas[i].to(x.dtype) * x0
            x = block(x, cos, sin)
        logits = self.lm_head(norm(x)).float()
        logits = SOFTCAP * torch.tanh(logits / SOFTCAP)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
        if reduction == "none":
            return loss.view(targets.shape)
        return loss.mean()

    def flatten_parameters_(self) -> torch.Tensor:
        """Move every parameter into one contiguous fp32 buffer (each parameter becomes a view of it) and return
        the buffer, so whole-model reductions such as the bit checksum are one kernel."""
        params = list(self.parameters())
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        offset = 0
        for p in params:
            n = p.numel()
            p.data = flat[offset:offset + n].view_as(p)
            offset += n
        return flat

    def matrix_params(self) -> list[nn.Parameter]:
        """The transformer's 2-D matrices (Muon). Embedding, head and scalars go to AdamW."""
        return [p for p in self.blocks.parameters() if p.ndim == 2]

    def linear_modules(self) -> list[tuple[str, CastedLinear]]:
        return [(n, m) for n, m in self.named_modules() if isinstance(m, CastedLinear)]

    def flops_per_token(self) -> int:
        """nanochat's estimate: 6 x (matmul weights incl. head) + 12 x layers x heads x head_dim x T."""
        c = self.cfg
        n_matmul = sum(m.weight.numel() for _, m in self.linear_modules())
        return 6 * n_matmul + 12 * c.depth * c.n_head * c.head_dim * c.seq_len
