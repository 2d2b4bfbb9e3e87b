"""Durable per-card, per-boot records in the state directory: what the tuner applied, and each card's stock table.

Why: a driver's read-back can lie (some NVIDIA drivers report 0 for applied offsets, LACT keeps its own record for
that reason), and Vega20's `r` re-reads the firmware's current table rather than the boot defaults. The tuner
therefore remembers, on disk and written atomically, what it wrote and what stock was at first contact. A record
from another boot is ignored: GPU settings do not survive a reboot.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from tuner.core import kernel_files, paths, state_files
from tuner.core.atomic import write_atomic

APPLIED = "applied"  # {"offsets": {"<pstate>": <value>}, "lock_clock_mhz": int | None}
STOCK = "stock"  # AMD curve formats: {"points": [[index, mhz, mv], ...]}


MAX_RECORD_BYTES = 64 * 1024


def _path(kind: str, card_key: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", card_key)
    return paths.state_dir() / "cards" / f"{kind}-{safe}.json"


def load(kind: str, card_key: str) -> dict | None:
    """The record, or None when there is none, it is unreadable, or it was written in another boot."""
    try:
        data = json.loads(state_files.read_file(_path(kind, card_key), MAX_RECORD_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("boot_id") != kernel_files.boot_id():
        return None
    return data


def save(kind: str, card_key: str, data: dict) -> None:
    """Raises OSError when it cannot be written (a read-only, full or unsafe state directory): the backends say
    so in one line and go on, since a record is a second opinion, never what makes a write safe."""
    document = {**data, "boot_id": kernel_files.boot_id()}
    write_atomic(_path(kind, card_key), json.dumps(document, sort_keys=True).encode())


def record_applied(card_key: str, device_id: str, value: int, unit: str, data: dict,
                   warn: Callable[[str], None]) -> None:
    """Record what the tuner applied (`data`), or clear the record at stock (`value` 0); one that cannot be written
    is said in one line through `warn`, and the backend goes on (see `save`)."""
    try:
        if value == 0:
            _path(APPLIED, card_key).unlink(missing_ok=True)
        else:
            save(APPLIED, card_key, data)
    except OSError as e:
        reason = str(e) if isinstance(e, state_files.UnsafeStatePath) else \
            f"{e.filename or 'the state directory'}: {e.strerror or e}"
        warn(f"{device_id} is at {value:+d} {unit} (read back); the tuner's own note of it could not be written "
             f"({reason})")
