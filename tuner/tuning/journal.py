"""The crash-safe tuning journals (one per card, one per rig), the persistent unsafe list and the trial guard.

Layout under `$XDG_STATE_HOME/tuner/`:

- `journal/<device>.json`   a card's session document, rewritten atomically (temp file, fsync, rename). Its
  `open_trial` entry {session, device, setting, phase, boot_id, pid, pid_start_ticks, started_at} is written
  *before* a trial touches the card and cleared after the card is back at stock, so a freeze or a reset leaves it
  set.
- `journal/<device>.log`    an append-only, fsynced event log (one JSON object a line).
- `journal/rig+<dev>+<dev>....rig.json`   a rig's session (`tuner bisect --device all`): which per-card sessions
  belong to it, the data-parallel references recorded at stock, the confirmation attempts, each card's candidate
  and the open rig trial {phase, attempt, settings, boot_id, pid, pid_start_ticks, started_at}, written before any
  card is touched. A card id never holds "+", so no card's journal can have this name. A rig of one card has no
  rig journal: its card's journal is its whole story.
- `unsafe/<device>.jsonl`   settings that froze, hung or reset the machine or lost the GPU mid-trial (never a
  tool death, a full disk or an engine killed from outside: those trials are inconclusive and run again).
  Append-only; a new session (`--restart`) never clears it, only `tuner unsafe clear` (which asks first), and
  nothing applies a value in it automatically. `record_hard_failure` is the one rule that adds to it.

Who left an open trial is decided in one place, `classify_open_trial`, for every caller (a bisect that resumes,
`tuner status`, the boot path, the verify guard). Every file is validated when read: a torn line, a wrong type or
bad bytes in any of them fails closed (`check_safety_state` raises `DamagedState` naming the file and the remedy;
set, apply, boot apply and bisect refuse that card until it is repaired or moved aside). Nothing is skipped
silently. No I/O beyond those files and the boot id; no textual, no torch.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from tuner.core import kernel_files, paths, processes, state_files
from tuner.core.atomic import append_durable, write_atomic
from tuner.core.errors import DamagedState, StateError, UsageError, write_errors
from tuner.core.models import Knob, Verdict, same_serial
from tuner.core.unsafe_rule import blocking_setting
from tuner.helper.schema import MAX_KERNEL_LOG_LINES, MAX_TEXT_CHARS, UnsafeMark
from tuner.helper.state import MachineState, card_key, older_keys
from tuner.tuning import journal_schema
from tuner.tuning.events import TrialResult
from tuner.tuning.journal_schema import ACTIVE, INTERRUPTED
from tuner.tuning.journal_schema import FINISHED as FINISHED  # the session states (job.py reads journal.FINISHED)

if TYPE_CHECKING:
    from tuner.backends.base import Backend

RIG_SUFFIX = ".rig.json"
MAX_STATE_FILE_BYTES = 64 * 1024 * 1024  # far above any journal or unsafe list; a bigger file is not one

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


def rig_path(device_ids: Sequence[str]) -> Path:
    return journal_dir() / f"rig+{'+'.join(_safe_name(d) for d in sorted(device_ids))}{RIG_SUFFIX}"


def rig_reference_path(device_id: str, session: str) -> Path:
    """Where a card's data-parallel reference (recorded at stock in the rig baseline) lives."""
    return journal_dir() / f"{_safe_name(device_id)}.{session}.rig-ref"


def guard_path(device_id: str) -> Path:
    """Kept beside the session journals, so `trial_open_at_previous_boot` (which globs *.json) sees it too."""
    return journal_dir() / f"{_safe_name(device_id)}.guard.json"


def new_session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


# --- who left this open trial -------------------------------------------------------------------------------------
class Owner(StrEnum):
    """Who left an open trial (`classify_open_trial`)."""

    RUNNING = "running"  # a live process other than this one holds it: another tuner is trying it now
    TOOL_DIED = "tool-died"  # this boot, its process is gone (kill -9, a full disk): not evidence about a value
    EARLIER_BOOT = "earlier-boot"  # left by an earlier boot: the machine froze or reset during it
    UNKNOWN_BOOT = "unknown-boot"  # a boot id is unreadable: a reset cannot be ruled out (a live pid proves nothing)

    @property
    def machine_may_have_reset(self) -> bool:
        """Fail closed: an unreadable boot id counts as a reset (the value may have crashed the machine)."""
        return self in (Owner.EARLIER_BOOT, Owner.UNKNOWN_BOOT)


