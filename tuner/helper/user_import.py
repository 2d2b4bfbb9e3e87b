"""A user's own safety state, read so the helper can merge it into the machine's (never dropping an entry).

Before the helper, each user's tuner kept its unsafe list and journal under `~/.local/state/tuner`. The helper
imports, for each account that connects (and for root and the sudo user at its start): every unsafe-list line,
and every trial that a journal (or a verify guard) left open in an earlier boot, which means the machine froze
or reset during it. Read as root from a directory the user owns, so nothing is trusted: below the home
directory every component is opened without following links; only regular files owned by the user (or root)
and under `MAX_FILE_BYTES` are read, `MAX_IMPORTED_BYTES` of unsafe lines in all; each line is validated, what
it says of the card with the wire's own types (a card id, a session, a phase word, a knob's unit: they reach every
other user's terminal). A line that does not validate is reported and not imported (the user's own tuner refuses
that file until it is repaired, so it is not forgotten).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from tuner.helper.schema import BootId, Card, Serial, Session, Setting, Unit, Word

USER_STATE = (".local", "state", "tuner")  # the default $XDG_STATE_HOME/tuner: the helper cannot see a user's env
MAX_FILE_BYTES = 1 << 20
MAX_FILES = 256  # per directory: one per card and session is a handful; more is not a tuner's state
# a member's unsafe lines one import reads, all files together: each valid line is held until the merge, and a line
# of 14 bytes is a Python object of ~180, so MAX_FILES files of MAX_FILE_BYTES were over 3 GiB of root's memory at
# every hello; a real list is a few KiB (and the machine list takes MAX_IMPORTED_LIST_BYTES of imports at most)
MAX_IMPORTED_BYTES = MAX_FILE_BYTES
# problems kept to be said one by one; the rest are counted: the user writes them (a 1 MiB file of bad lines is
# 500,000), and root's memory and log (journald drops a flooding unit's lines, the helper's own among them) are not
# theirs to fill
MAX_PROBLEMS_KEPT = 10


class UserUnsafeLine(msgspec.Struct, frozen=True):
    """A per-user unsafe-list line (tuner/tuning/journal.py `add_unsafe`); fields it does not know are ignored."""

    setting: Setting  # as an unsafe_clear request names it
    unit: Unit = "mV"
    kind: str = "failure"
    reason: str = ""
    edge: bool = True
    device: Card | None = None
    serial: Serial | None = None
    session: Session | None = None
    boot_id: BootId | None = None
    recorded_at: float = 0.0
    kernel_log: list[str] = []


class UserOpenTrial(msgspec.Struct, frozen=True):
    """A per-user journal's or guard's `open_trial`, with the serial and unit of the card it ran on (a guard's own;
    a journal's session's, filled in by `_read_journal`; None in an older tuner's files)."""

    setting: Setting
    phase: Word = "trial"
    boot_id: BootId | None = None
    session: Session | None = None
    device: Card | None = None
    started_at: float | None = None
    serial: Serial | None = None
    unit: Unit | None = None


class _UserKnob(msgspec.Struct):
    unit: Unit | None = None


class _UserDoc(msgspec.Struct):
    open_trial: UserOpenTrial | None = None
    device: Card | None = None
    serial: Serial | None = None  # the card the session ran on (the slot may hold another card since)
    knob: _UserKnob | None = None  # its unit, likewise


@dataclass
class UserState:
    unsafe: list[UserUnsafeLine] = field(default_factory=list)
    open_trials: list[tuple[str, UserOpenTrial]] = field(default_factory=list)  # (file stem, trial)
    problems: list[str] = field(default_factory=list)  # the first MAX_PROBLEMS_KEPT
    more_problems: int = 0  # how many more there were

    def skip(self, problem: str) -> None:
        """A file or line not imported, and why."""
        if len(self.problems) < MAX_PROBLEMS_KEPT:
            self.problems.append(problem)
        else:
            self.more_problems += 1


def _open_dir(name: str, dir_fd: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _read_file(name: str, dir_fd: int, uid: int, where: str, found: UserState) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as e:
        found.skip(f"{where}/{name}: {e.strerror}")
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (uid, 0) or st.st_size > MAX_FILE_BYTES:
            found.skip(f"{where}/{name}: not a regular file of uid {uid} under {MAX_FILE_BYTES} bytes")
            return None
        return f.read(MAX_FILE_BYTES + 1)


def read_user_state(home: Path, uid: int) -> UserState:
    """What `uid`'s `~/.local/state/tuner` holds (empty when there is none)."""
    found = UserState()
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for part in USER_STATE:
                fds.append(_open_dir(part, fds[-1]))
        except OSError as e:
            if e.errno != errno.ENOENT:  # a link, a file, unreadable: every list below it is skipped, so said
                found.skip(f"{Path(home, *USER_STATE[:len(fds)])}: {e.strerror}")
            return found  # no per-user state: nothing to import
        base = fds[-1]
        where = str(Path(home, *USER_STATE))
        for sub, suffix, read in (("unsafe", ".jsonl", _read_unsafe), ("journal", ".json", _read_journal)):
            try:
                fd = _open_dir(sub, base)
            except OSError as e:
                if e.errno != errno.ENOENT:  # a link, a file, unreadable: every entry in it is skipped, so said
                    found.skip(f"{where}/{sub}: {e.strerror}")
                continue
            try:
                with os.scandir(fd) as entries:  # lazily, to the cap: a directory of millions is not listed by root
                    names = sorted(entry.name for entry in itertools.islice(entries, MAX_FILES + 1))
                if len(names) > MAX_FILES:
                    found.skip(f"{where}/{sub}: over {MAX_FILES} files, only {MAX_FILES} read")
                left_bytes = MAX_IMPORTED_BYTES
                for name in names[:MAX_FILES]:
                    if name.endswith(suffix) and not name.startswith(".") and not name.endswith(".rig.json"):
                        data = _read_file(name, fd, uid, f"{where}/{sub}", found)
                        if data is not None and read is _read_unsafe:
                            if len(data) > left_bytes:
                                found.skip(f"{where}/{sub}: only the first {MAX_IMPORTED_BYTES} bytes of unsafe "
                                           f"lines read, from {name} on not (their own tuner still refuses them)")
                                break
                            left_bytes -= len(data)
                        if data is not None:
                            read(name, data, found, f"{where}/{sub}/{name}")
            finally:
                os.close(fd)
    finally:
        for fd in reversed(fds):
            os.close(fd)
    return found


def _read_unsafe(name: str, data: bytes, found: UserState, where: str) -> None:
    for n, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            try:
                found.unsafe.append(msgspec.json.decode(line, type=UserUnsafeLine))
            except msgspec.MsgspecError as e:
                found.skip(f"{where} line {n}: {e}")


def _read_journal(name: str, data: bytes, found: UserState, where: str) -> None:
    try:
        doc = msgspec.json.decode(data, type=_UserDoc)
    except msgspec.MsgspecError as e:
        found.skip(f"{where}: {e}")
        return
    if doc.open_trial is not None:
        stem = name.removesuffix(".json").removesuffix(".guard")
        trial = msgspec.structs.replace(doc.open_trial, serial=doc.open_trial.serial or doc.serial,
                                        unit=doc.open_trial.unit or (doc.knob.unit if doc.knob else None))
        device = trial.device or doc.device or stem
        try:  # a file's name is the user's too: held to a card id as a field is
            found.open_trials.append((msgspec.convert(device, Card), trial))
        except msgspec.ValidationError as e:
            found.skip(f"{where}: its name is no card id: {e}")
