"""Attention at the nanochat preset's shape under the engine's deterministic mode, and one large GEMM: the first
figures of the GPU check (bench/gpu_check.py runs this as its own process). One JSON line per row, as it ends.

    python bench/gpu_attention.py [--device cuda:0] [--batch 32] [--repeats 10] [--gemm-n 8192] [--seq-len 2048]

The engine's switches first (tuner/engine/environment.py before torch is imported; then strict deterministic
algorithms and the SDPA backends of `platform.choose_kernels`). Rows, (batch, 3 heads, 2,048 tokens, head dim 128)
in the compute dtype (bf16 on CUDA, fp32 on the CPU), window 512 (nanochat's short window):

- `causal`: causal SDPA, the model's full layers (flash on CUDA, the backend torch picks is in the row);
- `math window`: SDPA with the banded causal mask (the math kernel: flash takes no mask), the windowed layers as
  they ran before flash's window;
- `flash window`: flash attention's own window (`attention.flash_window`), the windowed layers where the
  platform has it (`attention.layer_kernels`); not run where it has not.

Each: forward + backward, median ms over --repeats after two warm-up runs (CUDA events on a GPU), TFLOP/s by
nanochat's count (12 x heads x head_dim x keys seen, per token), the peak memory above the inputs, whether two
runs on the same inputs give the same bits (output and the three gradients), and for `flash window` the relative
difference from `math window` (the same function: max over output and gradients of ||a - b|| / ||b||; above 5e-2
it is reported as disagreeing).
- `gemm`: one n x n x n matmul on random data in the compute dtype (n 8192 on CUDA), median ms and TFLOP/s: the
  ceiling MFU is read against, measured on this card rather than taken from a data sheet.

On the CPU (a plumbing check, tests/engine/test_gpu_check.py) the defaults are smaller: batch 1, 2 repeats, GEMM
1024; `--seq-len` (default nanochat's 2,048; the window is a quarter of it rounded up to 128) shrinks it further.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from tuner.engine.environment import prepare_environment

prepare_environment()  # before torch is imported, as the engine's CLI does

import torch

from tuner.engine import attention
from tuner.engine.model import window_mask
from tuner.engine.options import PRESETS
from tuner.engine.platform import DTYPE_NAMES, choose_dtype, choose_kernels, enable_determinism, resolve_device

# flash-window against math-window in bf16 (two kernels, one function): bf16 operands land between 1e-3 and 1e-2
# relative error against a high-precision reference; anything past 5e-2 is another function (a wrong window)
AGREEMENT_REL = 5e-2


def _emit(row: dict) -> None:
    print(json.dumps(row, default=str), flush=True)


def _timed(fn, spec, repeats: int) -> list[float]:
    """Milliseconds of each of `repeats` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if spec.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30)) for x, y in zip(a, b,
                                                                                                           strict=True))


def attention_row(name: str, fn, inputs: list[torch.Tensor], spec, repeats: int, keys_per_query: int,
                  compare_with: list[torch.Tensor] | None = None) -> tuple[dict, list[torch.Tensor]]:
    """`fn(q, k, v)` on (batch, seq, heads, head_dim) tensors; forward + backward with `inputs[3]` as the
    gradient of the output."""
    q0, k0, v0, dy = inputs

    def once() -> list[torch.Tensor]:
        q, k, v = (t.detach().clone().requires_grad_(True) for t in (q0, k0, v0))
        y = fn(q, k, v)
        y.backward(dy)
        return [y.detach(), q.grad, k.grad, v.grad]

    cuda = spec.type == "cuda"
    if cuda:
        torch.cuda.synchronize(spec.device)
        base = torch.cuda.memory_allocated(spec.device)
        torch.cuda.reset_peak_memory_stats(spec.device)
    first = once()
    peak_gib = None
    if cuda:
        torch.cuda.synchronize(spec.device)
        peak_gib = round((torch.cuda.max_memory_allocated(spec.device) - base) / 2**30, 3)
    second = once()
    repeat = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(first, second, strict=True))
    times = _timed(lambda: once(), spec, repeats)
    b, t, h, d = q0.shape
    flops = 12 * h * d * keys_per_query * b * t  # nanochat's count: forward and backward, both matmuls
    ms = statistics.median(times)
    row = {"row": name, "ok": True, "median_ms": round(ms, 3), "min_ms": round(min(times), 3),
           "tflops": round(flops / (ms / 1e3) / 1e12, 4), "peak_gib": peak_gib, "bitwise_repeat": repeat,
           "shape": [b, t, h, d]}
    if compare_with is not None:
        diff = _rel_diff(first, compare_with)
        row["rel_diff_vs_math_window"] = diff
        row["agrees_with_math_window"] = diff <= AGREEMENT_REL  # NaN compares False
    return row, first


