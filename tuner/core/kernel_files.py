"""Reading sysfs and procfs files without trusting what sits at the path.

Every read of `/sys` and `/proc` (under `paths.sysfs_root()`) goes through `read_bytes`/`read_text`, for every
backend and for the boot id. A file there is expected to be a regular file (the kernel's sysfs attributes report
S_ISREG and a size of 4096, procfs files S_ISREG and a size of 0: neither size says how much a read returns). So:

- it is opened with O_NONBLOCK, so a FIFO planted at the path (or at TUNER_SYSFS_ROOT's copy of it) cannot block
  the open, and anything that is not a regular file (a FIFO, /dev/zero, a socket, a directory) is refused before a
  byte is read: a FIFO would hang the tuner, /dev/zero would fill its memory;
- at most `max_bytes` are read (a sysfs `show` returns at most a page; more means it is not an attribute);
- the read runs in a worker thread and is given up after `timeout_s`: a driver that never answers a `show` (a GPU
  hung in reset), a FUSE or NFS file that blocks, cannot hang `list`, `status` or a bisect that holds a card lock.
  The main thread keeps taking signals meanwhile (a SIGTERM ends the command as usual).

Failures are OSErrors (`NotAKernelFile`, `TooLarge`, `TimeoutError`), so callers that already treat an unreadable
attribute as "absent" keep doing so. `open_regular`/`read_regular` hold any other path someone else chose (a
profile, a reference, the Bisect form's memory) to the same rule, without the thread: only a regular file is read.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tuner.core import paths

ATTRIBUTE_MAX_BYTES = 64 * 1024  # a sysfs show() fills at most one page; procfs texts we read are smaller still
READ_TIMEOUT_S = 5.0
BOOT_ID_PATH = "proc/sys/kernel/random/boot_id"
BOOT_ID_MAX_BYTES = 64  # "0f1d...-...\n" is 37 bytes
T = TypeVar("T")
_DRM_CARD = re.compile(r"card(\d+)")  # not the connectors (card0-DP-1), which also match card*


class NotARegularFile(OSError):
    """The path holds something other than a regular file; `kind` says what (`a FIFO`, `a directory`)."""

    def __init__(self, path: str | os.PathLike[str], mode: int, expected: str = "a regular file"):
        self.kind = file_kind(mode)
        super().__init__(errno.EINVAL, f"{self.kind}, not {expected}", str(path))


class NotAKernelFile(NotARegularFile):
    """A sysfs or procfs path holds something other than a regular file (FIFO, device node, socket, directory)."""


class TooLarge(OSError):
    """The file returned more than the cap: it is not the attribute we meant to read."""



def read_at_most(fd: int, max_bytes: int) -> bytes:
    """Read `fd` to its end, but never more than `max_bytes` + 1 bytes: a caller that gets more knows the file is
    over its cap without having read all of an endless one (/dev/zero)."""
    chunks: list[bytes] = []
    size = 0
    while size <= max_bytes:
        chunk = os.read(fd, max_bytes + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)

def file_kind(mode: int) -> str:
    """What a path that is not a regular file holds, for an error message (`a FIFO`)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = True,
                 error: type[NotARegularFile] = NotARegularFile, expected: str = "a regular file") -> int:
    """A read-only descriptor (blocking; the caller closes it) of `path` when it holds a regular file, else
    `error` saying it is not `expected`, raised before a byte is read. The one opener of a path someone else chose:
    O_NONBLOCK, so opening a FIFO returns at once instead of waiting for a writer, and a FIFO (the read would hang),
    a device node (/dev/zero never ends), a socket or a directory is refused. `follow_links=False`: a link is ELOOP."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(path, mode, expected)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], max_bytes: int, *, follow_links: bool = True) -> bytes:
    """`open_regular`'s file read to its end, but at most `max_bytes` + 1 bytes (more says it is over the cap)."""
    fd = open_regular(path, follow_links=follow_links)
    try:
        return read_at_most(fd, max_bytes)
    finally:
        os.close(fd)


