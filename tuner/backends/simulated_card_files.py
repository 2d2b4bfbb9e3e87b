"""The simulated cards' settings on disk: one small file per card, read and changed under a lock.

A simulated card stands for hardware: its setting must outlive one `tuner` process (a `set` here, a `status` in
another shell), and two processes that touch *different* cards of one simulated rig must not undo each other's
writes (issue 28, item 9: each process rewrote one shared file from its own memory, and sim0 ended at -50 mV with
no owner). So every card has its own file, and every change is read-modify-write under `flock(LOCK_EX)` on that
file; reads take `LOCK_SH`, so a reader never sees half a write.

The file is a fixed-size record (`RECORD_BYTES`, JSON padded with spaces) rewritten in place, as a register is:
once a card has been written, writing it again needs no new disk block, so a full disk never stops a simulated card
from going back to stock (a real card's reset needs no disk at all). A card that was never written has no file
and reads stock; a reset of it writes nothing. The files are opened as every file of the tuner's own is
(tuner.core.state_files: no link followed, the directory checked).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

from tuner.core import state_files
from tuner.core.errors import PermissionDenied, StateError, TunerError, disk_full, is_disk_full

RECORD_BYTES = 512


class CardFile:
    """One simulated card's record: `read()` and `update(change)`; `key` is the setting's field ("offset_mv")."""

    def __init__(self, path: Path, key: str, warn: Callable[[str], None]):
        self.path = Path(path)
        self.key = key
        self._warn = warn

    def _valid(self, doc: object) -> dict:
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        setting = doc.get(self.key, 0)
        if isinstance(setting, bool) or not isinstance(setting, int):
            raise ValueError(f"{self.key} is not a whole number")
        pid = doc.get("load_pid")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int)):
            raise ValueError("load_pid is not a whole number")
        return doc

    def _parse(self, raw: bytes) -> dict:
        if not raw.strip():
            return {}
        try:
            return self._valid(json.loads(raw))
        except (ValueError, RecursionError):
            self._warn(f"simulated card file {self.path} was corrupt; the card reads stock until it is written")
            return {}

    def _error(self, e: OSError, what: str) -> TunerError:
        if is_disk_full(e):
            return disk_full(self.path, what)
        if isinstance(e, state_files.UnsafeStatePath):
            return StateError(f"cannot {what} simulated card file {e}")
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return PermissionDenied(f"cannot {what} simulated card file {self.path}: {e.strerror}",
                                    f"make {self.path.parent} writable (the simulated cards live there)")
        return StateError(f"cannot {what} simulated card file {self.path}: {e.strerror or e}",
                          "move it aside; the card then reads stock")

    def read(self) -> dict:
        """The card's record ({} when it was never written: stock, no load)."""
        try:
            fd = state_files.open_regular(self.path, os.O_RDONLY, link_remedy="remove the link")
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise self._error(e, "read") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return self._parse(os.pread(fd, RECORD_BYTES + 1, 0))
        finally:
            os.close(fd)

    def update(self, change: Callable[[dict], None]) -> dict:
        """Apply `change` to the record under the card's lock and write it back in place; the new record."""
        fd = self._open_for_update(change)
        if fd is None:
            return {}  # never written, and the change leaves it at stock: nothing to record
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            doc = self._parse(os.pread(fd, RECORD_BYTES + 1, 0))
            change(doc)
            data = json.dumps(doc, sort_keys=True).encode()
            if len(data) >= RECORD_BYTES:
                raise AssertionError(f"a simulated card record outgrew {RECORD_BYTES} bytes: {data!r}")
            written = os.pwrite(fd, data.ljust(RECORD_BYTES - 1) + b"\n", 0)
            if written != RECORD_BYTES:
                raise OSError(errno.ENOSPC, "short write")
            return doc
        except OSError as e:
            raise self._error(e, "write") from None
        finally:
            os.close(fd)

    def _open_for_update(self, change: Callable[[dict], None]) -> int | None:
        try:
            if not os.path.lexists(self.path):
                probe: dict = {}
                change(probe)
                if not probe.get(self.key) and probe.get("load_pid") is None:
                    return None  # not even the directory is needed (a read-only one included)
            return state_files.open_file(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise self._error(e, "write") from None