def writer() -> dict[str, object]:
    """Who writes an open trial, as `classify_open_trial` tells it apart from any other process: this boot's id,
    this process's pid and its start time (`pid_start_ticks`, None when /proc cannot say)."""
    pid = os.getpid()
    return {"boot_id": kernel_files.boot_id(), "pid": pid, "pid_start_ticks": kernel_files.process_start_ticks(pid)}


def _same_start(trial: Mapping[str, object], pid: object) -> bool | None:
    """Whether the process now holding `pid` started when the trial's writer did; None when either start time is
    unknown (an older tuner's trial has none; a process whose /proc line cannot be read)."""
    recorded = trial.get("pid_start_ticks")
    if not isinstance(recorded, int) or isinstance(recorded, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    now = kernel_files.process_start_ticks(pid)
    return None if now is None else now == recorded


def classify_open_trial(trial: Mapping[str, object]) -> Owner:
    """The one rule for an open trial (a card's, a rig's or a verify guard's), asked by every caller.

    A process is its boot id, its pid and its start time (`writer`): a pid alone may be a later process's that
    reused the number. Both boot ids known and different: an earlier boot (a live pid there is another process
    reusing the number). Written by this very process (an earlier job of it that ended without closing it): the
    machine has not reset since, so the tool died. Otherwise a boot id unreadable (now or then): a reset cannot be
    ruled out, and a live pid proves nothing (after a reset its number may be anyone's; at boot the low numbers are
    all taken), so fail closed. Both known and equal: a live process that started when the writer did is running
    it; a dead one, or a live one that started at another time (the writer died and its number was reused), died.
    A trial without a start time (an older tuner's), or a process whose start time cannot be read: its pid alone
    decides, as before (a live one is running it: refusing a second bisect is the safe mistake)."""
    ours, theirs, pid = kernel_files.boot_id(), trial.get("boot_id"), trial.get("pid")
    if ours is not None and theirs is not None and theirs != ours:
        return Owner.EARLIER_BOOT
    if pid == os.getpid() and _same_start(trial, pid) is not False:
        return Owner.TOOL_DIED
    if ours is None or theirs is None:
        return Owner.UNKNOWN_BOOT
    return Owner.RUNNING if processes.pid_alive(pid) and _same_start(trial, pid) is not False else Owner.TOOL_DIED


# --- reading ------------------------------------------------------------------------------------------------------
_MOVE_ASIDE = ("check it, then move it aside (the unsafe list is kept separately); a trial it recorded may have "
               "crashed the machine, so note its setting first")


def _damaged(path: Path, problem: str, remedy: str = _MOVE_ASIDE) -> DamagedState:
    return DamagedState(f"{path} is damaged ({problem})", f"nothing was written to the card; {remedy}")


_writing = functools.partial(write_errors, remedy="check XDG_STATE_HOME and free disk space")


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


def _stray_rig_card(doc: dict, path: Path) -> str | None:
    """A rig journal's cards are those its file name says: its 'devices' are those, and its maps of card -> value
    name no other. Else it is another rig's (copied or renamed) or hand-edited, and its trial would be recovered
    on a card the rig holds no knob for."""
    devices = doc["devices"]
    if sorted(map(_safe_name, devices)) != sorted(path.name[:-len(RIG_SUFFIX)].split("+")[1:]):
        return f"'devices' is {devices!r:.80}, not the cards this file is named after"
    trial = doc.get("open_trial") or {}
    maps = {"open trial: 'settings'": trial.get("settings", {}), "'candidates'": doc.get("candidates", {}),
            "'stock'": doc.get("stock", {}), "'sessions'": doc.get("sessions", {})}
    for where, cards in maps.items():
        stray = sorted(set(cards) - set(devices))
        if stray:
            return f"{where} names {stray[0]!r:.80}, not a card of this rig"
    return None


def _load(path: Path) -> dict | None:
    """The document at `path`, validated by its kind (a rig's, a guard, a card's): DamagedState when it is not."""
    doc = _read_json(path)
    if doc is None:
        return None
    if path.name.endswith(RIG_SUFFIX):
        problem = journal_schema.problem(doc, journal_schema.RigJournal) or _stray_rig_card(doc, path)
    elif path.name.endswith(".guard.json"):
        problem = journal_schema.problem(doc, journal_schema.Guard)
    else:
        session = doc.get("session")
        name = reference_path(path.stem, session).name if isinstance(session, str) else None  # stem: already safe
        problem = journal_schema.check_journal(doc, reference_name=name)
        device = doc.get("device")
        if not problem and isinstance(device, str) and _safe_name(device) != path.stem:
            # another card's history (copied or renamed): its passes and its open trial are not this card's
            problem = f"'device' is {device!r:.80}, not the card this file is named after"
    if problem:
        raise _damaged(path, problem)
    return doc


def load(device_id: str) -> dict | None:
    """The device's journal document (validated: DamagedState when it is not), or None when it has none."""
    return _load(journal_path(device_id))


def load_guard(device_id: str) -> dict | None:
    return _load(guard_path(device_id))


def _journal_files(pattern: str) -> list[Path]:
    """The journal directory's entries whose name matches `pattern` (fnmatch, as a glob), sorted (`_listed`)."""
    return _listed(journal_dir(), pattern, "the tuning journals", "a journal in it may hold a trial that crashed the "
                   "machine")


def _listed(directory: Path, pattern: str, what: str, why: str) -> list[Path]:
    """`directory`'s entries whose name matches `pattern` (fnmatch), sorted; none when the directory does not
    exist. DamagedState when it cannot be listed (`why`: what it may hold), so a safety check that cannot list it
    fails closed.

    Listed with os.scandir, not Path.glob: glob answers a directory it cannot list as empty (CPython 3.11/3.12
    pathlib, `_WildcardSelector._select_from`: `except PermissionError: return`), so an `except OSError` around it
    never runs."""
    try:
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries]
    except FileNotFoundError:
        return []
    except OSError as e:
        raise DamagedState(f"cannot list {what} in {directory} ({e.strerror})",
                           f"nothing was written to the card; fix the directory's permissions ({why})") from None
    return sorted(directory / name for name in names if fnmatch.fnmatchcase(name, pattern))


