"""The machine's one safety state, owned by the root helper (default `/var/lib/tuner`, `--state-dir`).

Keyed by the card's identity (`card_key`: its serial or unique id where the driver has one, its PCI slot
otherwise), so a card moved to another slot keeps its unsafe list, and every user of the machine shares it:

- `unsafe/<key>.jsonl`  settings that froze, hung or reset the machine or lost the card in a trial; append-only
  (only `unsafe_clear` rewrites it). One `schema.UnsafeEntry` a line.
- `trials.json`         the open trial of each card (`schema.OpenTrial`), written before its setting touches the
  card and removed when it ends: a freeze or a kill -9 leaves it.
- `writes.json`         each unconfirmed change the helper made (the value before it), written before the write:
  the next helper start in the same boot puts those values back.
- `recovered.jsonl`     trials whose owner went away (`schema.RecoveredTrial`), for the client's journal: each
  card's newest RECOVERED_SHOWN and the failures recovered in this boot (`add_recovered`).
- `log.jsonl`           every write and who asked (uid, pid, command); `log.jsonl.1` the one before it (MAX_LOG_BYTES).

Every file is validated when read; a torn or mistyped one raises DamagedState (fail closed: nothing is written
to that card) naming the file and the remedy. Files are written atomically (temp, fsync, rename) or appended and
fsynced; the directory is root's, mode 0755: any user may read the machine's unsafe list.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from tuner.core.atomic import append_durable, write_atomic
from tuner.core.errors import DamagedState, StateError, write_errors
from tuner.core.models import DeviceInfo, known_serial, printable
from tuner.helper.schema import MAX_REPLY_BYTES, OpenTrial, RecoveredTrial, UnsafeEntry

RECOVERED_SHOWN = 20  # recovered trials a `read_trials` answers with, newest last
# a card's list is one `unsafe_list` reply (the client reads MAX_REPLY_BYTES at most) and is read whole at every
# set; a real one is a few dozen entries of a few KiB. An import (a member's files: 256 of 1 MiB, at every hello)
# adds nothing to a list this size, leaving the rest in their files; what the helper records itself always goes on
MAX_IMPORTED_LIST_BYTES = MAX_REPLY_BYTES // 8
# the write log (a line per write, each under a few KiB): a member setting and resetting in a loop must not fill the
# disk of the state directory, so it turns over at this size, keeping one older generation (log.jsonl.1)
MAX_LOG_BYTES = 8 * 1024 * 1024


class Write(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """An unconfirmed change: what to put back if the helper dies before it is confirmed or reverted."""

    card: str
    key: str
    previous: int
    previous_lock_mhz: int | None
    value: int
    uid: int
    pid: int
    helper_pid: int
    boot_id: str | None
    since: float
    # what the change found beyond the previous value (Backend.found_state: NVIDIA's per-pstate offsets and lock),
    # so a helper started after a kill puts the card back as found; absent in an older helper's record, and then
    # the previous value goes back as it did
    found: dict[str, Any] | None = None


def card_key(device: DeviceInfo) -> str:
    """The card's identity as a file name: vendor (or simulated kind) and serial, else vendor and PCI slot.

    >>> card_key(DeviceInfo("0000:03:00.0", "amd", "RX", pci_slot="0000:03:00.0", serial="0x1a2b"))
    'amd-serial-0x1a2b'
    >>> card_key(DeviceInfo("0000:03:00.0", "amd", "RX", pci_slot="0000:03:00.0"))
    'amd-slot-0000_03_00.0'
    """
    kind = device.od_format if device.simulated and device.od_format else device.vendor
    ident = f"serial-{device.serial}" if device.serial else f"slot-{device.pci_slot or device.id}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{kind}-{ident}")[:120]


def placeholder_keys(root: Path, device: DeviceInfo) -> list[str]:
    """The keys under which an older helper kept the lists of `device` when it has no serial: its driver printed a
    placeholder ("N/A", all f; tuner.core.models.known_serial) and that text was taken as its serial, so one list
    (`amd-serial-N_A`) was every such card's of its kind."""
    if device.serial:
        return []
    prefix = card_key(replace(device, serial="-"))[:-1]  # "<kind>-serial-"
    try:
        names = sorted(p.name for p in (root / "unsafe").iterdir() if p.name.startswith(prefix))
    except OSError:
        return []
    # a file name spells the serial's "/" as "_" (card_key): "N_A" was "N/A"
    return [key for key in (n.removesuffix(".jsonl") for n in names if n.endswith(".jsonl"))
            if known_serial(key[len(prefix):].replace("_", "/")) is None]


