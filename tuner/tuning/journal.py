"""The crash-safe tuning journal (one per device) and the persistent unsafe list.

Layout under `$XDG_STATE_HOME/tuner/`:

- `journal/<device>.json`   the session document, rewritten atomically (temp file, fsync, rename). Its
  `open_trial` entry {session, device, setting, phase, boot_id, pid, started_at} is written *before* a
  trial touches the card and cleared after the card is back at stock, so a freeze or a reset leaves it set.
- `journal/<device>.log`    an append-only, fsynced event log (one JSON object a line).
- `unsafe/<device>.jsonl`   settings that froze, hung or reset the machine or lost the GPU mid-trial (never a
  tool death, a full disk or an engine killed from outside: those trials are inconclusive and run again).
  Append-only; a new session (`--restart`) never clears it, only `tuner unsafe clear` (which asks first), and
  nothing applies a value in it automatically.

Every file is validated (`journal_schema`) when read. A torn line, a wrong type or bad bytes in any of them fails
closed: `check_safety_state` raises `DamagedState` naming the file and the remedy, and set, apply, boot apply and
bisect refuse that card until it is repaired or moved aside. Nothing is skipped silently.

No I/O beyond those files and the boot id; no textual, no torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tuner.core import kernel_files, paths, processes, state_files
from tuner.core.atomic import append_durable, write_atomic
from tuner.core.errors import DamagedState, StateError, UsageError, disk_full, is_disk_full
from tuner.core.models import Knob
from tuner.tuning import journal_schema

JOURNAL_VERSION = 1
MAX_STATE_FILE_BYTES = 64 * 1024 * 1024  # far above any journal or unsafe list; a bigger file is not one

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
    """This boot's id, or None if unreadable (tuner.core.kernel_files: never a FIFO, /dev/zero or a stall)."""
    return kernel_files.boot_id()


pid_alive = processes.pid_alive  # the journal's owner check (kept as a name here: callers use journal.pid_alive)


def new_session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


# --- reading ------------------------------------------------------------------------------------------------------
_MOVE_ASIDE = ("check it, then move it aside (the unsafe list is kept separately); a trial it recorded may have "
               "crashed the machine, so note its setting first")


def _damaged(path: Path, problem: str, remedy: str = _MOVE_ASIDE) -> DamagedState:
    return DamagedState(f"{path} is damaged ({problem})", f"nothing was written to the card; {remedy}")


def _read_json(path: Path) -> dict | None:
    try:
        raw = state_files.read_file(path, MAX_STATE_FILE_BYTES)  # no link followed, never a FIFO's hang
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateError(f"cannot read tuning journal {path}: {e.strerror}", "fix its permissions") from None
    try:
        doc = json.loads(raw)  # bytes: bad UTF-8 raises UnicodeDecodeError, a ValueError
    except (ValueError, RecursionError):
        raise _damaged(path, "not valid UTF-8 JSON: torn or overwritten") from None
    if not isinstance(doc, dict):
        raise _damaged(path, "not a JSON object")
    return doc


def _is_guard(path: Path) -> bool:
    return path.name.endswith(".guard.json")


def _validate(path: Path, doc: dict) -> dict:
    if path.name.endswith(".rig.json"):  # a rig bisect's journal (tuner/tuning/journal_rig.py)
        from tuner.tuning.journal_rig import check_rig_journal

        problem = check_rig_journal(doc)
    elif _is_guard(path):
        problem = journal_schema.check_guard(doc)
    else:
        session = doc.get("session")
        name = f"{path.name[:-len('.json')]}.{session}.ref" if isinstance(session, str) else None
        problem = journal_schema.check_journal(doc, reference_name=name)
    if problem:
        raise _damaged(path, problem)
    return doc


def load(device_id: str) -> dict | None:
    """The device's journal document (validated: DamagedState when it is not), or None when it has none."""
    path = journal_path(device_id)
    doc = _read_json(path)
    return None if doc is None else _validate(path, doc)