def rig_journal_paths(device_id: str) -> list[Path]:
    """Every rig journal whose rig holds this card (by its file name, which a torn file keeps); DamagedState when
    the journal directory cannot be listed (`_journal_files`)."""
    found = _journal_files(f"rig+*{RIG_SUFFIX}")
    name = _safe_name(device_id)
    return [p for p in found if name in p.name[:-len(RIG_SUFFIX)].split("+")[1:]]


def check_safety_state(device_id: str, backend: Backend | None = None) -> None:
    """Raise DamagedState when any safety file of the device (unsafe list, journal, guard, a rig journal holding
    it) does not validate; through the root helper (`backend`), when the machine's list cannot be read (the
    helper answers a damaged one with DamagedState).

    Every command that writes a setting to a card (set, apply, boot apply, bisect) calls this first: a file we
    cannot trust might be hiding the very value that crashed the machine, so we fail closed.
    """
    unsafe_entries(device_id, backend)
    load(device_id)
    load_guard(device_id)
    for path in rig_journal_paths(device_id):
        _load(path)


def leftover_trial(device_id: str) -> dict | None:
    """A trial (a bisect's, a rig's or a guarded verify) left open on this device by a process that is gone, else
    None: {setting, phase, pid, owner (an Owner), resume (the `--device` to resume it with, None for a verify)}.

    The card may still hold its value (a kill -9 gives no chance to reset): `tuner status` warns with it.
    """
    found = [(load(device_id), device_id), (load_guard(device_id), None)]
    found += [(doc, ",".join(doc["devices"])) for doc in map(_load, rig_journal_paths(device_id)) if doc is not None]
    for doc, resume in found:
        trial = (doc or {}).get("open_trial")
        if not isinstance(trial, dict):
            continue
        setting = trial["settings"].get(device_id) if "settings" in trial else trial.get("setting")
        owner = classify_open_trial(trial)
        if setting is not None and owner != Owner.RUNNING:
            return {"setting": setting, "phase": trial.get("phase"), "pid": trial.get("pid"), "owner": owner,
                    "resume": resume}
    return None


def trial_open_at_previous_boot() -> dict | None:
    """The open trial of any journal (a card's, a rig's, a guard; this user's or the machine's) that a reset may
    have ended, else None.

    Used by the boot path (`tuner apply --boot`) to skip applying after a freeze or reset during a trial. A damaged
    journal counts too (the safe answer).
    """
    return _own_trial_open_at_previous_boot() or machine_trial_open_at_previous_boot()


