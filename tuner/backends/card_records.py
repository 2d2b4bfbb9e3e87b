"""Durable per-card, per-boot records in the state directory: what the tuner applied, and each card's stock table.

Why: a driver's read-back can lie (some NVIDIA drivers report 0 for applied offsets, LACT keeps its own record for
that reason), and Vega20's `r` re-reads the firmware's current table rather than the boot defaults. The tuner
therefore remembers, on disk and written atomically, what it wrote and what stock was at first contact. A record
from another boot is ignored: GPU settings do not survive a reboot.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tuner.core import paths
from tuner.core.atomic import write_atomic

APPLIED = "applied"  # {"offsets": {"<pstate>": <value>}, "lock_clock_mhz": int | None}
STOCK = "stock"  # AMD curve formats: {"points": [[index, mhz, mv], ...]}


def boot_id() -> str | None:
    """This boot's id (`/proc/sys/kernel/random/boot_id` under `paths.sysfs_root()`), or None if unreadable."""
    try:
        return (paths.sysfs_root() / "proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _path(kind: str, card_key: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", card_key)
    return paths.state_dir() / "cards" / f"{kind}-{safe}.json"


def load(kind: str, card_key: str) -> dict | None:
    """The record, or None when there is none, it is unreadable, or it was written in another boot."""
    try:
        data = json.loads(_path(kind, card_key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("boot_id") != boot_id():
        return None
    return data


def save(kind: str, card_key: str, data: dict) -> None:
    write_atomic(_path(kind, card_key), json.dumps({**data, "boot_id": boot_id()}, sort_keys=True).encode())


def clear(kind: str, card_key: str) -> None:
    try:
        _path(kind, card_key).unlink()
    except FileNotFoundError:
        pass