def load_guard(device_id: str) -> dict | None:
    path = guard_path(device_id)
    doc = _read_json(path)
    return None if doc is None else _validate(path, doc)


def check_safety_state(device_id: str) -> None:
    """Raise DamagedState when any safety file of the device (unsafe list, journal, guard) does not validate.

    Every command that writes a setting to a card (set, apply, boot apply, bisect) calls this first: a file we
    cannot trust might be hiding the very value that crashed the machine, so we fail closed.
    """
    unsafe_entries(device_id)
    load(device_id)
    load_guard(device_id)


def leftover_trial(device_id: str) -> dict | None:
    """A trial (bisect or guarded verify) left open on this device by a process that is gone, else None.

    The card may still hold its value (a kill -9 gives no chance to reset): `tuner status` warns with it.
    """
    for doc in (load(device_id), load_guard(device_id)):
        trial = (doc or {}).get("open_trial")
        if isinstance(trial, dict):
            same_boot = trial.get("boot_id") == current_boot_id()
            if not (same_boot and pid_alive(trial.get("pid"))):
                return {**trial, "rebooted": not same_boot}
    return None


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
            if doc is not None:
                _validate(path, doc)
        except DamagedState as e:
            # A damaged journal might have held an open trial: at boot, the safe answer is "yes".
            return {"journal": str(path), "reason": f"a tuning journal is unreadable: {e.message}, so a crashed "
                    "trial cannot be ruled out"}
        except StateError:
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
    """Every recorded unsafe setting of the device, oldest first.

    Fails closed: a torn line (a crash mid-append), a wrong type (`"setting": "-40"`, `-40.0`) or bytes that are
    not UTF-8 raise DamagedState naming the file and line; skipping the line would forget a value that crashed
    the machine. Blank lines are allowed.
    """
    path = unsafe_path(device_id)
    try:
        raw = state_files.read_file(path, MAX_STATE_FILE_BYTES)  # no link followed, never a FIFO's hang
    except FileNotFoundError:
        return []
    except OSError as e:
        raise StateError(f"cannot read the unsafe list {path}: {e.strerror}", "fix its permissions") from None

    def remedy(n: int) -> str:
        return (f"repair or delete line {n} of {path} by hand (each line is one JSON object with an integer "
                "\"setting\"); keep the values it names in mind, they crashed this card")

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        n = raw.count(b"\n", 0, e.start) + 1
        raise _damaged(path, f"line {n} is not UTF-8", remedy(n)) from None
    entries = []
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            raise _damaged(path, f"line {n} is not valid JSON (torn?)", remedy(n)) from None
        problem = journal_schema.check_unsafe_entry(entry)
        if problem:
            raise _damaged(path, f"line {n}: {problem}", remedy(n))
        entries.append(entry)
    return entries


def clear_unsafe(device_id: str, setting: int | None = None) -> list[dict]:
    """Remove the device's unsafe entries (all, or those for `setting`); returns what was removed.

    Only `tuner unsafe clear` calls this, after asking. The list is rewritten atomically; a damaged list is
    refused (DamagedState) rather than half-cleared.
    """
    entries = unsafe_entries(device_id)
    removed = [e for e in entries if setting is None or e["setting"] == setting]
    if not removed:
        return []
    kept = [e for e in entries if e not in removed]
    path = unsafe_path(device_id)
    data = "".join(json.dumps(e, sort_keys=True) + "\n" for e in kept).encode()
    try:
        write_atomic(path, data)
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(path) from None
        raise StateError(f"cannot write the unsafe list {path}: {e.strerror}", "fix its permissions") from None
    return removed


def unsafe_settings(device_id: str) -> dict[int, dict]:
    """setting -> its (latest) unsafe entry."""
    return {e["setting"]: e for e in unsafe_entries(device_id)}


