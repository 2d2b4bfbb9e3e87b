"""The GPU check's preflight (bench/gpu_check.py runs it first, as its own process): what this machine has for the
engine, before anything long runs. Prints one JSON document on its last line.

    python bench/gpu_preflight.py [--device cuda:0]

It sets the engine's environment first, as `python -m tuner.engine` does (tuner/engine/environment.py, before
torch is imported), then reports: Python, torch (CUDA, HIP, cuDNN, Triton), the device (name, capability, PCI
bus id, driver, total and free memory, nvidia-smi's clocks and power), the allocator settings torch will use,
the attention kernel each layer of the nanochat preset gets here (tuner/engine/attention.py), and every module
the engine and the check import, with its version and where it was found; `missing` names those that are not
importable. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from tuner.engine.environment import kernel_env, prepare_environment

# module -> distribution, for every import the engine and the check need beyond the standard library and torch
# (tests/engine/test_gpu_check.py runs the engine and fails on an import missing here). Every engine process
# imports msgspec (tuner/engine/events.py, the event schema); the nanochat preset rustbpe and tiktoken
# (tuner/engine/tokenizer.py), tiktoken regex and requests; the NVML probe pynvml.
NEEDED = {"msgspec": "msgspec", "rustbpe": "rustbpe", "tiktoken": "tiktoken", "regex": "regex",
          "requests": "requests", "pynvml": "nvidia-ml-py"}
# what the lent GPU image already holds of NEEDED (/work/.library/device/KINDS.md, "Python packages already
# there", read 2026-11-17): scripts/prepare-gpu-wheels.sh fetches the rest (`--fetch-list`)
IMAGE_HAS = frozenset({"tiktoken", "regex", "requests", "nvidia-ml-py"})


def fetch_list() -> list[str]:
    """NAME==VERSION for each distribution of NEEDED the image lacks, at the version this checkout runs (the
    tokenizer rustbpe trains is part of the references' fingerprint; one version of each)."""
    import importlib.metadata as md

    out = []
    for dist in NEEDED.values():
        if dist in IMAGE_HAS:
            continue
        try:
            out.append(f"{dist}=={md.version(dist)}")
        except md.PackageNotFoundError:
            raise SystemExit(f"gpu_preflight.py: {dist} is not installed here; run scripts/setup.sh first") from None
    return out


def _module(name: str, dist: str) -> dict:
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - an import can fail many ways; each is "missing"
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:200]}
    try:
        import importlib.metadata as md

        version = md.version(dist)
    except Exception:  # noqa: BLE001 - a module without metadata (a shadow, a vendored copy)
        version = getattr(mod, "__version__", None)
    return {"ok": True, "version": version, "file": getattr(mod, "__file__", None)}


def _device(device: str) -> dict:
    import torch

    out: dict = {"device": device, "cuda_available": bool(torch.cuda.is_available())}
    if not device.startswith(("cuda", "hip")):
        return out
    if not torch.cuda.is_available():
        out["error"] = f"torch sees no GPU (build {torch.__version__})"
        return out
    from tuner.engine.platform import resolve_device

    spec = resolve_device(device)
    props = torch.cuda.get_device_properties(spec.device)
    free, total = torch.cuda.mem_get_info(spec.device)
    out.update(name=spec.name, pci_bus_id=spec.pci_bus_id, count=torch.cuda.device_count(),
               capability=list(torch.cuda.get_device_capability(spec.device)),
               multiprocessors=getattr(props, "multi_processor_count", None),
               total_memory_gib=round(total / 2**30, 2), free_memory_gib=round(free / 2**30, 2),
               allocator_backend=torch.cuda.get_allocator_backend(),
               flash_built=bool(getattr(torch.backends.cuda, "is_flash_attention_available", lambda: False)()))
    out["nvidia_smi"] = _nvidia_smi()
    for path in ("/proc/driver/nvidia/version", "/sys/module/amdgpu/version"):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                out["driver"] = f.readline().strip()[:160]
                break
        except OSError:
            continue
    return out


def _nvidia_smi() -> str | None:
    """The card as nvidia-smi reads it (clocks, power, temperature, memory): read only."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return None
    fields = ("name,pstate,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,"
              "memory.used,memory.total")
    try:
        proc = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi: {e}"
    return (proc.stdout or proc.stderr).strip()[:1000]


def _attention(device: str) -> dict:
    """The nanochat preset's kernel per layer on this device, under the engine's switches."""
    import torch

    from tuner.engine import attention
    from tuner.engine.options import PRESETS
    from tuner.engine.platform import choose_dtype, choose_kernels, enable_determinism, resolve_device

    p = PRESETS["nanochat"]
    cfg = p
    enable_determinism()
    spec = resolve_device(device)
    kernels = choose_kernels(spec)
    dtype = choose_dtype("auto", spec)
    where = attention.attention_platform(spec.type, spec.device, dtype, cfg.n_head, cfg.head_dim, cfg.seq_len)
    return {"dtype": str(dtype).removeprefix("torch."), "switches": kernels, "platform": where.__dict__,
            "layers": attention.layer_kernels(cfg.windows(), cfg.seq_len, where), "windows": cfg.windows(),
            "torch_deterministic": torch.are_deterministic_algorithms_enabled()}


def preflight(device: str) -> dict:
    t0 = time.monotonic()
    env_notes = prepare_environment()  # as the engine's CLI does, before torch is imported
    doc: dict = {"python": sys.version.split()[0], "executable": sys.executable, "environment_notes": env_notes,
                 "pythonpath": os.environ.get("PYTHONPATH", "")}
    doc["allocator_conf"] = {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")}
    doc["modules"] = {name: _module(name, dist) for name, dist in NEEDED.items()}
    torch_mod = _module("torch", "torch")
    doc["modules"]["torch"] = torch_mod
    if torch_mod["ok"]:
        import torch

        doc["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
                        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
        triton = _module("triton", "triton")
        doc["torch"]["triton"] = triton.get("version") if triton["ok"] else None
        try:
            doc["gpu"] = _device(device)
        except Exception as e:  # noqa: BLE001 - reported, the check goes on with what it can
            doc["gpu"] = {"device": device, "error": f"{type(e).__name__}: {e}"[:300]}
        try:
            doc["attention"] = _attention(device)
        except Exception as e:  # noqa: BLE001
            doc["attention"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    doc["kernel_env"] = kernel_env()
    doc["missing"] = sorted(name for name, m in doc["modules"].items() if not m["ok"])
    doc["wall_s"] = round(time.monotonic() - t0, 2)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--fetch-list", action="store_true",
                    help="print NAME==VERSION of each wheel the GPU image lacks (scripts/prepare-gpu-wheels.sh)")
    a = ap.parse_args(argv)
    if a.fetch_list:
        print("\n".join(fetch_list()))
        return 0
    print(json.dumps(preflight(a.device), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
