"""Text that means the GPU itself failed (not our code), shared by the engine and `tuner.tuning.engine_client`.

Torch-free on purpose: the client classifies the engine's stderr with it when the engine could not report the
error itself (the HIP runtime aborts the process on a memory access fault before Python sees anything).
"""

from __future__ import annotations

import re

# (label, case-insensitive regex). Order matters only for which label is reported first.
DEVICE_ERROR_PATTERNS: tuple[tuple[str, str], ...] = (
    ("memory access fault", r"memory access fault by gpu"),
    # ROCr (ROCm's runtime) on a hardware exception, e.g. "HW Exception by GPU node-1 (Agent handle: 0x...) reason
    # :GPU Hang" (the queue error it then aborts with is the HSA pattern below), and amdgpu's ring timeout text
    ("GPU hang", r"reason\s*:\s*gpu hang|\bgpu hang\b|ring \S+ timeout"),
    ("hardware exception", r"hw exception by gpu"),
    ("HSA error", r"hsa_status_error"),
    ("illegal memory access", r"illegal memory access"),
    ("unspecified launch failure", r"unspecified launch failure"),
    ("device lost", r"device (?:is )?lost|gpu is lost|fallen off the bus"),
    ("HIP error", r"hiperror|hip error"),
    ("CUDA error", r"cuda error|cudaerror"),
    ("device-side assert", r"device-side assert"),
    ("illegal instruction", r"illegal instruction"),
    ("misaligned address", r"misaligned address"),
    ("launch timeout", r"launch timed out|launch timeout"),
    ("BLAS failure", r"(?:cublas|hipblas|rocblas|hipblaslt)_status_(?:execution_failed|internal_error)"),
    ("ECC error", r"uncorrectable ecc"),
)
_COMPILED = tuple((label, re.compile(rx, re.IGNORECASE)) for label, rx in DEVICE_ERROR_PATTERNS)


def match_device_error(text: str) -> str | None:
    """The label of the first device-error pattern found in `text`, else None.

    >>> match_device_error("RuntimeError: CUDA error: an illegal memory access was encountered")
    'illegal memory access'
    >>> match_device_error("Memory access fault by GPU node-1 (Agent handle: 0x5) on address 0x7f")
    'memory access fault'
    >>> match_device_error("HW Exception by GPU node-1 (Agent handle: 0x55d0) reason :GPU Hang")
    'GPU hang'
    >>> match_device_error("HW Exception by GPU node-1 (Agent handle: 0x55d0) reason :ECC error")
    'hardware exception'
    >>> match_device_error("CUDA out of memory. Tried to allocate 2.00 GiB") is None
    True
    """
    lines = [ln for ln in text.splitlines() if "out of memory" not in ln.lower()]
    for label, rx in _COMPILED:
        if any(rx.search(ln) for ln in lines):
            return label
    return None
