"""Is a process still there? Used for the journal's owner and the simulated card's load marker."""

from __future__ import annotations

import os


def pid_alive(pid: object) -> bool:
    """True when `pid` names a live process (one we may not signal counts: it exists)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