def within(timeout_s: float, work: Callable[[], T], path: Path | str) -> T:
    """`work()`'s result, run in a worker thread and given up after `timeout_s` (TimeoutError naming `path`): a
    driver that never answers a `show` or a `store` (a GPU hung in reset), a FUSE or NFS file that blocks, cannot hang
    the tuner, and the main thread keeps taking signals meanwhile. A `work` given up on runs on: it releases what it
    holds itself."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"sysfs {path}", daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeoutError(errno.ETIMEDOUT, f"no answer within {timeout_s:g} s", str(path))
    if "error" in box:
        raise box["error"]
    return box["value"]


def read_bytes(path: Path | str, *, max_bytes: int = ATTRIBUTE_MAX_BYTES,
               timeout_s: float = READ_TIMEOUT_S) -> bytes:
    """The file's bytes (at most `max_bytes`); an OSError when it is missing, not a regular file, larger than the
    cap, or does not answer within `timeout_s`."""
    fd = open_regular(path, error=NotAKernelFile, expected="a sysfs or proc file")

    def read() -> bytes:  # owns fd from here on: closes it even when the caller gave up waiting
        try:
            return read_at_most(fd, max_bytes)
        finally:
            os.close(fd)

    data = within(timeout_s, read, path)
    if len(data) > max_bytes:
        raise TooLarge(errno.EFBIG, f"more than {max_bytes} bytes, not a sysfs or proc attribute", str(path))
    return data


def read_text(path: Path | str, *, max_bytes: int = ATTRIBUTE_MAX_BYTES, timeout_s: float = READ_TIMEOUT_S) -> str:
    """`read_bytes` decoded as the kernel writes these files (ASCII; anything else replaced, never an error)."""
    return read_bytes(path, max_bytes=max_bytes, timeout_s=timeout_s).decode("ascii", errors="replace")


def read_int(path: Path | str) -> int | None:
    """A number the kernel prints in C notation (`0x1002`, `0xfff7bfff`), or None when absent or unreadable."""
    try:
        return int(read_text(path).strip().strip("\0"), 0)
    except (OSError, ValueError):
        return None


def drm_cards(root: Path | str) -> list[tuple[str, Path, int | None]]:
    """Each `<root>/sys/class/drm/cardN` in N order: its name, its `device` directory and the PCI vendor id read
    there (None when unreadable)."""
    try:
        cards = [(int(m.group(1)), e) for e in (Path(root) / "sys/class/drm").iterdir()
                 if (m := _DRM_CARD.fullmatch(e.name))]
    except OSError:
        return []
    return [(e.name, e / "device", read_int(e / "device/vendor")) for _, e in sorted(cards)]


def boot_id() -> str | None:
    """This boot's id (`/proc/sys/kernel/random/boot_id` under `paths.sysfs_root()`), or None when it cannot be
    read as a small regular file: the journal and the per-card records then treat the boot as unknown. The one
    reader: the tuner's journal, the per-card records and the root helper all ask here."""
    try:
        text = read_text(paths.sysfs_root() / BOOT_ID_PATH, max_bytes=BOOT_ID_MAX_BYTES).strip()
    except OSError:
        return None
    return text or None


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started, as the kernel counts it: field 22 of `/proc/<pid>/stat` (under
    `paths.sysfs_root()`), clock ticks since boot, which no wall-clock step moves. With the boot id and the pid it
    names one process: a pid alone may be a later process's that reused the number. None when there is no such
    process or its line cannot be read or parsed. The command name (field 2, in parentheses) may itself hold spaces
    and parentheses, so the fields are counted after its last ')' (proc(5)): there they start at field 3."""
    try:
        line = read_text(paths.sysfs_root() / f"proc/{pid}/stat")
    except OSError:
        return None
    fields = line.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def same_boot(recorded: str | None, now: str | None) -> bool:
    """True when a record's boot id is this boot's (`now`, from `boot_id`); an unreadable one on either side is
    never the same boot (a reset since cannot be ruled out)."""
    return now is not None and recorded == now
