"""Which device, which dtype, which card (PCI bus id), and the switches for bitwise-repeatable kernels."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
VISIBILITY_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


class SetupProblem(Exception):
    """The device or environment cannot run this configuration. Exit 2, never counted as instability."""


def prepare_environment() -> None:
    """Before torch touches a GPU: number CUDA devices by PCI bus id (as NVML does) and allow deterministic
    cuBLAS (harmless on builds that do not need it)."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@dataclass(frozen=True)
class DeviceSpec:
    device: torch.device
    type: str  # "cuda" (also ROCm), "cpu", "mps"
    name: str
    pci_bus_id: str | None
    total_memory_bytes: int | None


def format_pci_bus_id(domain: int, bus: int, device: int, function: int = 0) -> str:
    """`format_pci_bus_id(0, 3, 0) == '0000:03:00.0'`."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def resolve_device(text: str) -> DeviceSpec:
    if text == "cpu":
        return DeviceSpec(torch.device("cpu"), "cpu", _cpu_name(), None, None)
    if text == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise SetupProblem("--device mps: this torch has no usable MPS device")
        return DeviceSpec(torch.device("mps"), "mps", "Apple MPS", None, None)
    index = int(text.split(":")[1]) if ":" in text else 0
    if not torch.cuda.is_available():
        build = "ROCm" if torch.version.hip else ("CUDA" if torch.version.cuda else "CPU-only")
        raise SetupProblem(f"--device {text}: no GPU visible to torch ({build} build {torch.__version__})")
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise SetupProblem(f"--device {text}: torch sees {count} GPU(s), numbered 0..{count - 1}")
    props = torch.cuda.get_device_properties(index)
    pci = None
    if hasattr(props, "pci_bus_id"):
        pci = format_pci_bus_id(getattr(props, "pci_domain_id", 0), props.pci_bus_id,
                                getattr(props, "pci_device_id", 0))
    return DeviceSpec(torch.device("cuda", index), "cuda", props.name, pci, int(props.total_memory))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "CPU: " + (platform.processor() or platform.machine())


def choose_dtype(requested: str, spec: DeviceSpec) -> torch.dtype:
    """bf16 where the device supports it well (CUDA capability >= 8.0, any ROCm part torch says supports it),
    else fp32; fp16 only on request. CPU and MPS default to fp32."""
    if requested != "auto":
        dtype = DTYPES[requested]
        if spec.type == "cuda" and dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise SetupProblem(f"--dtype bf16: {spec.name} does not support bfloat16")
        return dtype
    if spec.type == "cuda":
        if torch.version.hip:
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        major, _ = torch.cuda.get_device_capability(spec.device)
        return torch.bfloat16 if major >= 8 else torch.float32
    return torch.float32


def enable_determinism() -> None:
    """Deterministic kernels where torch has them (warn, not raise, where it has not: the start-up
    repeatability check is the judge), no cuDNN autotuning, TF32 matmuls as nanochat uses."""
    # torch.use_deterministic_algorithms() also imports inductor (2-3 s) only to set its flag; we never
    # compile, so set the runtime switch directly when torch has it.
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is not None:
        setter(True, warn_only=True)
    else:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("high")


def versions() -> dict:
    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "hip_version": torch.version.hip,
    }


def visibility_env() -> dict:
    return {k: os.environ[k] for k in VISIBILITY_ENV if k in os.environ}


def default_gemm_n(spec: DeviceSpec) -> int:
    """GEMM check size: gpu-burn's 8192 on big GPUs, 4096 on smaller ones, small on CPU/MPS."""
    if spec.type == "cuda":
        return 8192 if (spec.total_memory_bytes or 0) >= 16 * 2**30 else 4096
    if spec.type == "mps":
        return 2048
    return 256


def free_memory_bytes(spec: DeviceSpec) -> int | None:
    if spec.type == "cuda":
        free, _total = torch.cuda.mem_get_info(spec.device)
        return int(free)
    return None


def synchronize(spec: DeviceSpec) -> None:
    if spec.type == "cuda":
        torch.cuda.synchronize(spec.device)
    elif spec.type == "mps":
        torch.mps.synchronize()


def empty_cache(spec: DeviceSpec) -> None:
    if spec.type == "cuda":
        torch.cuda.empty_cache()
    elif spec.type == "mps":
        torch.mps.empty_cache()


def is_oom(exc: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, (RuntimeError, MemoryError)) and "out of memory" in str(exc).lower()


def make_oom(message: str) -> BaseException:
    """An out-of-memory exception of the type torch raises (for the test hooks)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    return oom_type(message)
