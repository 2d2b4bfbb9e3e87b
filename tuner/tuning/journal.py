"""The crash-safe tuning journal (one per device) and the persistent unsafe list.

Layout under `$XDG_STATE_HOME/tuner/`:

- `journal/<device>.json`   the session document, rewritten atomically (temp file, fsync, rename). Its
  `open_trial` entry {session, device, setting, phase, boot_id, pid, started_at} is written *before* a
  trial touches the card and cleared after the card is back at stock, so a freeze or a reset leaves it set.
- `journal/<device>.log`    an append-only, fsynced event log (one JSON object a line).
- `unsafe/<device>.jsonl`   settings that froze or reset the machine or killed the tool mid-trial. Append-only;
  a new session (`--restart`) never clears it, and nothing applies a value in it automatically.

No I/O beyond those files and the boot id; no textual, no torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from pathlib import Path

from tuner.core import paths
from tuner.core.atomic import append_durable, write_atomic
from tuner.core.errors import StateError, UsageError
from tuner.core.models import Knob

JOURNAL_VERSION = 1

# Session states
ACTIVE = "active"  # a process is (or was, if it died) running this session
INTERRUPTED = "interrupted"  # stopped cleanly (Ctrl-C, SIGTERM, stop()); resumable
FINISHED = "finished"  # ended with a recommendation or a final failure; nothing to resume
UNRESOLVED = (ACTIVE, INTERRUPTED)


def _safe_name(device_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", device_id)


def journal_dir() -> Path:
    return paths.state_dir() / "journal"


def journal_path(device_id: str) -> Path:
    return journal_dir() / f"{_safe_name(device_id)}.json"


def log_path(device_id: str) -> Path:
    return journal_dir() / f"{_safe_name(device_id)}.log"


def unsafe_path(device_id: str) -> Path:
    return paths.state_dir() / "unsafe" / f"{_safe_name(device_id)}.jsonl"


def reference_path(device_id: str, session: str) -> Path:
    """Where a session's reference trajectory (recorded by the baseline) lives."""
    return journal_dir() / f"{_safe_name(device_id)}.{session}.ref"


def current_boot_id() -> str | None:
    """This boot's id (`/proc/sys/kernel/random/boot_id` under `paths.sysfs_root()`), or None if unreadable."""
    try:
        text = (paths.sysfs_root() / "proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return text or None


def pid_alive(pid: object) -> bool:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


# --- reading ------------------------------------------------------------------------------------------------------
def _read_json(path: Path) -> dict | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateError(f"cannot read tuning journal {path}: {e.strerror}", "fix its permissions") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise StateError(
            f"tuning journal {path} is corrupt", "move it aside; the unsafe list is kept separately"
        ) from None
    if not isinstance(doc, dict):
        raise StateError(f"tuning journal {path} is corrupt", "move it aside")
    return doc


def load(device_id: str) -> dict | None:
    """The device's journal document, or None when it has none."""
    return _read_json(journal_path(device_id))


def trial_open_at_previous_boot() -> dict | None:
    """The open trial of any device's journal that was left open by an earlier boot, else None.

    Used by the boot path (`tuner apply --boot`) to skip applying after a freeze or reset during a trial. When this
    boot's id cannot be read, an open trial whose process is not running counts too (the safe answer).
    """
    boot_id = current_boot_id()
    try:
        files = sorted(journal_dir().glob("*.json"))
    except OSError:
        return None
    for path in files:
        try:
            doc = _read_json(path)
        except StateError:
            # An unreadable journal might have held an open trial: at boot, the safe answer is "yes".
            return {"journal": str(path), "reason": "a tuning journal is unreadable, so a crashed trial cannot be "
                    "ruled out"}
        trial = (doc or {}).get("open_trial")
        if not isinstance(trial, dict):
            continue
        if boot_id is None:
            if not pid_alive(trial.get("pid")):
                return dict(trial)
        elif trial.get("boot_id") != boot_id:
            return dict(trial)
    return None


# --- the unsafe list ----------------------------------------------------------------------------------------------
def unsafe_entries(device_id: str) -> list[dict]:
    """Every recorded unsafe setting of the device, oldest first (unreadable lines are skipped)."""
    try:
        text = unsafe_path(device_id).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as e:
        raise StateError(f"cannot read the unsafe list {unsafe_path(device_id)}: {e.strerror}",
                         "fix its permissions") from None
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("setting"), int):
            entries.append(entry)
    return entries


