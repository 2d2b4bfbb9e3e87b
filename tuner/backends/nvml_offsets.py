"""NVML clock-offset calls made through the function pointers, because pynvml's own wrappers get them wrong.

pynvml's `nvmlDeviceSetClockOffsets` / `nvmlDeviceGetClockOffsets` call NVML and then return NVML_SUCCESS whatever
NVML said (control.md §3.2), so a refused offset would look applied. Here the struct goes by pointer (`byref`) and
the return code is checked, so failures raise the proper `NVMLError_*`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClockOffset:
    current_mhz: int
    min_mhz: int
    max_mhz: int


def _info(nvml: Any, clock_type: int, pstate: int, offset_mhz: int = 0) -> Any:
    info = nvml.c_nvmlClockOffset_t()
    info.version = nvml.nvmlClockOffset_v1
    info.type = clock_type
    info.pstate = pstate
    info.clockOffsetMHz = offset_mhz
    return info


def get_clock_offset(nvml: Any, handle: Any, clock_type: int, pstate: int) -> ClockOffset:
    """Current offset and the driver's allowed range (driver >= 555). Raises NVMLError_* on failure."""
    info = _info(nvml, clock_type, pstate)
    fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetClockOffsets")
    nvml._nvmlCheckReturn(fn(handle, ctypes.byref(info)))
    return ClockOffset(int(info.clockOffsetMHz), int(info.minClockOffsetMHz), int(info.maxClockOffsetMHz))


def set_clock_offset(nvml: Any, handle: Any, clock_type: int, pstate: int, offset_mhz: int) -> None:
    """Set one clock's offset at one performance state (driver >= 555). Raises NVMLError_* on failure."""
    info = _info(nvml, clock_type, pstate, offset_mhz)
    fn = nvml._nvmlGetFunctionPointer("nvmlDeviceSetClockOffsets")
    nvml._nvmlCheckReturn(fn(handle, ctypes.byref(info)))