def refuse_unsafe(device_id: str, knob: Knob, value: int) -> None:
    """Raise UsageError when `value` is at or beyond a setting that froze, hung or reset this device in a trial.

    `set` and `apply` call this so a value that crashed the machine is never applied again without the user
    saying so explicitly (--ignore-unsafe); the bisect plan and the boot path never override it.
    """
    check_safety_state(device_id)
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
    try:
        append_durable(unsafe_path(device_id), json.dumps(entry, sort_keys=True))
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(unsafe_path(device_id), "append to") from None
        raise
    return entry


# --- a lone guarded trial (apply --verify) -----------------------------------------------------------------------
def guard_path(device_id: str) -> Path:
    """Kept beside the session journals, so `trial_open_at_previous_boot` (which globs *.json) sees it too."""
    return journal_dir() / f"{_safe_name(device_id)}.guard.json"


def recover_stale_guard(device_id: str, unit: str) -> dict | None:
    """A guard left by an earlier boot means that trial froze or reset the machine: record the setting as unsafe.
    A guard left by a process that died in this boot proves nothing about the voltage (a kill -9, a full disk):
    it is dropped without an unsafe entry. Returns the stale trial, else None. A damaged guard raises
    DamagedState (fail closed)."""
    trial = (load_guard(device_id) or {}).get("open_trial")
    if not isinstance(trial, dict):
        return None
    boot = current_boot_id()
    known = boot is not None and trial.get("boot_id") is not None  # else a reset cannot be ruled out
    same_boot = known and trial.get("boot_id") == boot
    if (same_boot or not known) and pid_alive(trial.get("pid")):
        return None  # another live process is verifying right now
    if not same_boot:
        add_unsafe(device_id, trial["setting"], unit=unit, kind="system-reset",
                   reason=f"a {trial.get('phase', 'verify')} trial never finished (open in an earlier boot)",
                   edge=True)
    guard_path(device_id).unlink(missing_ok=True)
    return trial


@contextlib.contextmanager
def guarded_trial(device_id: str, setting: int, *, unit: str, phase: str = "verify") -> Iterator[dict[str, object]]:
    """Durably mark a trial outside any bisect session as open for its duration.

    If the machine freezes or the tool is killed, the guard stays: the boot path then applies nothing, and the
    next guarded trial on the device records the setting as unsafe. A trial that ends (pass or fail) removes it.
    """
    recover_stale_guard(device_id, unit)
    trial = {"device": device_id, "setting": setting, "phase": phase, "boot_id": current_boot_id(),
             "pid": os.getpid(), "started_at": time.time()}
    try:
        write_atomic(guard_path(device_id), json.dumps({"open_trial": trial}, sort_keys=True).encode())
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(guard_path(device_id)) from None
        raise
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
        """Always the session's file in the state directory, whatever the document says (`load` refuses a
        journal naming another path): we only ever write files we own."""
        return reference_path(self.device_id, self.session)

    def unresolved(self) -> bool:
        return self.state in UNRESOLVED

    # writing
    def _save(self) -> None:
        self.doc["updated_at"] = time.time()
        try:
            write_atomic(journal_path(self.device_id), json.dumps(self.doc, indent=1, sort_keys=True).encode())
        except OSError as e:
            if is_disk_full(e):
                raise disk_full(journal_path(self.device_id)) from None
            raise StateError(f"cannot write the tuning journal {journal_path(self.device_id)}: {e.strerror}",
                             "check XDG_STATE_HOME and free disk space") from None

    def log(self, event: str, **fields: object) -> None:
        line = json.dumps({"time": time.time(), "event": event, "session": self.session, **fields},
                          sort_keys=True, default=str)
        try:
            append_durable(log_path(self.device_id), line)
        except OSError as e:
            if is_disk_full(e):
                raise disk_full(log_path(self.device_id), "append to") from None
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

    def set_field(self, key: str, value: object) -> None:
        self.doc[key] = value
        self._save()

    def close(self, state: str, **fields: object) -> None:
        self.doc["state"] = state
        self.doc["open_trial"] = None
        self.doc.update(fields)
        self._save()
        self.log("session_" + state, **fields)