def former_keys(device: DeviceInfo, former_serials: Sequence[str]) -> list[str]:
    """The keys under which an older helper kept the lists of `device`, a card with a serial now: an AMD card's
    serial was amdsmi's text of its unique_id, or without amdsmi its board's FRU `serial_number` (`former_serials`),
    or with none its slot (the AMD backend's `_identify` reads the kernel's `unique_id` first now)."""
    if not device.serial:
        return []
    return [card_key(replace(device, serial=serial)) for serial in (*former_serials, None)]


def older_keys(root: Path, device: DeviceInfo, former_serials: Sequence[str]) -> list[str]:
    """Every key under which an older helper may have kept `device`'s lists (`placeholder_keys`, `former_keys`):
    what the helper merges into the card's own list at start, and what a direct reader of its state counts too."""
    return [*placeholder_keys(root, device), *former_keys(device, former_serials)]


def _damaged(path: Path, problem: str) -> DamagedState:
    return DamagedState(f"{path} is damaged ({problem})",
                        "nothing was written to the card; check the file, note any setting it names (it may have "
                        "crashed the machine), then repair it or move it aside and restart tuner-helper")


class MachineState:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.trials_path = self.root / "trials.json"
        self.writes_path = self.root / "writes.json"
        self.recovered_path = self.root / "recovered.jsonl"
        self.log_path = self.root / "log.jsonl"
        self.older_log_path = self.root / "log.jsonl.1"

    # --- layout -------------------------------------------------------------------------------------------------
    def unsafe_path(self, key: str) -> Path:
        return self.root / "unsafe" / f"{key}.jsonl"

    def create(self) -> None:
        (self.root / "unsafe").mkdir(parents=True, exist_ok=True, mode=0o755)

    # --- low level ----------------------------------------------------------------------------------------------
    def _store(self, path: Path, data: bytes, *, append: bool = False) -> None:
        """Replace the file with `data` atomically, or append `data` to it durably."""
        what = "append to" if append else "write"
        with write_errors(path, what, refused=f"cannot {what} {path}", remedy="check the helper's --state-dir"):
            if append:
                append_durable(path, data.decode())
            else:
                write_atomic(path, data)

    def _read(self, path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateError(f"cannot read {path}: {e.strerror}", "check the helper's --state-dir") from None

    def _lines(self, path: Path, kind: type[msgspec.Struct]) -> list:
        raw = self._read(path)
        out = []
        for n, line in enumerate((raw or b"").split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                out.append(msgspec.json.decode(line, type=kind))
            except msgspec.MsgspecError as e:
                raise _damaged(path, f"line {n}: {e}") from None
        return out

    def _table(self, path: Path, kind: type[msgspec.Struct]) -> dict:
        raw = self._read(path)
        if raw is None:
            return {}
        try:
            return msgspec.json.decode(raw, type=dict[str, kind])  # type: ignore[valid-type]  # built at run time
        except msgspec.MsgspecError as e:
            raise _damaged(path, str(e)) from None

    def _put(self, path: Path, kind: type[msgspec.Struct], key: str, value: msgspec.Struct | None) -> None:
        """Set `key` of the table at `path` to `value`, or remove it (None); a table left empty is deleted."""
        table = self._table(path, kind)
        if value is not None:
            table[key] = value
        elif table.pop(key, None) is None:
            return  # nothing to remove: the file stays as it is
        if table:
            self._store(path, msgspec.json.format(msgspec.json.encode(table), indent=1))
        else:
            path.unlink(missing_ok=True)

    # --- the unsafe list ----------------------------------------------------------------------------------------
    def unsafe_entries(self, key: str) -> list[UnsafeEntry]:
        """The card's list, its words escaped (`printable`, which leaves escaped text as it is): they are escaped as
        they are stored since 1ea447b, but a list an older helper kept holds them as a member sent them, and they
        are shown to every other user (the `unsafe` refusal, `unsafe_list`: `tuner unsafe list` prints its unit)."""
        return [msgspec.structs.replace(e, unit=printable(e.unit), kind=printable(e.kind), reason=printable(e.reason),
                                        kernel_log=[printable(text) for text in e.kernel_log])
                for e in self._lines(self.unsafe_path(key), UnsafeEntry)]

    def add_unsafe(self, key: str, entry: UnsafeEntry) -> None:
        self._store(self.unsafe_path(key), msgspec.json.encode(entry), append=True)

    def merge_unsafe(self, key: str, entries: list[UnsafeEntry], *, max_bytes: int | None = None) -> tuple[int, int]:
        """Add each of `entries` the card's list does not have already (never drops one): how many were added, and
        how many were left because the list holds `max_bytes` (an import: MAX_IMPORTED_LIST_BYTES). The list is
        read once and the new lines appended in one durable write: a user's file may hold thousands of lines, and
        merging them one by one was quadratic, under the lock every request waits for."""
        seen = {h.event() for h in self.unsafe_entries(key)}
        try:
            size = self.unsafe_path(key).stat().st_size
        except FileNotFoundError:
            size = 0
        new: list[bytes] = []
        left = 0
        for entry in entries:
            if entry.event() not in seen:
                line = msgspec.json.encode(entry)
                if max_bytes is not None and size + len(line) + 1 > max_bytes:
                    left += 1
                    continue
                seen.add(entry.event())
                size += len(line) + 1
                new.append(line)
        if new:
            self._store(self.unsafe_path(key), b"\n".join(new), append=True)
        return len(new), left

    def clear_unsafe(self, key: str, setting: int | None) -> list[UnsafeEntry]:
        entries = self.unsafe_entries(key)
        removed = [e for e in entries if setting is None or e.setting == setting]
        if removed:
            kept = [e for e in entries if e not in removed]
            self._store(self.unsafe_path(key), b"".join(msgspec.json.encode(e) + b"\n" for e in kept))
        return removed

    # --- open trials, unconfirmed writes ------------------------------------------------------------------------
    def open_trials(self) -> dict[str, OpenTrial]:
        return self._table(self.trials_path, OpenTrial)

    def set_open_trial(self, key: str, trial: OpenTrial | None) -> None:
        self._put(self.trials_path, OpenTrial, key, trial)

    def writes(self) -> dict[str, Write]:
        return self._table(self.writes_path, Write)

    def set_write(self, key: str, write: Write | None) -> None:
        self._put(self.writes_path, Write, key, write)

    def add_recovered(self, record: RecoveredTrial) -> None:
        """Add `record`, keeping what is ever read: each card's newest RECOVERED_SHOWN (`recovered`) and every
        failure recovered in `record`'s boot (`failed_trial_recovered_in`, the boot check). Appending alone grew the
        file without bound (a member opening trials and going away), and it is read whole at every `read_trials`."""
        try:
            records = [*self._lines(self.recovered_path, RecoveredTrial), record]
        except DamagedState:  # left as it is for its remedy (fail closed where it is read): appended, as ever
            self._store(self.recovered_path, msgspec.json.encode(record), append=True)
            return
        newest: dict[str, int] = {}
        kept = []
        for r in reversed(records):
            newest[r.trial.key] = newest.get(r.trial.key, 0) + 1
            if newest[r.trial.key] <= RECOVERED_SHOWN or (
                    r.verdict == "fail" and r.recovered_boot_id == record.recovered_boot_id):
                kept.append(r)
        self._store(self.recovered_path, b"".join(msgspec.json.encode(r) + b"\n" for r in reversed(kept)))

    def recovered(self, key: str) -> list[RecoveredTrial]:
        return [r for r in self._lines(self.recovered_path, RecoveredTrial) if r.trial.key == key][-RECOVERED_SHOWN:]

    def failed_trial_recovered_in(self, boot_id: str | None) -> RecoveredTrial | None:
        """A trial found open from an earlier boot (a freeze or reset) and recovered in boot `boot_id`, else None:
        the boot path applies no profile after such a boot."""
        for record in reversed(self._lines(self.recovered_path, RecoveredTrial)):
            if record.verdict == "fail" and record.recovered_boot_id == boot_id:
                return record
        return None

    def check(self, key: str) -> None:
        """DamagedState when a safety file this card's writes depend on does not validate."""
        self.unsafe_entries(key)
        self.open_trials()
        self.writes()

    # --- the write log ------------------------------------------------------------------------------------------
    def log(self, event: str, **fields: object) -> None:
        """One line per write with who asked; flushed, not fsynced (the writes journal is the durable record). At
        MAX_LOG_BYTES the log turns over: it becomes log.jsonl.1 (the one before goes) and a new one starts."""
        line = json.dumps({"time": time.time(), "event": event, **fields}, sort_keys=True, default=str) + "\n"
        # the write itself is journaled durably; a full disk must not block putting a card back
        with contextlib.suppress(OSError):
            if self.log_path.stat().st_size + len(line.encode()) > MAX_LOG_BYTES:
                os.replace(self.log_path, self.older_log_path)
        with contextlib.suppress(OSError), open(self.log_path, "a", encoding="utf-8") as f:
            f.write(line)
