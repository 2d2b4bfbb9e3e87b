"""Read-only NVML probe: what the NVIDIA backend relies on, as this driver reports it (issue 13, items 7-9).

For every GPU: the graphics clock offset reported at each performance state (and its allowed range), the older
whole-curve VF offset, the performance state now, whether `nvmlDeviceGetMaxCustomerBoostClock` is supported, the
max clock, and the nvidia-ml-py / driver versions. Only Get* calls: it never changes clocks, offsets, power
limits or persistence, and never resets a GPU, so it is safe on a card that is not yours to tune.

    python bench/nvml_probe.py            # JSON on stdout

`probe(nvml)` is importable (bench/gpu_check.py uses it); `nvml` is an initialised pynvml module or a fake.
Run `probe_pstate(nvml, ...)` while a load runs to see the state CUDA work uses (often P2 on GeForce cards).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tuner.backends import nvml_offsets

PSTATES = range(16)


def _call(nvml, fn):
    """fn() or {"error": "<NVML error name>"}; AttributeError means this nvidia-ml-py lacks the call."""
    try:
        return fn()
    except AttributeError as e:
        return {"error": f"nvidia-ml-py lacks {getattr(e, 'name', None) or e}"}
    except nvml.NVMLError as e:
        return {"error": type(e).__name__}


def _text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def probe_pstate(nvml, handle):
    """The performance state now (0 = P0; 32 = unknown)."""
    return _call(nvml, lambda: int(nvml.nvmlDeviceGetPerformanceState(handle)))


def probe_gpu(nvml, handle) -> dict:
    offsets = {}
    for pstate in PSTATES:
        got = _call(
            nvml, lambda p=pstate: nvml_offsets.get_clock_offset(nvml, handle, nvml.NVML_CLOCK_GRAPHICS, p)
        )
        if isinstance(got, dict):
            if got["error"] not in ("NVMLError_InvalidArgument", "NVMLError_NotSupported"):
                offsets[f"P{pstate}"] = got
        else:
            offsets[f"P{pstate}"] = {
                "current_mhz": got.current_mhz,
                "min_mhz": got.min_mhz,
                "max_mhz": got.max_mhz,
            }
    boost = _call(
        nvml, lambda: int(nvml.nvmlDeviceGetMaxCustomerBoostClock(handle, nvml.NVML_CLOCK_GRAPHICS))
    )
    return {
        "name": _text(_call(nvml, lambda: nvml.nvmlDeviceGetName(handle))),
        "bus_id": _text(_call(nvml, lambda: nvml.nvmlDeviceGetPciInfo(handle).busId)),
        "pstate_now": probe_pstate(nvml, handle),
        "graphics_offset_per_pstate": offsets,
        "vf_offset_mhz": _call(nvml, lambda: int(nvml.nvmlDeviceGetGpcClkVfOffset(handle))),
        "max_customer_boost_mhz": boost,
        "max_customer_boost_supported": not isinstance(boost, dict),
        "max_graphics_clock_mhz": _call(
            nvml, lambda: int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_GRAPHICS))
        ),
        "sm_clock_now_mhz": _call(
            nvml, lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_GRAPHICS))
        ),
    }


def probe(nvml) -> dict:
    """Everything above for every GPU, plus versions. `nvml` must already be initialised."""
    return {
        "nvidia_ml_py": getattr(nvml, "__version__", None) or _package_version(),
        "has_clock_offset_struct": hasattr(nvml, "c_nvmlClockOffset_t"),
        "driver": _text(_call(nvml, nvml.nvmlSystemGetDriverVersion)),
        "gpus": [
            probe_gpu(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())
        ],
    }


def _package_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("nvidia-ml-py")
    except Exception:  # noqa: BLE001 - a version string is a nicety
        return None


def main() -> int:
    try:
        import pynvml
    except ImportError:
        print("nvidia-ml-py is not installed", file=sys.stderr)
        return 1
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        print(f"NVML unavailable: {type(e).__name__}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(probe(pynvml), indent=2))
    finally:
        pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