def machine_trial_open_at_previous_boot() -> dict | None:
    """The same question of the root helper's machine-wide state (`paths.system_state_dir()`, readable by any
    user): a trial it recovered in this boot as a freeze or reset (`MachineState.failed_trial_recovered_in`), or
    one still open from another boot (the helper has not started since). Unreadable or damaged: yes (fail
    closed). No helper state at all: None."""
    state = MachineState(paths.system_state_dir())
    if not state.root.is_dir():
        return None
    boot_id = kernel_files.boot_id()
    try:
        recovered = state.failed_trial_recovered_in(boot_id)
        still_open = [t for t in state.open_trials().values() if not kernel_files.same_boot(t.boot_id, boot_id)]
    except StateError as e:  # DamagedState too
        return {"journal": str(state.root), "reason": f"the machine's trial journal is unreadable ({e.message}), so "
                "a crashed trial cannot be ruled out"}
    trial = recovered.trial if recovered is not None else (still_open[0] if still_open else None)
    if trial is None:
        return None
    return {"journal": str(state.trials_path), "device": trial.card, "setting": trial.setting, "phase": trial.phase,
            "boot_id": trial.boot_id, "uid": trial.uid,
            "reason": "a tuning trial was still open in the root helper's journal when an earlier boot ended"}


def _own_trial_open_at_previous_boot() -> dict | None:
    try:
        files = _journal_files("*.json")
    except DamagedState as e:
        return {"journal": str(journal_dir()), "reason": f"{e.message}, so a crashed trial cannot be ruled out"}
    for path in files:
        try:
            doc = _load(path)
        except DamagedState as e:
            # A damaged journal might have held an open trial: at boot, the safe answer is "yes".
            return {"journal": str(path), "reason": f"a tuning journal is unreadable: {e.message}, so a crashed "
                    "trial cannot be ruled out"}
        except StateError:
            return {"journal": str(path), "reason": "a tuning journal is unreadable, so a crashed trial cannot be "
                    "ruled out"}
        trial = (doc or {}).get("open_trial")
        if isinstance(trial, dict) and classify_open_trial(trial).machine_may_have_reset:
            return dict(trial)
    return None


# --- the unsafe list ----------------------------------------------------------------------------------------------
def unsafe_entries(device_id: str, backend: Backend | None = None) -> list[dict]:
    """Every recorded unsafe setting of the device: this user's own list, then the list `backend` keeps beyond
    it (the root helper's, machine-wide, shared by every user), which an in-process backend (root's boot and resume
    runs) does not keep: then it is read from the helper's state directory (`machine_unsafe_entries`).
    A value on either is unsafe: a list imported into the helper is never forgotten here, and one a user recorded
    in-process as root (a rescue without the helper) counts before the helper has imported it.

    The user's own list is filed by slot; an entry follows its card (`card_serials`: the card's serial or a former
    one, `same_serial`) to another slot, and every entry of the slot still counts for whatever card is in it
    (refusing more is the safe direction). The helper checks its own list (keyed by serial) when it serves it.
    """
    own = own_unsafe_entries(device_id, card_serials(device_id, backend))
    if backend is None:
        return own
    beyond = backend.unsafe_entries(device_id)
    if os.geteuid() != 0:  # a user writes real cards only through the helper, which checks its own list
        return own + beyond
    # in-process as root (at boot and after resume, a rescue as root) the helper's list counts all the same: read
    # from its state directory; through the helper it is the same list, so each entry counts once
    return own + beyond + [e for e in machine_unsafe_entries(device_id, backend) if e not in beyond]


def machine_unsafe_entries(device_id: str, backend: Backend) -> list[dict]:
    """The root helper's list for the card in `device_id` (`paths.system_state_dir()`, readable by any user; keyed
    as the helper keys it, with the keys an older helper used), read directly; none when there is no helper state.
    Damaged or unreadable: DamagedState (fail closed)."""
    state = MachineState(paths.system_state_dir())
    if not state.root.is_dir():
        return []
    device = backend.device(device_id)
    keys = [card_key(device), *older_keys(state.root, device, backend.former_serials(device_id))]
    try:
        return [msgspec.structs.asdict(e) for key in dict.fromkeys(keys) for e in state.unsafe_entries(key)]
    except DamagedState:
        raise
    except StateError as e:  # unreadable: it may hold the value that crashed the machine
        raise DamagedState(e.message, "nothing was written to the card; check the root helper's state directory "
                           f"({state.root})") from None


