"""The rig journal: one crash-safe document for a concurrent bisect over several cards and its whole-rig
confirmation (`tuner bisect --device all`).

It lives beside the per-card journals as `journal/rig+<dev>+<dev>....rig.json` (a name no card's journal can
have: card names never hold "+"), is rewritten atomically like them, and holds what the per-card journals cannot:
which per-card sessions belong to the rig, the data-parallel references recorded at stock, the confirmation
attempts, the current candidate of every card, and the rig trial that is open *before* it touches any card
(boot id and pid, so a reset or a dead tool is told apart exactly as for one card). The boot path
(`journal.trial_open_at_previous_boot`) globs `*.json` in the same directory and so sees an open rig trial too.

No textual, no torch.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from tuner.core.atomic import write_atomic
from tuner.core.errors import StateError, disk_full, is_disk_full
from tuner.tuning import journal
from tuner.tuning.journal_schema import SESSION_RE, STATES, check_open_trial

RIG_SUFFIX = ".rig.json"
RIG_VERSION = 1
PHASES = ("search", "baseline", "confirm", "done")


def rig_path(device_ids: Sequence[str]) -> Path:
    names = "+".join(re.sub(r"[^A-Za-z0-9_.-]", "_", d) for d in sorted(device_ids))
    return journal.journal_dir() / f"rig+{names}{RIG_SUFFIX}"


def rig_reference_path(device_id: str, session: str) -> Path:
    """Where a card's data-parallel reference (recorded at stock in the rig baseline) lives."""
    return journal.journal_dir() / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', device_id)}.{session}.rig-ref"


def is_rig_path(path: Path) -> bool:
    return path.name.endswith(RIG_SUFFIX)


def _is_setting_map(v: object) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, int) and not isinstance(x, bool)
                                       for k, x in v.items())


def check_rig_journal(doc: object) -> str | None:
    """None when `doc` is a valid rig journal, else one phrase saying what is wrong."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("version") != RIG_VERSION:
        return f"'version' is not {RIG_VERSION}"
    session = doc.get("session")
    if not isinstance(session, str) or not SESSION_RE.fullmatch(session):
        return "'session' is not a session id"
    if doc.get("state") not in STATES:
        return f"'state' is not one of {', '.join(STATES)}"
    if doc.get("phase") not in PHASES:
        return f"'phase' is not one of {', '.join(PHASES)}"
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices):
        return "'devices' is not a list of card ids"
    for key in ("candidates", "stock"):
        if not _is_setting_map(doc.get(key, {})):
            return f"{key!r} is not a map of card -> whole number"
    sessions = doc.get("sessions", {})
    if not isinstance(sessions, dict) or not all(isinstance(v, str) for v in sessions.values()):
        return "'sessions' is not a map of card -> session id"
    for key in ("attempts", "never"):
        if not isinstance(doc.get(key, []), list):
            return f"{key!r} is not a list"
    if not all(_is_setting_map(c) for c in doc.get("never", [])):
        return "'never' holds something that is not a map of card -> whole number"
    trial = doc.get("open_trial")
    if trial is not None:
        if not isinstance(trial, dict) or not _is_setting_map(trial.get("settings")):
            return "'open_trial' has no settings map"
        return check_open_trial({**trial, "setting": 0}, in_session=False)
    return None


class RigJournal:
    """The rig's document. Every change is durable (atomic rewrite) before the call returns."""

    def __init__(self, path: Path, doc: dict):
        self.path, self.doc = path, doc

    @classmethod
    def create(cls, device_ids: Sequence[str], *, params: dict, stock: dict[str, int]) -> RigJournal:
        doc = {"version": RIG_VERSION, "session": journal.new_session_id(), "devices": sorted(device_ids),
               "state": journal.ACTIVE, "phase": "search", "pid": os.getpid(), "boot_id": journal.current_boot_id(),
               "created_at": time.time(), "params": params, "stock": stock, "sessions": {}, "candidates": {},
               "references": {}, "baseline": None, "attempts": [], "never": [], "open_trial": None}
        rig = cls(rig_path(device_ids), doc)
        rig._save()
        return rig

    @classmethod
    def open_existing(cls, device_ids: Sequence[str]) -> RigJournal | None:
        path = rig_path(device_ids)
        doc = journal._read_json(path)
        if doc is None:
            return None
        problem = check_rig_journal(doc)
        if problem:
            raise journal._damaged(path, problem)
        return cls(path, doc)

    # --- reading ----------------------------------------------------------------------------------------------
    @property
    def session(self) -> str:
        return self.doc["session"]

    @property
    def state(self) -> str:
        return self.doc["state"]

    @property
    def phase(self) -> str:
        return self.doc["phase"]

    @property
    def open_trial(self) -> dict | None:
        trial = self.doc.get("open_trial")
        return trial if isinstance(trial, dict) else None

    @property
    def attempts(self) -> list[dict]:
        return self.doc.setdefault("attempts", [])

    def unresolved(self) -> bool:
        return self.state in journal.UNRESOLVED

    def never(self, settings: dict[str, int]) -> bool:
        """A combination that was open when the machine reset: never applied again."""
        return any(dict(c) == settings for c in self.doc.get("never", []))

    # --- writing ----------------------------------------------------------------------------------------------
    def _save(self) -> None:
        self.doc["updated_at"] = time.time()
        try:
            write_atomic(self.path, json.dumps(self.doc, indent=1, sort_keys=True, default=str).encode())
        except OSError as e:
            if is_disk_full(e):
                raise disk_full(self.path) from None
            raise StateError(f"cannot write the rig journal {self.path}: {e.strerror}",
                             "check XDG_STATE_HOME and free disk space") from None

    def update(self, **fields: object) -> None:
        self.doc.update(fields)
        self._save()

    def claim(self) -> None:
        self.update(state=journal.ACTIVE, pid=os.getpid(), boot_id=journal.current_boot_id())

    def begin_trial(self, phase: str, attempt: int, settings: dict[str, int]) -> dict:
        """Durably record the rig trial about to touch the cards. Call before applying anything."""
        trial = {"phase": phase, "attempt": attempt, "settings": dict(settings), "boot_id": journal.current_boot_id(),
                 "pid": os.getpid(), "started_at": time.time()}
        self.update(open_trial=trial, state=journal.ACTIVE)
        return trial

    def end_trial(self, **fields: object) -> None:
        """Every card is back at stock: close the open trial (with what it found, one atomic write)."""
        self.update(open_trial=None, **fields)

    def close(self, state: str, **fields: object) -> None:
        self.update(state=state, open_trial=None, **fields)


__all__ = ["RigJournal", "check_rig_journal", "is_rig_path", "rig_path", "rig_reference_path"]
