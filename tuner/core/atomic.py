"""Crash-safe file writes: temp file in the same directory, fsync, rename, fsync the directory.

A kill or power loss at any point leaves either the old file or the new one, never a torn one.

In the tuner's state (`state_files.trusted_root`) the directory is checked first and a link or a non-regular
file at the destination is refused (`state_files.UnsafeStatePath`), never replaced or followed; the appends of the
event logs and the unsafe list open their file without following a link. Both raise OSError on failure, as they
always have: callers turn ENOSPC into "disk full" and anything else into one line.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from tuner.core import state_files


def _refuse_link_at(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise state_files.UnsafeStatePath(path, "is a symbolic link", "remove the link (its target was not touched)")
    if not stat.S_ISREG(mode):
        raise state_files.UnsafeStatePath(path, "is not a regular file", "move it aside")


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    path = Path(path)
    state_files.ensure_dir(path.parent)
    if state_files.trusted_root(path) is not None:
        _refuse_link_at(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # O_EXCL: never a link
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def append_durable(path: Path, line: str) -> None:
    """Append one line and fsync it (event logs that must survive a hard reset). Never through a link.

    A file whose last line a crash tore (no newline at its end) gets the newline first: the new line stays a line
    of its own, readable once the torn one is repaired, instead of being glued into it."""
    fd = state_files.open_file(Path(path), os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as f:  # closes the descriptor whatever fails below
        size = os.fstat(fd).st_size
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        f.write(("\n" if torn else "") + line.rstrip("\n") + "\n")
        f.flush()
        os.fsync(f.fileno())