def card_serials(device_id: str, backend: Backend | None) -> tuple[str, ...]:
    """The serials the card in `device_id` is known by (now, and the former ones an older version read); none
    without a backend or when the driver gives none."""
    if backend is None:
        return ()
    serial = backend.device(device_id).serial
    return () if serial is None else (serial, *backend.former_serials(device_id))


def own_unsafe_entries(device_id: str, serials: Sequence[str] = ()) -> list[dict]:
    """Every recorded unsafe setting in this user's own list, oldest first: the slot's file, then the entries of
    other slots' files recorded on a card with one of `serials` (a card moved since; `same_serial`).

    Fails closed: a torn line (a crash mid-append), a wrong type (`"setting": "-40"`, `-40.0`) or bytes that are
    not UTF-8 raise DamagedState naming the file and line; skipping the line would forget a value that crashed
    the machine. Blank lines are allowed. With `serials`, a damaged file of another slot fails closed too (it
    may hold this card's entries), as does a list directory that cannot be listed.
    """
    path = unsafe_path(device_id)
    entries = _unsafe_file_entries(path)
    if not serials:
        return entries
    for other in _unsafe_files():
        if other != path:
            entries += [e for e in _unsafe_file_entries(other)
                        if any(same_serial(e.get("serial"), s) for s in serials)]
    return entries


def _unsafe_files() -> list[Path]:
    """Every slot's unsafe list, sorted (`_listed`)."""
    return _listed(paths.state_dir() / "unsafe", "*.jsonl", "the unsafe lists", "a list in it may hold a value "
                   "that crashed this card in another slot")


def _unsafe_file_entries(path: Path) -> list[dict]:
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
        problem = journal_schema.problem(entry, journal_schema.UnsafeEntry)
        if problem:
            raise _damaged(path, f"line {n}: {problem}", remedy(n))
        entries.append(entry)
    return entries


def clear_unsafe(device_id: str, setting: int | None = None, backend: Backend | None = None) -> list[dict]:
    """Remove the device's unsafe entries (all, or those for `setting`) from this user's own list and from the
    list `backend` keeps (the root helper's machine-wide one); returns what was removed from both. The entries
    that followed the card from another slot (`unsafe_entries`) are removed from that slot's file: what `tuner
    unsafe list` shows for the card is what clear removes.

    Only `tuner unsafe clear` calls this, after asking. Each list is rewritten atomically; a damaged list is
    refused (DamagedState) rather than half-cleared.
    """
    serials = card_serials(device_id, backend)
    own = unsafe_path(device_id)
    files = [own, *([p for p in _unsafe_files() if p != own] if serials else [])]
    read = {path: _unsafe_file_entries(path) for path in files}  # every file validates before any is rewritten
    rewrites = []
    for path, entries in read.items():
        removed = [e for e in entries if (setting is None or e["setting"] == setting)
                   and (path == own or any(same_serial(e.get("serial"), s) for s in serials))]
        if removed:
            rewrites.append((path, removed, [e for e in entries if e not in removed]))
    machine = [] if backend is None else backend.unsafe_clear(device_id, setting)
    for path, _, kept in rewrites:
        data = "".join(json.dumps(e, sort_keys=True) + "\n" for e in kept).encode()
        with _writing(path, refused=f"cannot write the unsafe list {path}", remedy="fix its permissions"):
            write_atomic(path, data)
    return [e for _, removed, _ in rewrites for e in removed] + machine


def unsafe_settings(device_id: str, backend: Backend | None = None, unit: str | None = None) -> dict[int, dict]:
    """setting -> its (latest) unsafe entry, from this user's list and the machine's (`unsafe_entries`); with
    `unit`, only the entries in that unit (or in none recorded). Filtered before they are keyed: a later entry at
    the same number in another unit (another kind of card swapped into the slot) must not hide this one."""
    return {e["setting"]: e for e in unsafe_entries(device_id, backend)
            if unit is None or e.get("unit") in (None, unit)}


def refuse_unsafe(device_id: str, knob: Knob, value: int, backend: Backend | None = None) -> None:
    """Raise UsageError when `value` is at or beyond a setting that froze, hung or reset this device in a trial
    (the rule: tuner.core.unsafe_rule.blocking_setting, the one the root helper applies before every write).

    `set` and `apply` call this so a value that crashed the machine is never applied again without the user
    saying so explicitly (--ignore-unsafe); the bisect plan and the boot path never override it. The root helper's
    machine-wide list counts too (through the helper, and in-process: `machine_unsafe_entries`), and the helper
    refuses on its own regardless.
    """
    check_safety_state(device_id, backend)
    entries = unsafe_settings(device_id, backend, unit=knob.unit)
    worst = blocking_setting(knob, value, entries)
    if worst is None:
        return
    raise UsageError(
        f"{value:+d} {knob.unit} is at or beyond {worst:+d} {knob.unit}, which failed hard on {device_id} "
        f"({entries[worst].get('kind', 'failure')}: {entries[worst].get('reason', 'no reason recorded')})",
        "choose a less aggressive value, or pass --ignore-unsafe if you are sure",
    )


