"""Typed errors. Each carries a one-line message, a one-line remedy, and the exit code the CLI uses.

Library code raises these; only the composition roots (cli, app) turn them into exit codes or dialogs.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from typing import Any

from tuner.core import exit_codes


class TunerError(Exception):
    """Base class: something the user can act on. Never shown with a traceback. `exit_code`: the class's, unless
    one is given (an error that names its cause and exits with the cause's code)."""

    exit_code = exit_codes.USAGE

    def __init__(self, message: str, remedy: str | None = None, *, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.remedy = remedy
        if exit_code is not None:
            self.exit_code = exit_code

    def one_line(self) -> str:
        """The message and its remedy on one line, as the CLI prints it."""
        return f"{self.message}; {self.remedy}" if self.remedy else self.message


class UsageError(TunerError):
    """Bad input from the user: nothing was changed."""

    exit_code = exit_codes.USAGE


class UnknownDevice(UsageError):
    pass


class OutOfRange(UsageError):
    """A value outside the knob's range, off its step, or an overvolt without explicit permission."""


class PermissionDenied(TunerError):
    exit_code = exit_codes.PERMISSION


class Unsupported(TunerError):
    exit_code = exit_codes.UNSUPPORTED


class NoOffsetAllowed(Unsupported):
    """The driver allows no offset on this card (AMD: Overdrive off, no pp_od_clk_voltage), so the card runs at
    stock and nothing can be written: `at_stock` is its knob as it runs (current = stock). What only reads the
    setting (a screen at the card's own setting, a reference recording) goes on at stock."""

    def __init__(self, message: str, remedy: str | None, at_stock: Any):
        super().__init__(message, remedy)
        self.at_stock = at_stock  # a tuner.core.models.Knob


class NotApplied(TunerError):
    """The write was accepted but reading back shows a different value (the previous value was restored)."""

    exit_code = exit_codes.HARDWARE


class DeviceLost(TunerError):
    """The GPU stopped answering (NVML GpuIsLost, sysfs EPERM during reset). A trial counts this as a hard fail."""

    exit_code = exit_codes.HARDWARE


class StateError(UsageError):
    """A state or config file could not be read; nothing was changed."""


class DamagedState(StateError):
    """A safety file (unsafe list, tuning journal, trial guard) does not validate: torn, mistyped, bad bytes.

    Fails closed: nothing is written to that card until the user repairs or moves the file aside."""


class DiskFull(TunerError):
    """A file could not be written because the disk (or the user's quota) is full. Not "bad input": something may
    have happened before the write failed, so it has its own exit code."""

    exit_code = exit_codes.DISK_FULL


def disk_full(path: str | os.PathLike[str], what: str = "write") -> DiskFull:
    """The one message for ENOSPC / EDQUOT while writing `path`."""
    return DiskFull(f"cannot {what} {path}: no space left on the device",
                    "free disk space (or raise the quota) and run the command again")


def is_disk_full(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


def first_line(error: BaseException, limit: int = 300) -> str:
    """An exception's first line of text, cut to `limit`, or its type's name where it has no text: the part of a
    (multi-line, often huge) torch or driver error that fits in one line of an event or a log.

    >>> first_line(RuntimeError("CUDA error: an illegal memory access\\nCompile with TORCH_USE_CUDA_DSA"))
    'CUDA error: an illegal memory access'
    >>> first_line(RuntimeError(""))
    'RuntimeError'
    """
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


@contextlib.contextmanager
def write_errors(path: str | os.PathLike[str], what: str = "write", *, refused: str | None = None,
                 remedy: str | None = None) -> Iterator[None]:
    """Around a write of `path`: a full disk is the one DiskFull naming it (`what`: "write", "append to"); any other
    OSError becomes StateError(`refused`: the error's text after it), or is raised as it is when `refused` is None."""
    try:
        yield
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(path, what) from None
        if refused is None:
            raise
        raise StateError(f"{refused}: {e.strerror}", remedy) from None
