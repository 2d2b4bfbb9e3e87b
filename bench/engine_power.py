"""Is the engine a heavy load? Its mean board power against a bf16 GEMM burn loop (gpu-burn's kind of load) on
the same NVIDIA GPU, both sampled with NVML at 10 Hz over the same length of steady load.

    python bench/engine_power.py [--device cuda:0] [--seconds 60] [--preset nanochat] [--batch-size B] [--json]

The engine runs as the tuner runs it (`python -m tuner.engine`, every detector on); the burn loop is
`C = A @ B` on 8192 x 8192 bf16 matrices, back to back. Goal: engine / burn >= 0.9. Without a GPU (or without
NVML) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time


class PowerSampler:
    """NVML board power (W) of one GPU, every `interval_s`, on a thread; plus the enforced limit."""

    def __init__(self, nvml, handle, interval_s: float = 0.1):
        self.nvml, self.handle, self.interval_s = nvml, handle, interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="power", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0))
            self._stop.wait(self.interval_s)

    def start(self) -> PowerSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> list[float]:
        return [w for t, w in self.samples if t0 <= t <= t1]


def summary(watts: list[float]) -> dict:
    ordered = sorted(watts)
    return {"mean_w": statistics.fmean(watts) if watts else None,
            "p95_w": ordered[max(0, -(-len(ordered) * 95 // 100) - 1)] if ordered else None, "samples": len(watts)}


def burn(device: str, seconds: float, n: int = 8192) -> float:
    """bf16 GEMMs back to back for `seconds`; returns the achieved TFLOP/s."""
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    torch.cuda.synchronize(device)
    t0, count = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        for _ in range(10):
            a @ b
        count += 10
        torch.cuda.synchronize(device)
    return 2 * n**3 * count / (time.monotonic() - t0) / 1e12


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--seconds", type=float, default=60.0, help="steady load measured for each (default 60)")
    ap.add_argument("--preset", default="nanochat")
    ap.add_argument("--batch-size", type=int, default=None, help="the engine's batch (default: its own fit)")
    ap.add_argument("--settle-s", type=float, default=10.0, help="load left out at the start of each (default 10)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        import pynvml
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no GPU")
        pynvml.nvmlInit()
        index = int(a.device.split(":")[1]) if ":" in a.device else 0
        bus = torch.cuda.get_device_properties(index).pci_bus_id
        handle = next(h for h in (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount()))
                      if pynvml.nvmlDeviceGetPciInfo(h).bus == bus)
    except Exception as e:  # noqa: BLE001 - any reason there is no NVIDIA GPU to measure
        print(f"engine_power: needs an NVIDIA GPU with NVML ({type(e).__name__}: {e}); nothing measured")
        return 0
    limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    sampler = PowerSampler(pynvml, handle).start()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    total = a.settle_s + a.seconds
    engine = subprocess.run([sys.executable, "-m", "tuner.engine", "--device", a.device, "--preset", a.preset,
                             "--duration", f"{total:g}",
                             *(["--batch-size", str(a.batch_size)] if a.batch_size else [])],
                            cwd=root, capture_output=True, text=True, check=False)
    events = [json.loads(line) for line in engine.stdout.splitlines() if line.startswith("{")]
    end = events[-1] if events else {}
    if end.get("verdict") != "pass":
        print(f"engine_power: the engine run did not pass: {end.get('reason') or engine.stderr[-500:]}")
        sampler.stop()
        return 1
    # the steady window: from settle_s after `start` to the last step (NVML's clock is ours; align on wall time)
    t_end = time.monotonic() - (events[-1]["t"] - max(e["t"] for e in events if e["event"] == "step"))
    engine_w = summary(sampler.between(t_end - a.seconds, t_end))
    t0 = time.monotonic()
    tflops = burn(a.device, total)
    burn_w = summary(sampler.between(t0 + a.settle_s, time.monotonic()))
    sampler.stop()
    ratio = engine_w["mean_w"] / burn_w["mean_w"] if engine_w["mean_w"] and burn_w["mean_w"] else None
    # what the engine changed at setup (a batch that did not fit and was stepped down): part of the figure
    warnings = [f"{e.get('kind')}: {e.get('detail')}" for e in events if e["event"] == "warning" and e.get("setup")]
    fit_lines = [line.split("batch fit: ", 1)[1] for line in engine.stderr.splitlines() if "batch fit: " in line]
    result = {"device": a.device, "preset": a.preset, "limit_w": limit_w, "engine": engine_w, "burn": burn_w,
              "burn_tflops": tflops, "engine_tok_s": end.get("median_tok_s"), "ratio": ratio, "goal": 0.9,
              "batch_size": next((e.get("batch_size") for e in events if e["event"] == "start"), None),
              "setup_warnings": warnings, "batch_fit": fit_lines}
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"board power, {a.preset} engine (batch {result['batch_size']}, {end.get('median_tok_s')} tok/s) vs bf16 "
          f"GEMM burn on {a.device} (limit {limit_w:.0f} W, {a.seconds:g} s each)")
    print(f"{'':<8} {'mean W':>8} {'p95 W':>8} {'of limit':>9}")
    for name, s in (("engine", engine_w), ("burn", burn_w)):
        print(f"{name:<8} {s['mean_w']:>8.0f} {s['p95_w']:>8.0f} {s['mean_w'] / limit_w:>9.0%}")
    for line in warnings:
        print(f"engine setup: {line}")
    for line in fit_lines:
        print(f"batch fit: {line}")
    shown = "-" if ratio is None else f"{ratio:.3f}"
    print(f"{'ratio':<8} {shown:>8}  goal >= 0.90: {'met' if ratio and ratio >= 0.9 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