def add_unsafe(device_id: str, setting: int, *, unit: str, kind: str, reason: str, edge: bool,
               session: str | None = None, serial: str | None = None, kernel_log: list[str] | None = None) -> dict:
    # built as the type its reader holds it to: a misspelt or missing key fails here, not when the list is read
    entry = msgspec.structs.asdict(journal_schema.UnsafeEntry(
        setting=setting, kind=kind, unit=unit, device=device_id, serial=serial, session=session,
        boot_id=kernel_files.boot_id(), reason=reason, edge=edge, recorded_at=time.time(),
        kernel_log=list(kernel_log or [])[-MAX_KERNEL_LOG_LINES:]))
    with _writing(unsafe_path(device_id), "append to"):
        append_durable(unsafe_path(device_id), json.dumps(entry, sort_keys=True))
    return entry


def record_hard_failure(device_id: str, result: TrialResult, *, stock: int, session: str | None = None,
                        serial: str | None = None, backend: Backend | None = None) -> bool:
    """The one rule for the unsafe list, for a card's search, a rig's confirmation and a verify alike: a failure
    that hung, reset or lost the card (an edge) at a setting other than stock goes on the card's list for good.
    Nothing else does: a mismatch says "not this value", a tool that died or an engine killed from outside says
    nothing about it. True when it was recorded.

    It goes on this user's list and, through `backend`, on the machine's: the root helper takes it as the end of
    the card's open trial (`trial_end` with an `UnsafeMark`: the helper records the setting of the trial it holds
    open, not one the client names), so call this before the journal closes the trial."""
    if result.verdict != Verdict.FAIL or not result.edge or result.setting == stock:
        return False
    kind = result.kind or "hang"
    add_unsafe(device_id, result.setting, unit=result.unit, kind=kind, reason=result.reason,
               edge=True, session=session, serial=serial, kernel_log=list(result.kernel_log))
    if backend is not None:
        backend.trial_end(device_id, unsafe=unsafe_mark(kind, result.reason, list(result.kernel_log)))
    return True


def unsafe_mark(kind: str, reason: str, kernel_log: Sequence[str] = ()) -> UnsafeMark:
    """A hard failure as the root helper's request carries it (its limits: a word, 500 characters a line)."""
    word = re.sub(r"[^a-z0-9_-]", "-", kind.lower())[:40]
    return UnsafeMark(kind=word if word[:1].isalpha() else "hang", reason=reason[:MAX_TEXT_CHARS],
                      kernel_log=[line[:MAX_TEXT_CHARS] for line in list(kernel_log)[-MAX_KERNEL_LOG_LINES:]])


# --- a lone guarded trial (apply --verify) -----------------------------------------------------------------------
def recover_stale_guard(device_id: str, unit: str, stock: int) -> dict | None:
    """A guard left by an earlier boot means that trial froze or reset the machine: record the setting as unsafe
    (the one rule, `record_hard_failure`: never stock). A guard left by a process that died in this boot proves
    nothing about the voltage (a kill -9, a full disk): it is dropped without an unsafe entry. Returns the stale
    trial, else None. A damaged guard raises DamagedState (fail closed)."""
    trial = (load_guard(device_id) or {}).get("open_trial")
    if not isinstance(trial, dict):
        return None
    owner = classify_open_trial(trial)
    if owner == Owner.RUNNING:
        return None  # another live process is verifying right now
    if owner.machine_may_have_reset:
        phase = trial.get("phase", "verify")
        # in the unit and under the serial of the card it ran on (the guard's; a guard of an older tuner has
        # neither): a card of another kind swapped into the slot since must not turn -40 mV into -40 MHz
        record_hard_failure(device_id, TrialResult(
            setting=trial["setting"], unit=trial.get("unit") or unit, phase=phase, verdict=Verdict.FAIL,
            kind="system-reset", edge=True, reason=f"a {phase} trial never finished (open in an earlier boot)"),
            stock=stock, serial=trial.get("serial"))
    guard_path(device_id).unlink(missing_ok=True)
    return trial


