"""Which device, which dtype, which card (PCI bus id), and the switches for bitwise-repeatable kernels.

Determinism by construction (docs/engine.md, "Determinism", cites the PyTorch sources):
- strict deterministic algorithms (`warn_only=False`): an op without a deterministic implementation raises
  instead of warning, and the flash-attention backward runs its deterministic variant only in strict mode;
- the SDPA backend is chosen explicitly per platform (`choose_kernels`): CUDA flash (deterministic backward in
  strict mode) or math; ROCm and CPU math only; cuDNN and memory-efficient attention are switched off;
- GEMMs: on ROCm hipBLAS (rocBLAS, atomics off in deterministic mode) preferred over hipBLASLt, TunableOp off;
  the environment variables behind them (`CUBLAS_WORKSPACE_CONFIG`, ...) are set before torch is imported, by
  `tuner/engine/environment.py`.
Which attention kernel each layer runs (flash, flash with a window, math) is `tuner/engine/attention.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from tuner.core.errors import first_line
from tuner.core.models import same_bus_id  # the one rule, shared with the trial

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# each float dtype's integer dtype of the same width: its bits, for exact checksums, comparisons and flips
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
VISIBILITY_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


class SetupProblem(Exception):
    """The device or environment cannot run this configuration. Exit 2, never counted as instability."""


@dataclass(frozen=True)
class DeviceSpec:
    device: torch.device
    type: str  # "cuda" (also ROCm), "cpu", "mps"
    name: str
    pci_bus_id: str | None
    total_memory_bytes: int | None


def props_bus_id(props: object) -> str | None:
    """The PCI bus id, `0000:03:00.0`, of a CUDA device's properties `props` (read by name: torch's stubs do not
    list the pci_* fields); None where torch does not report it."""
    if not hasattr(props, "pci_bus_id"):
        return None
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"


def resolve_device(text: str, expect_pci_bus_id: str | None = None) -> DeviceSpec:
    """The torch device for `--device`. With `expect_pci_bus_id` on a GPU, the device whose PCI bus id matches
    among *all* visible devices (HIP does not order devices as CUDA does, and an iGPU can be device 0): the index
    in `--device` is only a hint."""
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
    if expect_pci_bus_id:
        seen = []
        for i in range(count):
            bus = props_bus_id(torch.cuda.get_device_properties(i))
            seen.append(f"{i}: {bus}")
            if bus and same_bus_id(bus, expect_pci_bus_id):
                index = i
                break
        else:
            raise SetupProblem(f"no visible GPU has PCI bus id {expect_pci_bus_id} (torch sees {', '.join(seen)}; "
                               "check CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES)")
    props = torch.cuda.get_device_properties(index)
    torch.cuda.set_device(index)  # capability queries without a device argument ask the current one
    return DeviceSpec(torch.device("cuda", index), "cuda", props.name, props_bus_id(props), int(props.total_memory))


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
        if spec.type == "cuda" and dtype is torch.bfloat16 and not bf16_supported(spec.device):
            raise SetupProblem(f"--dtype bf16: {spec.name} does not support bfloat16")
        return dtype
    if spec.type == "cuda":
        if torch.version.hip:
            return torch.bfloat16 if bf16_supported(spec.device) else torch.float32
        major, _ = torch.cuda.get_device_capability(spec.device)
        return torch.bfloat16 if major >= 8 else torch.float32
    return torch.float32


def bf16_supported(device: torch.device | int) -> bool:
    """Ask `device` (is_bf16_supported() asks the *current* device)."""
    with torch.cuda.device(device):
        return bool(torch.cuda.is_bf16_supported())


def enable_determinism() -> None:
    """Strict deterministic algorithms: an op without a deterministic implementation raises (a setup error, never
    a quiet warning); no cuDNN autotuning; TF32 matmuls as nanochat uses."""
    # torch.use_deterministic_algorithms() also imports Inductor (2-3 s) only to set its `deterministic` flag.
    # Runs that compile set that flag themselves (compiled.compile_model, and TORCHINDUCTOR_DETERMINISTIC=1 for
    # the compile workers), so eager runs skip the import: set the runtime switch directly when torch has it.
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is not None:
        setter(True, warn_only=False)
    else:
        torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("high")


def deterministic_mode() -> str:
    """"strict", "warn" or "off", as torch has it now."""
    if not torch.are_deterministic_algorithms_enabled():
        return "off"
    return "warn" if torch.is_deterministic_algorithms_warn_only_enabled() else "strict"


def choose_kernels(spec: DeviceSpec) -> dict:
    """Switch on only kernels that are deterministic on this platform; return what was chosen (for `start` and the
    reference fingerprint).

    Attention (SDPA): cuDNN attention is refused in strict mode anyway (sdp_utils.cpp, check_cudnn_deterministic)
    and memory-efficient attention is off (its backward is not documented as deterministic); CUDA keeps flash
    (strict mode makes its backward deterministic: attention_backward.cu) with math as the fallback for shapes and
    dtypes flash does not take; ROCm uses math (AOTriton's flash and memory-efficient paths are not documented as
    deterministic, and fall back or fail on some architectures); CPU uses math (its flash kernel is off too).
    GEMMs on ROCm: hipBLAS (rocBLAS), not hipBLASLt."""
    cuda = spec.type == "cuda"
    rocm = bool(torch.version.hip)
    flash = cuda and not rocm
    b = torch.backends.cuda
    for name, on in (("enable_cudnn_sdp", False), ("enable_mem_efficient_sdp", False), ("enable_flash_sdp", flash),
                     ("enable_math_sdp", True)):
        fn = getattr(b, name, None)
        if fn is not None:
            fn(on)
    blas = None
    if cuda:
        pref = getattr(b, "preferred_blas_library", None)
        if rocm and pref is not None:
            try:
                pref("cublas")  # on ROCm "cublas" is hipBLAS/rocBLAS (torch/backends/cuda/__init__.py)
            except RuntimeError:
                pass
        blas = str(pref()) if pref is not None else None
        if blas is not None:
            blas = blas.split(".")[-1].lower()
            if rocm:
                blas = {"cublas": "hipblas", "cublaslt": "hipblaslt"}.get(blas, blas)
    tunable = None
    tun = getattr(getattr(torch.cuda, "tunable", None), "enable", None)
    if cuda and tun is not None:
        tun(False)
        tunable = bool(torch.cuda.tunable.is_enabled())
    return {
        "deterministic": deterministic_mode(),
        "attention": "flash|math" if flash else "math",
        "blas": blas,
        "tunable_op": tunable,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def sdpa_backend(q: torch.Tensor) -> str:
    """The SDPA backend torch picks for causal attention on tensors like `q` under the switches above."""
    fn = getattr(torch, "_fused_sdp_choice", None)
    if fn is None:
        return "unknown"
    try:
        code = int(fn(q, q, q, is_causal=True))
    except RuntimeError as e:
        return f"none ({first_line(e, 80)})"
    enum = getattr(torch._C, "_SDPBackend", None)
    names = {int(v): k for k, v in enum.__members__.items()} if enum is not None else {}
    return names.get(code, str(code)).lower()


def driver_version(spec: DeviceSpec) -> str | None:
    """The GPU driver's version (NVIDIA: /proc/driver/nvidia/version; AMD: the amdgpu module's), else None."""
    if spec.type != "cuda":
        return None
    for path in ("/proc/driver/nvidia/version", "/sys/module/amdgpu/version"):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                line = f.readline().strip()
        except OSError:
            continue
        if line:
            return line[:160]
    return None


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


# torch.cuda.OutOfMemoryError (torch >= 1.13; torch.OutOfMemoryError names it too from 2.5): also on CPU builds
def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, (RuntimeError, MemoryError)) and "out of memory" in str(exc).lower())


def make_oom(message: str) -> BaseException:
    """An out-of-memory exception of the type torch raises (for the test hooks)."""
    return torch.cuda.OutOfMemoryError(message)
