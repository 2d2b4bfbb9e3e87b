"""The environment variables the engine sets, before `import torch`. No torch here.

Some are read when torch is imported or when a GPU runtime starts (the CUDA caching allocator reads
`PYTORCH_CUDA_ALLOC_CONF` once, when it is first used; cuBLAS reads `CUBLAS_WORKSPACE_CONFIG` when its handle is
made; TunableOp reads `PYTORCH_TUNABLEOP_ENABLED`), so `python -m tuner.engine` sets them before anything imports
torch (`tuner/engine/cli.py`), and a test or bench that runs the engine in-process sets them before it imports
torch too, where it can. Calling `prepare_environment()` again later changes nothing and reports nothing new.

- `CUDA_DEVICE_ORDER=PCI_BUS_ID` (unless set): `cuda:N` counts cards the way NVML does;
- `CUBLAS_WORKSPACE_CONFIG=:4096:8` unless it is one of the two deterministic values
  (`aten/src/ATen/Context.cpp`, `alertCuBLASConfigNotDeterministic`);
- `PYTORCH_TUNABLEOP_ENABLED=0`: TunableOp times candidate GEMMs and keeps the fastest, so another run may get
  another kernel;
- `TORCH_BLAS_PREFER_HIPBLASLT=0` (unless set): on ROCm hipBLASLt may pick atomic split-K solutions (PyTorch turns
  atomics off only for rocBLAS);
- `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (unless set): a batch grown to fill the card does not fail on
  fragmentation.
"""

from __future__ import annotations

import os

# cuBLAS is deterministic only with one of these workspace configurations (aten/src/ATen/Context.cpp,
# alertCuBLASConfigNotDeterministic); anything else raises in strict deterministic mode.
DETERMINISTIC_CUBLAS_CONFIGS = (":4096:8", ":16:8")
ALLOC_CONF_DEFAULT = "expandable_segments:True"
# Environment variables that change which kernels run (and so the bits of the trajectory): reported in `start`
# and part of the reference fingerprint. Names, or prefixes ending in "_".
KERNEL_ENV = ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_", "CUBLAS_", "TORCH_BLAS_PREFER_CUBLASLT",
              "TORCH_BLAS_PREFER_HIPBLASLT", "PYTORCH_TUNABLEOP_", "TORCH_CUDNN_", "TORCH_ROCM_",
              "NVIDIA_TF32_OVERRIDE",
              "ROCBLAS_", "HIPBLASLT_", "MIOPEN_", "HSA_OVERRIDE_GFX_VERSION", "CUDA_LAUNCH_BLOCKING",
              "TORCH_SDPA_", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "HIP_FORCE_DEV_KERNARG")


def prepare_environment() -> list[str]:
    """Set the variables above. Returns what it overrode (a value the user had set), one line each, for the
    log and the `start` event's setup problems."""
    changed = []
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in DETERMINISTIC_CUBLAS_CONFIGS:
        if "CUBLAS_WORKSPACE_CONFIG" in os.environ:
            changed.append(f"CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']} is not deterministic: "
                           "using :4096:8")
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if os.environ.get("PYTORCH_TUNABLEOP_ENABLED", "0") != "0":
        changed.append("PYTORCH_TUNABLEOP_ENABLED: TunableOp picks kernels by timing: turned off")
    os.environ["PYTORCH_TUNABLEOP_ENABLED"] = "0"
    os.environ.setdefault("TORCH_BLAS_PREFER_HIPBLASLT", "0")
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF_DEFAULT)
    return changed


def kernel_env() -> dict:
    """The environment variables that affect kernel selection, as set now."""
    return {name: os.environ[name] for name in sorted(os.environ)
            if any(name.startswith(k) if k.endswith("_") else name == k for k in KERNEL_ENV)}