def unsafe_settings(device_id: str) -> dict[int, dict]:
    """setting -> its (latest) unsafe entry."""
    return {e["setting"]: e for e in unsafe_entries(device_id)}


def refuse_unsafe(device_id: str, knob: Knob, value: int) -> None:
    """Raise UsageError when `value` is at or beyond a setting that froze, hung or reset this device in a trial.

    `set` and `apply` call this so a value that crashed the machine is never applied again without the user
    saying so explicitly (--ignore-unsafe); the bisect plan and the boot path never override it.
    """
    entries = unsafe_settings(device_id)
    blocking = [s for s in entries if s == value or knob.more_aggressive(value, s)]
    if not blocking:
        return
    worst = max(blocking, key=lambda s: (s - knob.stock) * -knob.aggressive_direction)  # least aggressive
    raise UsageError(
        f"{value:+d} {knob.unit} is at or beyond {worst:+d} {knob.unit}, which failed hard on {device_id} "
        f"({entries[worst].get('kind', 'failure')}: {entries[worst].get('reason', 'no reason recorded')})",
        "choose a less aggressive value, or pass --ignore-unsafe if you are sure",
    )


def add_unsafe(device_id: str, setting: int, *, unit: str, kind: str, reason: str, edge: bool,
               session: str | None = None, serial: str | None = None, kernel_log: list[str] | None = None) -> dict:
    entry = {
        "device": device_id,
        "serial": serial,
        "setting": setting,
        "unit": unit,
        "kind": kind,
        "reason": reason,
        "edge": edge,
        "session": session,
        "boot_id": current_boot_id(),
        "recorded_at": time.time(),
        "kernel_log": list(kernel_log or [])[-20:],
    }
    append_durable(unsafe_path(device_id), json.dumps(entry, sort_keys=True))
    return entry


# --- a lone guarded trial (apply --verify) -----------------------------------------------------------------------
def guard_path(device_id: str) -> Path:
    """Kept beside the session journals, so `trial_open_at_previous_boot` (which globs *.json) sees it too."""
    return journal_dir() / f"{_safe_name(device_id)}.guard.json"


def recover_stale_guard(device_id: str, unit: str) -> dict | None:
    """A guard left by an earlier boot or a dead process means that trial froze or killed something: record the
    setting as unsafe, remove the guard, and return the trial."""
    try:
        trial = (_read_json(guard_path(device_id)) or {}).get("open_trial")
    except StateError:
        trial = None
    if not isinstance(trial, dict):
        return None
    if trial.get("boot_id") == current_boot_id() and pid_alive(trial.get("pid")):
        return None  # another live process is verifying right now
    add_unsafe(device_id, int(trial["setting"]), unit=unit, kind="system-reset"
               if trial.get("boot_id") != current_boot_id() else "tool-died",
               reason=f"a {trial.get('phase', 'verify')} trial never finished", edge=True)
    guard_path(device_id).unlink(missing_ok=True)
    return trial


@contextlib.contextmanager
def guarded_trial(device_id: str, setting: int, *, unit: str, phase: str = "verify"):
    """Durably mark a trial outside any bisect session as open for its duration.

    If the machine freezes or the tool is killed, the guard stays: the boot path then applies nothing, and the
    next guarded trial on the device records the setting as unsafe. A trial that ends (pass or fail) removes it.
    """
    recover_stale_guard(device_id, unit)
    trial = {"device": device_id, "setting": setting, "phase": phase, "boot_id": current_boot_id(),
             "pid": os.getpid(), "started_at": time.time()}
    write_atomic(guard_path(device_id), json.dumps({"open_trial": trial}, sort_keys=True).encode())
    try:
        yield trial
    finally:
        guard_path(device_id).unlink(missing_ok=True)


