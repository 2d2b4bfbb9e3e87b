"""The `nanochat` preset on a GPU: tok/s and MFU (against the GPU's peak dense bf16 rate) with compile on and off,
and whether compiled steps are repeatable; one table. bench/gpu_check.py runs its own nanochat sections (record,
replay, no compile at the fitted batch) and reads the peak table here (`peak_tflops`).

    python bench/gpu_nanochat.py [--device cuda:0] [--steps 60] [--json]

Each configuration is a real engine run (`python -m tuner.engine --preset nanochat`, every detector on), timed
by the engine itself (median tok/s after its warm-up). MFU = flops_per_step / median step time / peak. The
compiled run's `start.repeatability.compiled` is the engine's own proof: two compiled steps from the same
initial state agree bit for bit. Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# Peak dense bf16 tensor throughput, TFLOP/s (vendor data sheets, without sparsity). Matched by substring of
# torch's device name, first match wins; an unknown GPU gets no MFU rather than a guessed one.
PEAK_BF16_TFLOPS = (
    ("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("GH200", 989.0), ("B200", 2250.0),
    ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0), ("A10", 125.0), ("RTX 6000 Ada", 364.0), ("A6000", 155.0),
    ("RTX 5090", 209.5), ("RTX 4090", 165.2), ("RTX 3090", 71.0), ("MI300X", 1307.0), ("MI250X", 383.0),
)


def peak_tflops(device_name: str) -> float | None:
    return next((tf for key, tf in PEAK_BF16_TFLOPS if key in device_name), None)


def run_engine(device: str, steps: int, extra: list[str], timeout_s: float) -> list[dict]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "tuner.engine", "--device", device, "--preset", "nanochat",
                           "--steps", str(steps), *extra], cwd=root, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not events or events[-1].get("event") != "end":
        raise RuntimeError(f"engine gave no end event: {proc.stderr[-800:]}")
    return events


def nanochat_section(device: str = "cuda:0", steps: int = 60, timeout_s: float = 900.0) -> list[dict]:
    """One row per configuration: compile on, compile off."""
    rows = []
    for label, flag in (("compile on", "--compile"), ("compile off", "--no-compile")):
        events = run_engine(device, steps, [flag], timeout_s)
        start = next((e for e in events if e["event"] == "start"), None)
        end = events[-1]
        peak = peak_tflops(start["device_name"]) if start else None
        mfu = None
        if start and end.get("median_step_ms") and peak:
            mfu = start["flops_per_step"] / (end["median_step_ms"] / 1e3) / (peak * 1e12)
        rows.append({
            "config": label, "verdict": end["verdict"], "reason": end["reason"],
            "device_name": start["device_name"] if start else None,
            "batch_size": start["batch_size"] if start else None,
            "tokens_per_step": start["tokens_per_step"] if start else None,
            "median_tok_s": end.get("median_tok_s"), "median_step_ms": end.get("median_step_ms"),
            "peak_bf16_tflops": peak, "mfu": mfu,
            "repeatable": start["repeatable"] if start else None,
            "compiled_repeatable": (start or {}).get("repeatability", {}).get("compiled"),
            "setup_problems": end.get("setup_problems", []),
        })
    return rows


def format_rows(rows: list[dict]) -> str:
    out = [(f"{'nanochat':<12} {'verdict':<8} {'batch':>6} {'tok/s':>12} {'step ms':>9} {'MFU':>6} "
            f"{'repeatable':>10} {'compiled rep.':>13}")]
    for r in rows:
        mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        tok = "-" if r["median_tok_s"] is None else f"{r['median_tok_s']:,.0f}"
        ms = "-" if r["median_step_ms"] is None else f"{r['median_step_ms']:.1f}"
        rep = "-" if r["compiled_repeatable"] is None else str(r["compiled_repeatable"])
        out.append(f"{r['config']:<12} {r['verdict']:<8} {r['batch_size'] or '-':>6} {tok:>12} {ms:>9} {mfu:>6} "
                   f"{r['repeatable']!s:>10} {rep:>13}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no GPU")
    except Exception as e:  # noqa: BLE001 - no GPU, whatever the reason
        print(f"gpu_nanochat: needs a GPU ({type(e).__name__}: {e}); nothing measured")
        return 0
    rows = nanochat_section(a.device, a.steps)
    print(json.dumps(rows) if a.json else format_rows(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
