"""This boot's id: what tells "the process died" apart from "the machine froze or reset" for an open trial."""

from __future__ import annotations

from tuner.core import kernel_files


def current_boot_id() -> str | None:
    """`/proc/sys/kernel/random/boot_id` under `paths.sysfs_root()`, or None when unreadable. The one reader: the
    root helper and the tuner's journal (`tuner.tuning.journal.current_boot_id`) both ask here, and it reads
    through `tuner.core.kernel_files` (a small regular file only: never a FIFO, /dev/zero or a stall)."""
    return kernel_files.boot_id()
