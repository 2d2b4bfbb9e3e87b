"""Which attention kernel each layer runs, and the sliding-window layers on flash attention.

Four kernels, named per layer in the `start` event (`attention_kernels`):

- `flash`: causal SDPA, on torch's flash kernel: CUDA (not ROCm) where flash takes the shape and dtype (bf16 or
  fp16, sm80+);
- `math`: causal SDPA, on the math kernel: the CPU, MPS, ROCm, and CUDA shapes or dtypes flash does not take;
- `flash-window`: a sliding-window layer on flash attention's own window,
  `aten::_flash_attention_forward(..., is_causal=True, window_size_left=W, window_size_right=0)`, and through
  autograd its backward `aten::_flash_attention_backward` with the same window: where `flash` runs and torch's
  flash ops take window sizes;
- `math-window`: a sliding-window layer on SDPA with a banded causal mask, so the math kernel (flash takes no mask;
  cuDNN and memory-efficient attention are off): wherever `flash-window` does not run.

`flash-window` is what nanochat runs (FlashAttention 3's `flash_attn_func(q, k, v, causal=True,
window_size=(W, 0))`, `nanochat/flash_attention.py`), and `math-window` is nanochat's own SDPA fallback with the
same mask (key j is seen from query i when 0 <= i - j <= W): both compute the same function. Read in PyTorch's
sources (`aten/src/ATen/native/transformers/cuda/attention_backward.cu`, `flash_attn/flash_api.cpp`;
`torch/_meta_registrations.py`): the forward and backward take `window_size_left` / `window_size_right` as
keyword arguments. torch 2.13 (this checkout's) has them; so has the schema before and after PyTorch's change of
25 Feb 2025 (commit 3ecfe6be: philox seed/offset renamed rng_state/unused), which xformers'
`is_pt_flash_old` checks for both, so torch 2.11 (the lent GPU image's) has them too; `flash_window_args()` reads
the running torch's schemas anyway, and without them the windowed layers stay on `math-window` (the preflight
of bench/gpu_check.py prints which). There is no `deterministic` argument: the backward runs its
deterministic algorithm when deterministic algorithms are on and not warn-only, which `platform.
enable_determinism()` sets; both ops have meta implementations, so torch.compile traces them (tested on meta
tensors: the compiled backward graph calls `_flash_attention_backward` with the window). The dense layout is
(batch, seq, heads, head_dim), the model's own before its transpose for SDPA.

ROCm stays on math for every layer (its flash kernels, AOTriton or CK, are not documented as deterministic;
`platform.choose_kernels`). The decision is `layer_kernels()`, a pure function of `AttentionPlatform`, so a test
can show the table for platforms this machine is not (tests/engine/test_attention.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FLASH, MATH, FLASH_WINDOW, MATH_WINDOW = "flash", "math", "flash-window", "math-window"
WINDOW_KERNELS = (FLASH_WINDOW, MATH_WINDOW)


@dataclass(frozen=True)
class AttentionPlatform:
    """What decides each layer's kernel (read from torch by `attention_platform`, or written by a test)."""

    device_type: str  # "cuda" (also ROCm), "cpu", "mps"
    rocm: bool
    flash_causal: bool  # torch's SDPA selection runs flash for the preset's causal attention
    flash_window_args: bool  # aten::_flash_attention_forward and _backward take window_size_left/right


CPU = AttentionPlatform("cpu", rocm=False, flash_causal=False, flash_window_args=True)


def layer_kernels(windows: Sequence[int], seq_len: int, platform: AttentionPlatform) -> list[str]:
    """The kernel of each layer, from its window (`GPTConfig.windows()`; >= seq_len: full causal attention).

    >>> cuda = AttentionPlatform("cuda", rocm=False, flash_causal=True, flash_window_args=True)
    >>> layer_kernels([512, 512, 512, 2048, 512, 2048], 2048, cuda)
    ['flash-window', 'flash-window', 'flash-window', 'flash', 'flash-window', 'flash']
    >>> layer_kernels([512, 2048], 2048, CPU)
    ['math-window', 'math']
    """
    flash = platform.device_type == "cuda" and not platform.rocm and platform.flash_causal
    return [(FLASH if flash else MATH) if w >= seq_len else
            (FLASH_WINDOW if flash and platform.flash_window_args else MATH_WINDOW) for w in windows]


def flash_window_args() -> bool:
    """Whether this torch's flash forward and backward ops take window sizes (their schemas say so)."""
    try:
        schemas = (torch.ops.aten._flash_attention_forward.default._schema,
                   torch.ops.aten._flash_attention_backward.default._schema)
    except (AttributeError, RuntimeError):
        return False
    return all({"window_size_left", "window_size_right"} <= {a.name for a in s.arguments} for s in schemas)


def sdpa_runs_flash(q: torch.Tensor) -> bool:
    """Whether SDPA, under the backend switches set now (platform.choose_kernels), runs flash for causal
    attention on tensors like `q` (batch, heads, seq, head_dim)."""
    from tuner.engine.platform import sdpa_backend

    return sdpa_backend(q) == "flash_attention"


def attention_platform(device_type: str, device: torch.device, dtype: torch.dtype, n_head: int, head_dim: int,
                       seq_len: int) -> AttentionPlatform:
    """This process's platform for a model of this shape, after `platform.choose_kernels` set the switches."""
    rocm = bool(torch.version.hip)
    flash = False
    if device_type == "cuda" and not rocm:
        flash = sdpa_runs_flash(torch.empty(1, n_head, seq_len, head_dim, device=device, dtype=dtype))
    return AttentionPlatform(device_type, rocm, flash, flash_window_args())


def flash_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Causal attention over the last `window` + 1 keys on flash attention; (batch, seq, heads, head_dim) in and
    out. Differentiable (aten's autograd formula calls `_flash_attention_backward` with the same window)."""
    t = q.size(1)
    out = torch.ops.aten._flash_attention_forward(q, k, v, None, None, t, k.size(1), 0.0, True, False,
                                                  scale=None, window_size_left=window, window_size_right=0)
    return out[0]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str, window: int,
           mask: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's attention with its kernel; (batch, seq, heads, head_dim) in and out. `flash` and `math` are
    the same call (causal SDPA): torch's selection under the switches picks the kernel the label names.
    `math-window` needs the layer's (seq, seq) boolean mask (`model.window_mask`)."""
    if kernel == FLASH_WINDOW:
        return flash_window(q, k, v, window)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if kernel == MATH_WINDOW:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    else:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return y.transpose(1, 2)