# --- the session journal ------------------------------------------------------------------------------------------
class Journal:
    """One device's session document plus its event log. Every change is durable before the call returns."""

    def __init__(self, device_id: str, doc: dict):
        self.device_id = device_id
        self.doc = doc

    # construction
    @classmethod
    def create(cls, device_id: str, *, params: dict, knob: dict, serial: str | None = None) -> Journal:
        session = new_session_id()
        doc = {
            "version": JOURNAL_VERSION,
            "device": device_id,
            "serial": serial,
            "session": session,
            "state": ACTIVE,
            "pid": os.getpid(),
            "boot_id": current_boot_id(),
            "created_at": time.time(),
            "updated_at": time.time(),
            "params": params,
            "knob": knob,
            "reference": str(reference_path(device_id, session)),
            "trials": [],
            "open_trial": None,
        }
        journal = cls(device_id, doc)
        journal._save()
        journal.log("session_started", session=session, params=params)
        return journal

    @classmethod
    def open_existing(cls, device_id: str) -> Journal | None:
        doc = load(device_id)
        return None if doc is None else cls(device_id, doc)

    # properties
    @property
    def session(self) -> str:
        return self.doc["session"]

    @property
    def state(self) -> str:
        return self.doc.get("state", ACTIVE)

    @property
    def trials(self) -> list[dict]:
        return self.doc.setdefault("trials", [])

    @property
    def open_trial(self) -> dict | None:
        trial = self.doc.get("open_trial")
        return trial if isinstance(trial, dict) else None

    @property
    def reference(self) -> Path:
        return Path(self.doc.get("reference") or reference_path(self.device_id, self.session))

    def unresolved(self) -> bool:
        return self.state in UNRESOLVED

    # writing
    def _save(self) -> None:
        self.doc["updated_at"] = time.time()
        try:
            write_atomic(journal_path(self.device_id), json.dumps(self.doc, indent=1, sort_keys=True).encode())
        except OSError as e:
            raise StateError(f"cannot write the tuning journal {journal_path(self.device_id)}: {e.strerror}",
                             "check XDG_STATE_HOME and free disk space") from None

    def log(self, event: str, **fields) -> None:
        line = json.dumps({"time": time.time(), "event": event, "session": self.session, **fields},
                          sort_keys=True, default=str)
        try:
            append_durable(log_path(self.device_id), line)
        except OSError as e:
            raise StateError(f"cannot append to {log_path(self.device_id)}: {e.strerror}",
                             "check XDG_STATE_HOME and free disk space") from None

    def claim(self) -> None:
        """This process now runs the session (on resume)."""
        self.doc["state"] = ACTIVE
        self.doc["pid"] = os.getpid()
        self.doc["boot_id"] = current_boot_id()
        self._save()
        self.log("session_resumed", pid=os.getpid())

    def begin_trial(self, setting: int, phase: str) -> dict:
        """Durably record the trial about to touch the card. Call before applying the setting."""
        trial = {
            "session": self.session,
            "device": self.device_id,
            "setting": setting,
            "phase": phase,
            "boot_id": current_boot_id(),
            "pid": os.getpid(),
            "started_at": time.time(),
        }
        self.doc["open_trial"] = trial
        self.doc["state"] = ACTIVE
        self._save()
        self.log("trial_open", **trial)
        return trial

    def finish_trial(self, record: dict) -> None:
        """The card is back at stock: store the result and close the open trial (one atomic write)."""
        self.trials.append(record)
        self.doc["open_trial"] = None
        self._save()
        self.log("trial_closed", setting=record.get("setting"), phase=record.get("phase"),
                 verdict=record.get("verdict"), kind=record.get("kind"))

    def abandon_trial(self, reason: str) -> None:
        """The trial was stopped on purpose and the card reset: no result, rerun it on resume."""
        trial = self.open_trial
        self.doc["open_trial"] = None
        self._save()
        self.log("trial_abandoned", reason=reason, setting=(trial or {}).get("setting"))

    def record_recovered(self, record: dict) -> None:
        """A trial left open by a dead process or an earlier boot, now counted as a result."""
        self.finish_trial(record)

    def set_field(self, key: str, value) -> None:
        self.doc[key] = value
        self._save()

    def close(self, state: str, **fields) -> None:
        self.doc["state"] = state
        self.doc["open_trial"] = None
        self.doc.update(fields)
        self._save()
        self.log("session_" + state, **fields)
