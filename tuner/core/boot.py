"""This boot's id: what tells "the process died" apart from "the machine froze or reset" for an open trial."""

from __future__ import annotations

from tuner.core import paths


def current_boot_id() -> str | None:
    """`/proc/sys/kernel/random/boot_id` under `paths.sysfs_root()`, or None when unreadable.

    The root helper reads it here; `tuner.tuning.journal.current_boot_id` reads the same file (one of them should
    call the other once the journal modules are merged)."""
    try:
        text = (paths.sysfs_root() / "proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return text or None
