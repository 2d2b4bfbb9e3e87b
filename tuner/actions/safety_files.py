"""What a card's safety files say, as the front ends read them: a trial left open, the unsafe list, a session's
recorded trials.

The files belong to tuner.tuning.journal (the one place that decides whose trial is open and what is unsafe); the
CLI's `status` and `unsafe` and the UI's resumed bisect reach them only through this module (the import contract
`front-ends-through-actions` in pyproject.toml).
"""

from __future__ import annotations

from tuner.tuning import journal
from tuner.tuning.journal import Owner, clear_unsafe, leftover_trial, unsafe_entries

__all__ = ["Owner", "clear_unsafe", "leftover_trial", "session_trials", "unfinished_session_trials", "unsafe_entries"]


def session_trials(device_id: str) -> tuple[dict, ...]:
    """The trials the card's journal recorded for its current session (none when there is no journal)."""
    doc = journal.load(device_id) or {}
    return tuple(doc.get("trials") or ())


def unfinished_session_trials(device_id: str) -> tuple[dict, ...] | None:
    """The trials of the card's unfinished session (one `--resume` would continue), or None when it has none or
    its journal cannot be read (a start then refuses and says why)."""
    from tuner.core.errors import TunerError

    try:
        doc = journal.load(device_id)
    except (TunerError, OSError):
        return None
    if doc is None or doc["state"] not in journal.UNRESOLVED:
        return None
    return tuple(doc["trials"])
