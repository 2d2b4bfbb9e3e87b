"""`tuner apply --boot`: apply the system profiles, single-card and rig, to the cards they were proven on.

Nobody is there to confirm at boot, so only the proven card gets a part (the same card by serial, or by slot
when no serial is known; never `--force`, never `--ignore-unsafe`), and each card is applied on its own: one that
cannot be applied does not keep the others at stock. The rules that skip a whole boot (tuner.reset, a trial left
open by the previous boot) live in tuner.profiles.boot.

Exit status, so `systemctl status tuner-apply` tells the truth:
- a single-card profile whose card is not here is a skip by design (a profile for another machine): exit 0;
- a card that is here (its serial) but no longer fits its profile (a kernel or driver update changed its
  overdrive format or knob) is not applied, with the identity rule's reason: exit 4 (UNSUPPORTED);
- a rig profile's card that is missing or replaced is not: the rig was proven and confirmed with that card, so
  the run exits non-zero (HARDWARE, as a card that was lost) after the other cards got their parts. Those parts
  still apply because each was proven on its own card and confirmed under a heavier load (every card at once);
  leaving them at stock would lose what is known to be safe, and saying nothing would hide a missing card.

NVIDIA (issue 23): each part is applied as it was proven, its lock clock and its offset (the log line names both),
and with persistence mode on: where the driver reports it off, the run turns it on for the cards it applies to
and reads it back (Backend.enable_persistence: in-process, or through the root helper's `persistence` request,
which only root may make); where that is refused, the card is not applied (the offset would vanish when this
one-shot job exits) and the line names the persistence daemon as the remedy.

`--resume` (the unit ordered after the sleep targets) re-applies the same way after each resume and says, per
card, what it found: still as installed, back at stock, or at another value (set by something else, or the
driver restoring an older one), which it puts back to the installed value. A card another tool may change (LACT,
CoreCtrl, nvidia-powerd: tuner.actions.other_tools) is left as it is, at boot and after resume, exit 6: the two
would fight over it. The wait for a late driver or a missing card is bounded (`--boot-wait`) and logged.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.actions import other_tools
from tuner.actions.profile_apply import find_part_card, proven_card
from tuner.actions.setting import SetRequest, apply_setting_now, can_lock_clock
from tuner.backends.base import Backend
from tuner.core import exit_codes, kernel_files, paths, state_files
from tuner.core.atomic import write_atomic
from tuner.core.errors import TunerError, Unsupported
from tuner.core.models import DeviceInfo
from tuner.profiles import Profile, load_profile
from tuner.profiles import boot as boot_rules
from tuner.profiles.identity import fingerprint, match_device
from tuner.profiles.schema import ProfilePart
from tuner.profiles.store import scan


@dataclass(frozen=True)
class BootCardResult:
    """What the boot run did with one part: applied, skipped (not this machine's card), missing or error."""

    profile: str
    status: str  # "applied" | "skipped" | "missing" | "error" | "busy" (another tool may change the card)
    exit_code: int = exit_codes.OK
    card: int | None = None  # the part's index in a rig profile (None: a single-card profile)
    device: str | None = None
    value: int | None = None  # read back after applying
    reason: str | None = None
    lock_clock_mhz: int | None = None  # NVIDIA: the max graphics clock locked with the offset
    found: int | None = None  # the card's value before this run wrote it

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class BootReport:
    skipped: str | None  # why nothing was applied this boot (tuner.reset, an open trial), else None
    results: tuple[BootCardResult, ...]
    exit_code: int
    lines: tuple[str, ...]  # every line logged, for `tuner service status` and the UI
    mode: str = "boot"  # "boot" | "resume"
    waited_s: float | None = None  # how long discovery waited for a late driver or a missing card

    def to_dict(self) -> dict:
        return {"skipped": self.skipped, "exit_code": self.exit_code, "results": [r.to_dict() for r in self.results],
                "lines": list(self.lines), "mode": self.mode, "waited_s": self.waited_s,
                "boot_id": kernel_files.boot_id()}


LAST_RUN_MAX_BYTES = 1 << 20  # a run's lines for every card of every profile; far more is not a record we wrote


def last_run_path(simulated: bool = False, state_dir: Path | None = None) -> Path:
    """The last boot run's record, in `state_dir` (default this process's; the boot unit's is the one it pins); a
    simulated run (`--simulate apply --boot`) keeps its own, so trying the boot run on simulated cards never
    replaces the machine's record, and its status says SIMULATED."""
    return (state_dir or paths.state_dir()) / "boot" / ("last-run-simulated.json" if simulated else "last-run.json")


def run_boot_apply(open_backend: Callable[[], Backend], *, profile: str | None = None,
                   wait_s: float = boot_rules.DEFAULT_DISCOVERY_WAIT_S,
                   log: Callable[[str], None] = boot_rules.log, resume: bool = False,
                   simulated: bool = False) -> BootReport:
    """Apply `profile` (a name or path), else every system profile, at boot (or after a resume). Records the run
    (last_run_path; `simulated`: the simulated cards' own record)."""
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        log(line)

    mode = "resume" if resume else "boot"
    opened: list[Backend] = []

    def opening() -> Backend:  # a simulated backend's run is recorded as one, whoever asked for it
        backend = open_backend()
        opened.append(backend)
        return backend

    try:
        report = _run(opening, profile, wait_s, say, lines, mode)
    except TunerError as e:  # no backend, a bad profile named on the command line: the record says so too
        _record(BootReport(None, (), e.exit_code, (*lines, f"error: {e.one_line()}"), mode),
                simulated or any(b.simulated for b in opened))
        raise
    _record(report, simulated or any(b.simulated for b in opened))
    return report


def _run(open_backend: Callable[[], Backend], profile_name: str | None, wait_s: float,
         say: Callable[[str], None], lines: list[str], mode: str) -> BootReport:
    # an edited unit (or one an older tuner wrote) may name such a folder: refused here too, before it is read
    boot_rules.refuse_user_writable_system_paths(f"apply at {mode}", "nothing applied")
    reason = boot_rules.skip_reason()
    if reason:
        say(f"skipped: {reason}")
        return BootReport(reason, (), exit_codes.OK, tuple(lines), mode)
    if profile_name is not None:
        profiles = [load_profile(profile_name, system=True)]  # never the installer's user store
    else:
        profiles, bad = scan(system=True)
        for path, why in bad:
            say(f"ignoring {path}: {why}")
        if not profiles:
            say("no profiles in the system store; nothing to apply")
            return BootReport(None, (), exit_codes.OK, tuple(lines), mode)

    def ready(backend: Backend) -> bool:  # every part's own card is up (the driver may still be probing)
        devices = backend.devices()
        try:
            return all(proven_card(part, devices, backend) is not None for p in profiles for part in p.parts)
        except TunerError:  # a card whose setting cannot be read (yet): waited for, then that card's error
            return False

    started = time.monotonic()
    backend = boot_rules.discover(open_backend, ready, wait_s=wait_s)
    if backend is None:  # discover re-raises the open error itself; this only keeps the type honest
        raise Unsupported("no GPU backend could be opened at boot", "see `tuner doctor`")
    waited = round(time.monotonic() - started, 1)
    if not ready(backend):
        say(f"waited {waited:g} s (at most {wait_s:g}, --boot-wait) for every profile's card; applying to the "
            "cards that are here")
    # at boot a tool's unit that is enabled counts too: it starts later in this boot and would write over the card
    found = other_tools.detect_for(backend.devices(), at_boot=mode == "boot")
    results = [r for p in profiles for r in _apply_profile(p, backend, say, found)]
    worst = next((r.exit_code for r in results if r.exit_code), exit_codes.OK)
    return BootReport(None, tuple(results), worst, tuple(lines), mode, waited)


def _apply_profile(profile: Profile, backend: Backend, say: Callable[[str], None],
                   found: list[other_tools.Found]) -> list[BootCardResult]:
    """Each part to its own card. A single-card profile whose card is not here is skipped; a rig's missing or
    replaced card is logged and fails the run, the rig's other cards still apply."""
    devices = backend.devices()
    out = []
    for index, part in enumerate(profile.parts):
        card = index if profile.is_rig else None
        try:
            device = proven_card(part, devices, backend)  # reads the card's knob to compare it with the part's
        except TunerError as e:  # that card's error: the other cards still get their parts
            where, _how = find_part_card(part, devices)
            what = f"{profile.name!r}" + (f" card[{card}]" if card is not None else "")
            say(f"could not apply {what} to {where.id if where else '?'}: {e.one_line()}")
            out.append(BootCardResult(profile.name, "error", e.exit_code, card, where.id if where else None,
                                      reason=e.one_line()))
            continue
        here, how = find_part_card(part, devices)
        if device is not None:
            out.append(_apply_part(backend, profile, part, device, say, card, found))
        elif here is not None and how == "serial":
            # the very card (its serial) is here, but its part no longer fits it (a kernel or driver update
            # changed its overdrive format or knob): not applied, and not a skip that reads as success
            why = match_device(part, here, backend.knob(here.id)).reason
            what = f"{profile.name!r}" + (f" card[{card}]" if card is not None else "")
            say(f"not applied {what} to {here.id}: it is the card the profile was proven on, but {why}; tune it "
                "again (`tuner bisect`) and install the new profile")
            out.append(BootCardResult(profile.name, "error", exit_codes.UNSUPPORTED, card, here.id, reason=why))
        elif card is None:
            why = (f"its card ({fingerprint(profile.device)}) is not in this machine; at boot a profile applies only "
                   "to the card it was proven on (use `tuner apply NAME --verify 5m` for another card)")
            say(f"skipped {profile.name!r}: {why}")
            out.append(BootCardResult(profile.name, "skipped", reason=why))
        else:
            other = here
            serial = part.device.serial or "?"
            why = (f"its card (serial {serial}, slot {part.device.pci_slot or '?'}) is not in this machine" if other
                   is None else f"{other.id} is not the card it was proven on (serial {serial})")
            say(f"missing card: {profile.name!r} card[{index}] not applied: {why}; the rig's other cards are still "
                "applied. Check the card, or tune the rig again with `tuner bisect --device all`")
            out.append(BootCardResult(profile.name, "missing", exit_codes.HARDWARE, index,
                                      other.id if other else None, reason=why))
    return out


def _apply_part(backend: Backend, profile: Profile, part: ProfilePart, device: DeviceInfo,
                say: Callable[[str], None], card: int | None, found: list[other_tools.Found]) -> BootCardResult:
    what = f"{profile.name!r}" + (f" card[{card}]" if card is not None else "")
    value, unit = part.setting.value, part.setting.unit

    def failed(e: TunerError) -> BootCardResult:
        say(f"could not apply {what} to {device.id}: {e.one_line()}")
        return BootCardResult(profile.name, "error", e.exit_code, card, device.id, reason=e.one_line())

    try:
        knob = backend.knob(device.id)
    except TunerError as e:
        return failed(e)
    tools = other_tools.affecting(backend, [device.id], found).get(device.id, [])
    if tools:
        why = (f"{', '.join(t.describe() for t in tools)} may change this card too ({tools[0].tool.writes}); left "
               f"as it is ({knob.current:+d} {knob.unit}), so the two do not fight over it")
        say(f"not applied {what} to {device.id}: {why}; stop and disable that tool, or remove this profile from the "
            "system store")
        return BootCardResult(profile.name, "busy", exit_codes.BUSY, card, device.id, reason=why,
                              found=knob.current)
    lock = part.setting.lock_clock_mhz if can_lock_clock(knob) else None
    if knob.current not in (knob.stock, value):
        say(f"{device.id} reads {knob.current:+d} {knob.unit}, not stock and not the installed {value:+d} {unit} "
            f"(set by something else since); applying {what} again")
    try:
        _persistence(backend, device, say)
        # the unsafe list holds at boot (never --ignore-unsafe there)
        after = apply_setting_now(backend, SetRequest(device.id, value, lock_clock_mhz=lock))
    except TunerError as e:
        return failed(e)
    locked = after.lock_clock_mhz if lock is not None else None
    at_lock = f" at a locked max graphics clock of {locked} MHz" if locked else ""
    say(f"applied {what} to {device.id} {device.label}: {after.current:+d} {after.unit}{at_lock} (read back)")
    # the drift `tuner apply` warns about (a driver, VBIOS or kernel update since tuning can move the limit): at
    # boot nobody watches, so the log and the last-run record say it
    for warning in match_device(part, device, knob, kernel=platform.release()).warnings:
        say(f"warning: {what} on {device.id}: {warning}")
    return BootCardResult(profile.name, "applied", exit_codes.OK, card, device.id, after.current,
                          lock_clock_mhz=locked, found=knob.current)


def _persistence(backend: Backend, device: DeviceInfo, say: Callable[[str], None]) -> None:
    """NVIDIA: persistence mode on before the write, or the driver drops the setting when this job exits. The same
    in-process and through the root helper (its `persistence` request), so neither applies on weaker terms."""
    if device.vendor != "nvidia" or device.simulated:
        return
    if backend.persistence_off(device.id):
        backend.enable_persistence(device.id)
        say(f"{device.id}: turned persistence mode on (read back), so the setting outlives this run")


def _record(report: BootReport, simulated: bool) -> None:
    """The last boot run, for `tuner service status` and the UI; a failure to write it never fails the boot."""
    doc = {"finished_at": time.time(), **report.to_dict()}
    path = last_run_path(simulated)
    try:
        write_atomic(path, json.dumps(doc, indent=1).encode())
    except OSError as e:
        boot_rules.log(f"could not record this run in {path}: {e.strerror}")


def read_last_run(simulated: bool = False, state_dir: Path | None = None) -> dict | None:
    """The last boot run recorded on this machine, or on the simulated cards (None: never, or unreadable: a link,
    a FIFO, too large, or not this user's to read)."""
    try:
        return last_run_doc(last_run_path(simulated, state_dir))
    except PermissionError:
        return None


def last_run_doc(path: Path) -> dict | None:
    """The record at `path`; None where there is none or it is damaged. PermissionError where this user may not
    read it (root's, under /root), for the status to say so."""
    try:
        doc = json.loads(state_files.read_file(path, LAST_RUN_MAX_BYTES).decode("utf-8"))
    except PermissionError:
        raise
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