def gemm_row(spec, dtype: torch.dtype, n: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(spec.device, dtype)
    b = torch.randn(n, n, generator=gen).to(spec.device, dtype)
    times = _timed(lambda: torch.mm(a, b), spec, repeats)
    ms = statistics.median(times)
    return {"row": "gemm", "ok": True, "n": n, "dtype": DTYPE_NAMES[dtype], "median_ms": round(ms, 3),
            "tflops": round(2 * n**3 / (ms / 1e3) / 1e12, 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=int, default=None, help="sequences (default 32 on GPUs, nanochat's micro-batch; "
                    "1 on the CPU)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per row (default 10 on GPUs, 2 on the CPU)")
    ap.add_argument("--gemm-n", type=int, default=None, help="GEMM side (default 8192 on GPUs, 1024 on the CPU)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default nanochat's 2,048)")
    a = ap.parse_args(argv)
    enable_determinism()
    spec = resolve_device(a.device)
    kernels = choose_kernels(spec)
    dtype = choose_dtype("auto", spec)
    gpu = spec.type == "cuda"
    batch = a.batch or (32 if gpu else 1)
    repeats = a.repeats or (10 if gpu else 2)
    p = PRESETS["nanochat"]
    cfg = replace(p, seq_len=a.seq_len or p.seq_len)
    window = min(cfg.windows())
    t, h, d = cfg.seq_len, cfg.n_head, cfg.head_dim
    where = attention.attention_platform(spec.type, spec.device, dtype, h, d, t)
    layers = attention.layer_kernels(cfg.windows(), t, where)
    _emit({"row": "setup", "ok": True, "device": spec.name, "dtype": DTYPE_NAMES[dtype], "kernels": kernels,
           "deterministic": kernels["deterministic"], "layers": layers, "window": window})
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(batch, t, h, d, generator=gen).to(spec.device, dtype) for _ in range(4)]
    mask = window_mask(t, window).to(spec.device)
    backend = attention.sdpa_runs_flash(inputs[0].transpose(1, 2))

    def run(name, fn, keys, compare=None):
        try:
            row, out = attention_row(name, fn, inputs, spec, repeats, keys, compare)
        except Exception as e:  # noqa: BLE001 - a kernel that fails is a row, the others still run
            row, out = {"row": name, "ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}, None
        _emit(row)
        if gpu:
            torch.cuda.empty_cache()
        return out

    run(f"causal ({'flash' if backend else 'math'})",
        lambda q, k, v: attention.attend(q, k, v, attention.FLASH if backend else attention.MATH, t), t)
    math_out = run("math window", lambda q, k, v: attention.attend(q, k, v, attention.MATH_WINDOW, window, mask),
                   window)
    if attention.FLASH_WINDOW in layers:
        run("flash window", lambda q, k, v: attention.flash_window(q, k, v, window), window, math_out)
    else:
        _emit({"row": "flash window", "ok": None, "skipped": f"not on this platform ({where})"})
    inputs.clear()  # free the attention tensors before the GEMM's
    math_out = None
    try:
        _emit(gemm_row(spec, dtype, a.gemm_n or (8192 if gpu else 1024), repeats))
    except Exception as e:  # noqa: BLE001
        _emit({"row": "gemm", "ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
