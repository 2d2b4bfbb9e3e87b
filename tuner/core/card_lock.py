"""One writer per card: an advisory lock held by whoever may change a card's setting.

`set` holds it while a change waits for confirmation, `apply` and `reset` while they write, a bisect for its whole
life. A second writer (another shell, a boot apply, the TUI) is refused with the holder's pid and command instead
of silently interleaving writes with a running trial. The lock is `flock(2)` on a file in the state directory, so
the kernel releases it when the holder dies (even by kill -9): a dead holder never blocks anyone. A holder that
is alive but stuck (stopped with Ctrl-Z, hung in the driver) is what `tuner reset --force` is for.

Within one process (the TUI runs jobs in threads) the same rule holds: a card has one writer at a time.

The lock file is opened through `state_files.open_file` (no link followed, the directory checked): a link planted
at `locks/<card>.lock` is refused with one line and its target is never truncated. On a read-only state directory
an existing lock file is opened read-only (flock needs no write access; the holder is then not named), and when
there is no lock file and none can be made, `LockUnavailable` says so: nobody else can hold a lock that no one
could create, which is why `tuner reset` may go on without it (returning to stock never needs the state).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Self

from tuner.core import exit_codes, state_files
from tuner.core.errors import TunerError, is_disk_full
from tuner.core.paths import state_dir


class CardBusy(TunerError):
    """Another writer holds the card; nothing was changed."""

    exit_code = exit_codes.BUSY


class LockUnavailable(TunerError):
    """The card's lock file could not be opened or made (a read-only, full or unsafe state directory). Nobody
    else could have made it either; the message names the path and the reason, the code fits the reason."""

    exit_code = exit_codes.PERMISSION


def _unavailable(path: Path, error: OSError) -> LockUnavailable:
    """The one message for a lock file that cannot be opened, with the exit code that fits its reason."""
    if isinstance(error, state_files.UnsafeStatePath):
        return LockUnavailable(f"refusing the card lock: {error}", exit_code=exit_codes.USAGE)
    if is_disk_full(error):
        code = exit_codes.DISK_FULL
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        code = exit_codes.PERMISSION
    else:
        code = exit_codes.USAGE  # ENOTDIR and the like: a state directory in a shape the tuner did not make
    return LockUnavailable(f"cannot open the card lock {path}: {error.strerror or error}",
                           "make the state directory writable (XDG_STATE_HOME) or free disk space", exit_code=code)


def lock_path(device_id: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in device_id)
    return state_dir() / "locks" / f"{safe}.lock"


_held_here: dict[str, str] = {}  # lock file -> what holds it in this process
_held_here_lock = threading.Lock()


def describe_holder(device_id: str) -> str | None:
    """'pid 1234 (tuner bisect --device sim0) since 12:00:01', or None when the file names nobody."""
    try:
        info = json.loads(state_files.read_file(lock_path(device_id), 4096).decode("utf-8"))
        started = time.strftime("%H:%M:%S", time.localtime(float(info["since"])))
        command = "".join(ch if ch.isprintable() else "?" for ch in str(info["command"]))[:120]
        return f"pid {int(info['pid'])} ({command}) since {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


class CardLock:
    """`with CardLock(device_id, "tuner set"):` — raises CardBusy when someone else holds the card."""

    def __init__(self, device_id: str, purpose: str | None = None):
        self.device_id = device_id
        self.purpose = purpose or " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))
        self._fd: int | None = None
        self._key = ""
        # why the holder's name could not be written into the lock file (read-only or full state directory):
        # the lock still excludes, but a refused writer cannot say who holds the card
        self.unnamed: OSError | None = None

    def acquire(self) -> CardLock:
        with _held_here_lock:
            path = lock_path(self.device_id)
            key = str(path)
            if key in _held_here:
                raise CardBusy(f"{self.device_id} is busy: {_held_here[key]} is changing it in this "
                               "tuner", "wait for it to finish or stop it first")
            fd, unnamed = self._open(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = describe_holder(self.device_id) or "another tuner process"
                raise CardBusy(f"{self.device_id} is busy: {holder} is changing it; nothing was changed",
                               "wait for it to finish or stop it; if that process is stuck, `tuner reset --force` "
                               "puts the card back to stock anyway") from None
            if unnamed is None:
                info = {"pid": os.getpid(), "command": self.purpose, "since": time.time()}
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, json.dumps(info).encode(), 0)
                except OSError as e:
                    unnamed = e  # a full disk only loses the holder's name; the flock is what excludes
            self.unnamed = unnamed
            self._fd = fd
            self._key = key
            _held_here[key] = self.purpose
        return self

    @staticmethod
    def _open(path: Path) -> tuple[int, OSError | None]:
        """The lock file's descriptor, and why it could not be opened for writing the holder's name (None: it
        could)."""
        try:
            return state_files.open_file(path, os.O_RDWR | os.O_CREAT, 0o644), None
        except state_files.UnsafeStatePath as e:
            raise _unavailable(path, e) from None
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) and not is_disk_full(e):
                raise _unavailable(path, e) from None
            first = e
        try:  # read-only or full: an existing lock file still takes a flock
            return state_files.open_file(path, os.O_RDONLY), first
        except OSError:
            raise _unavailable(path, first) from None

    def release(self) -> None:
        with _held_here_lock:
            if self._fd is None:
                return
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)  # the file no longer names a holder
            os.close(self._fd)  # closing releases the flock
            self._fd = None
            _held_here.pop(self._key, None)

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()
