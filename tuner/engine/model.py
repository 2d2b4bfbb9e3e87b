"""A decoder-only transformer in nanochat's style (karpathy/nanochat `nanochat/gpt.py`, see docs/engine.md).

Rotary embeddings (base 100,000), QK-norm (x1.2), parameter-free RMSNorm pre-norm, ReLU^2 MLP, no biases, untied
embedding and head, logit soft-cap 15, per-layer residual and x0 mixing scalars. Master weights are fp32, except
the embeddings when `embed_dtype` says otherwise (nanochat keeps the token and value embeddings in the compute
dtype); `CastedLinear` casts its weight to the activation (compute) dtype in forward, which replaces autocast.

Optional, as in nanochat's current model (the `nanochat` preset turns them on):
- value embeddings (ResFormer): alternate layers, the last always, add a per-head gated (0..3) embedding of the
  input token to the attention values;
- sliding windows: a pattern such as "SSSL" tiled over the layers, S = a quarter of the context rounded up to
  128 tokens, L = full context, the last layer always L. Each layer's kernel is given by the caller
  (`attention.layer_kernels`): S layers run flash attention's own window where the platform has it (nanochat
  runs FlashAttention 3's window), else SDPA with a banded causal mask (nanochat's own fallback); the default is
  the latter, the CPU's.

Left out on purpose: the smear gate and backout (two scalars' worth of load); the output projections start small
instead of zero, so the canary (frozen initial weights) exercises every path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tuner.engine import attention
from tuner.engine.options import GPTConfig

SOFTCAP = 15.0
ROPE_BASE = 100_000.0


VE_GATE_CHANNELS = 12


def window_mask(seq_len: int, window: int) -> torch.Tensor:
    """Boolean (T, T) mask, True = attend: causal, and at most `window` positions back (nanochat's SDPA
    fallback keeps keys with 0 <= i - j <= window)."""
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    return (j <= i) & (i - j <= window)


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

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int, kernel: str) -> None:
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.window = cfg.windows()[layer]
        self.kernel = kernel
        inner = cfg.n_head * cfg.head_dim
        self.c_q = CastedLinear(cfg.width, inner)
        self.c_k = CastedLinear(cfg.width, inner)
        self.c_v = CastedLinear(cfg.width, inner)
        self.c_proj = CastedLinear(inner, cfg.width)
        self.ve_gate = CastedLinear(VE_GATE_CHANNELS, cfg.n_head) if cfg.has_ve(layer) else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ve: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.c_q(x).view(b, t, self.n_head, self.head_dim)
        k = self.c_k(x).view(b, t, self.n_head, self.head_dim)
        v = self.c_v(x).view(b, t, self.n_head, self.head_dim)
        if ve is not None and self.ve_gate is not None:  # value residual, gate per head in (0, 3)
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., :VE_GATE_CHANNELS]))
            v = v + gate.unsqueeze(-1) * ve.view(b, t, self.n_head, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k = norm(q) * 1.2, norm(k) * 1.2  # QK-norm, then nanochat's 1.2 gain
        y = attention.attend(q, k, v, self.kernel, self.window, None if mask is None else mask[:t, :t])
        return self.c_proj(y.reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = CastedLinear(cfg.width, 4 * cfg.width)
        self.c_proj = CastedLinear(4 * cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int, kernel: str) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(cfg, layer, kernel)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ve: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(norm(x), cos, sin, ve, mask)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    cos: torch.Tensor  # buffers (`register_buffer` below), declared for the type checker
    sin: torch.Tensor

    def __init__(self, cfg: GPTConfig, compute_dtype: torch.dtype = torch.float32,
                 embed_dtype: torch.dtype = torch.float32, attention_kernels: list[str] | None = None) -> None:
        """`attention_kernels`: one per layer (`attention.layer_kernels`); default: the CPU's (math, and math
        with a banded mask on sliding-window layers)."""
        super().__init__()
        self.cfg, self.compute_dtype = cfg, compute_dtype
        windows = cfg.windows()
        kernels = attention_kernels or attention.layer_kernels(windows, cfg.seq_len, attention.CPU)
        if len(kernels) != cfg.depth or any((k in attention.WINDOW_KERNELS) != (w < cfg.seq_len)
                                            for k, w in zip(kernels, windows, strict=True)):
            raise ValueError(f"attention kernels {kernels} do not fit the layers' windows {windows}")
        self.attention_kernels = list(kernels)
        self.wte = nn.Embedding(cfg.vocab, cfg.width, dtype=embed_dtype)
        self.blocks = nn.ModuleList(Block(cfg, i, kernels[i]) for i in range(cfg.depth))
        self.lm_head = CastedLinear(cfg.width, cfg.vocab)
        self.resid_lambdas = nn.Parameter(torch.ones(cfg.depth))
        self.x0_lambdas = nn.Parameter(torch.zeros(cfg.depth))
        kv = cfg.n_head * cfg.head_dim
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(cfg.vocab, kv, dtype=embed_dtype)
                                           for i in range(cfg.depth) if cfg.has_ve(i)})
        cos, sin = self._rotary(cfg.seq_len, cfg.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self._mask_of_layer: list[str | None] = []
        for w, kernel in zip(windows, kernels, strict=True):
            if kernel != attention.MATH_WINDOW:  # only SDPA's banded path takes a mask
                self._mask_of_layer.append(None)
                continue
            name = f"mask_{w}"
            if not hasattr(self, name):
                self.register_buffer(name, window_mask(cfg.seq_len, w), persistent=False)
            self._mask_of_layer.append(name)

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
            assert isinstance(block, Block)  # nn.ModuleList's items are typed Module
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v):
                fill(lin.weight, "uniform", bound)
            fill(block.mlp.c_fc.weight, "uniform", 0.4 * bound)
            fill(block.attn.c_proj.weight, "uniform", 0.1 * bound)
            fill(block.mlp.c_proj.weight, "uniform", 0.05 * bound)
            if block.attn.ve_gate is not None:  # nanochat: uniform(0, 0.02), gates start just above neutral
                cpu = torch.empty(block.attn.ve_gate.weight.shape).uniform_(0.0, 0.02, generator=generator)
                block.attn.ve_gate.weight.copy_(cpu)
            frac = i / max(1, self.cfg.depth - 1)
            self.resid_lambdas[i] = 1.15 - 0.10 * frac
            self.x0_lambdas[i] = 0.20 - 0.15 * frac
        for weight in self.embedding_params()[1:]:  # the value embeddings, in layer order
            fill(weight, "uniform", bound)  # like c_v

    def forward(self, idx: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy (nats per token) of `targets` given `idx`, both (B, T) int64. fp32 logits, soft-capped."""
        t = idx.size(1)
        cos = self.cos[:, :t].to(self.compute_dtype)
        sin = self.sin[:, :t].to(self.compute_dtype)
        x = norm(self.wte(idx).to(self.compute_dtype))
        x0 = x
        for i, block in enumerate(self.blocks):
            x = self.resid_lambdas[i].to(x.dtype) * x + self.x0_lambdas[i].to(x.dtype) * x0
            ve = self.value_embeds[str(i)](idx).to(x.dtype) if str(i) in self.value_embeds else None
            name = self._mask_of_layer[i]
            x = block(x, cos, sin, ve, None if name is None else getattr(self, name))
        logits = self.lm_head(norm(x)).float()
        logits = SOFTCAP * torch.tanh(logits / SOFTCAP)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
        if reduction == "none":
            return loss.view(targets.shape)
        return loss.mean()

    def flatten_parameters_(self) -> list[torch.Tensor]:
        """Move the parameters into one contiguous buffer per dtype (each parameter becomes a view of its
        buffer) and return the buffers, so whole-model reductions such as the bit checksum are one kernel per
        dtype (one for fp32-only models; two with bf16 embeddings)."""
        by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
        for p in self.parameters():
            by_dtype.setdefault(p.dtype, []).append(p)
        buffers = []
        for params in by_dtype.values():
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            for p, part in zip(params, flat.split([p.numel() for p in params]), strict=True):
                p.data = part.view_as(p)
            buffers.append(flat)
        return buffers

    def matrix_params(self) -> list[nn.Parameter]:
        """The transformer's 2-D matrices (Muon). Embedding, head and scalars go to AdamW."""
        return [p for p in self.blocks.parameters() if p.ndim == 2]

    def linear_modules(self) -> list[tuple[str, CastedLinear]]:
        return [(n, m) for n, m in self.named_modules() if isinstance(m, CastedLinear)]

    def embedding_params(self) -> list[torch.Tensor]:
        """The token embedding's weight, then the value embeddings' in layer order (parameters: the stubs type an
        Embedding's weight as a Tensor)."""
        params = [self.wte.weight]
        for k in sorted(self.value_embeds, key=int):
            embed = self.value_embeds[k]
            assert isinstance(embed, nn.Embedding)  # nn.ModuleDict's items are typed Module
            params.append(embed.weight)
        return params

    def flops_per_token(self) -> int:
        """nanochat's estimate: 6 x (matmul weights incl. head) + per layer 12 x heads x head_dim x the keys it
        sees (the window on sliding-window layers)."""
        c = self.cfg
        n_matmul = sum(m.weight.numel() for _, m in self.linear_modules())
        return 6 * n_matmul + sum(12 * c.n_head * c.head_dim * min(w, c.seq_len) for w in c.windows())