@contextlib.contextmanager
def guarded_trial(device_id: str, setting: int, *, unit: str, backend: Backend) -> Iterator[dict[str, object]]:
    """Durably mark a trial outside any bisect session as open for its duration.

    If the machine freezes or the tool is killed, the guard stays: the boot path then applies nothing, and the
    next guarded trial on the device records the setting as unsafe. A trial that ends (pass or fail) removes it.
    Through the root helper (`backend`) the helper holds the trial open too (`trial_begin`/`trial_end`), so its
    machine-wide journal says the same to every user; a hard failure inside ends it with its mark
    (`record_hard_failure`).
    """
    recover_stale_guard(device_id, unit, backend.knob(device_id).stock)
    backend.trial_begin(device_id, setting, "verify")
    trial = {"device": device_id, "setting": setting, "unit": unit, "serial": backend.device(device_id).serial,
             "phase": "verify", **writer(), "started_at": time.time()}
    try:
        with _writing(guard_path(device_id)):
            write_atomic(guard_path(device_id), json.dumps({"open_trial": trial}, sort_keys=True).encode())
        try:
            yield trial
        finally:
            guard_path(device_id).unlink(missing_ok=True)
    finally:
        backend.trial_end(device_id)


# --- the session journal: a card's or a rig's -----------------------------------------------------------------------
class Journal:
    """One session document: a card's (`journal/<card>.json`, with its event log) or a rig's (`rig_path`). Every
    change is durable (an atomic rewrite; the log fsynced) before the call returns."""

    def __init__(self, path: Path, doc: dict, *, backend: Backend, device_id: str | None = None):
        self.path, self.doc = path, doc
        self.device_id = device_id  # None: a rig's journal (no event log, no trials of its own)
        # where the machine's safety state is told of each trial (Backend.trial_begin/trial_end: the root helper's
        # machine-wide journal; in-process, this file is the whole record)
        self.backend = backend

    @classmethod
    def create(cls, device_id: str, *, params: dict, knob: dict, serial: str | None = None,
               backend: Backend) -> Journal:
        session = new_session_id()
        journal = cls(journal_path(device_id), cls._new(
            session, device=device_id, serial=serial, params=params, knob=knob,
            reference=str(reference_path(device_id, session)), trials=[]), device_id=device_id, backend=backend)
        journal._save()
        journal.log("session_started", session=session, params=params)
        return journal

    @classmethod
    def create_rig(cls, device_ids: Sequence[str], *, params: dict, stock: dict[str, int],
                   backend: Backend, never: Sequence[dict] = (),
                   serials: dict[str, str | None] | None = None) -> Journal:
        """A new rig session; `never`: the combinations earlier sessions of these cards saw reset the machine;
        `serials`: each card's (the journal is keyed by slots: a resume must see a card swapped in)."""
        journal = cls(rig_path(device_ids), cls._new(
            new_session_id(), devices=sorted(device_ids), phase="search", params=params, stock=stock, sessions={},
            serials=dict(serials or {}),
            candidates={}, references={}, baseline=None, attempts=[], never=list(never)), backend=backend)
        journal._save()
        return journal

    @staticmethod
    def _new(session: str, **fields: object) -> dict:
        return {"version": journal_schema.VERSION, "session": session, "state": ACTIVE, "pid": os.getpid(),
                "boot_id": kernel_files.boot_id(), "created_at": time.time(), "updated_at": time.time(),
                "open_trial": None, **fields}

    @classmethod
    def open_existing(cls, device_id: str, backend: Backend) -> Journal | None:
        doc = load(device_id)
        return None if doc is None else cls(journal_path(device_id), doc, device_id=device_id, backend=backend)

    @classmethod
    def open_rig(cls, device_ids: Sequence[str], backend: Backend) -> Journal | None:
        path = rig_path(device_ids)
        doc = _load(path)
        return None if doc is None else cls(path, doc, backend=backend)

    # reading
    @property
    def session(self) -> str:
        return self.doc["session"]

    @property
    def state(self) -> str:
        return self.doc.get("state", ACTIVE)

    @property
    def serial(self) -> str | None:
        """The serial of the card a card's session ran on (None: unknown; a rig's are per card, 'serials')."""
        return self.doc.get("serial")

    @property
    def unit(self) -> str | None:
        """The unit of the knob the session ran with (None: an older journal recorded no knob). The journal is keyed
        by slot: a card of another kind swapped in since has another unit."""
        unit = (self.doc.get("knob") or {}).get("unit")
        return unit if isinstance(unit, str) else None

    @property
    def open_trial(self) -> dict | None:
        return self.doc.get("open_trial")

    def unresolved(self) -> bool:
        return self.state in UNRESOLVED

    @property
    def trials(self) -> list[dict]:
        return self.doc.setdefault("trials", [])

    @property
    def reference(self) -> Path:
        """Always the session's file in the state directory, whatever the document says (`load` refuses a
        journal naming another path): we only ever write files we own."""
        assert self.device_id is not None, "a rig's references are per card (rig_reference_path)"
        return reference_path(self.device_id, self.session)

    @property
    def phase(self) -> str:
        return self.doc["phase"]

    @property
    def attempts(self) -> list[dict]:
        return self.doc.setdefault("attempts", [])

    def never(self, settings: dict[str, int]) -> bool:
        """A rig's combination that was open when the machine reset: never applied again."""
        return any(dict(c) == settings for c in self.doc.get("never", []))

    # writing
    def _save(self) -> None:
        self.doc["updated_at"] = time.time()
        with _writing(self.path, refused=f"cannot write the tuning journal {self.path}"):
            write_atomic(self.path, json.dumps(self.doc, indent=1, sort_keys=True, default=str).encode())

    def log(self, event: str, **fields: object) -> None:
        """A line of the card's event log (a rig's journal has none)."""
        if self.device_id is None:
            return
        path = log_path(self.device_id)
        line = json.dumps({"time": time.time(), "event": event, "session": self.session, **fields},
                          sort_keys=True, default=str)
        with _writing(path, "append to", refused=f"cannot append to {path}"):
            append_durable(path, line)

    def update(self, **fields: object) -> None:
        self.doc.update(fields)
        self._save()

    def claim(self) -> None:
        """This process now runs the session (on resume)."""
        self.update(state=ACTIVE, pid=os.getpid(), boot_id=kernel_files.boot_id())
        self.log("session_resumed", pid=os.getpid())

    def _trial_settings(self, trial: Mapping[str, Any] | None) -> dict[str, int]:
        """card -> setting of a trial (a card's `setting`, a rig's `settings`: both whole numbers, as begin_trial
        writes them and `load` holds them to)."""
        if not trial:
            return {}
        return {self.device_id: trial["setting"]} if self.device_id is not None else dict(trial["settings"])

    def begin_trial(self, phase: str, **what: object) -> dict:
        """Durably record the trial about to touch the card(s): a card's `setting`, a rig's `attempt` and
        `settings`. Call before applying anything. The machine's state (`backend.trial_begin`, the root helper's
        journal) hears of it first: a card another user holds is refused before anything is written here."""
        mine = {} if self.device_id is None else {"session": self.session, "device": self.device_id}
        trial = {**mine, "phase": phase, **what, **writer(), "started_at": time.time()}
        begun: list[str] = []
        try:
            for device_id, setting in self._trial_settings(trial).items():
                self.backend.trial_begin(device_id, setting, phase, self.session)
                begun.append(device_id)
            self.update(open_trial=trial, state=ACTIVE)
        except BaseException:
            for device_id in begun:
                with contextlib.suppress(Exception):
                    self.backend.trial_end(device_id)
            raise
        self.log("trial_open", **trial)
        return trial

    def end_trial(self, **fields: object) -> None:
        """Every card is back at stock: close the open trial (with what it found, one atomic write). The machine's
        open trial ends with ours (a hard failure already ended it with its mark)."""
        trial = self.open_trial
        self.update(open_trial=None, **fields)
        for device_id in self._trial_settings(trial):
            self.backend.trial_end(device_id)

    def finish_trial(self, record: dict) -> None:
        """A card's trial is over and the card at stock: store its result and close it (one atomic write)."""
        self.trials.append(record)
        self.end_trial()
        self.log("trial_closed", setting=record.get("setting"), phase=record.get("phase"),
                 verdict=record.get("verdict"), kind=record.get("kind"))

    def abandon_trial(self, reason: str) -> None:
        """The trial was stopped on purpose and the card reset: no result, rerun it on resume."""
        trial = self.open_trial
        self.end_trial()
        self.log("trial_abandoned", reason=reason, setting=(trial or {}).get("setting"))

    def close(self, state: str, **fields: object) -> None:
        self.end_trial(state=state, **fields)
        self.log("session_" + state, **fields)
