"""`tuner apply --boot`: apply the system profiles, single-card and rig, to the cards they were proven on.

Nobody is there to confirm at boot, so only the proven card gets a part (the same card by serial, or by slot
when no serial is known; never `--force`, never `--ignore-unsafe`), and each card is applied on its own: one that
cannot be applied does not keep the others at stock. The rules that skip a whole boot (tuner.reset, a trial left
open by the previous boot) live in tuner.profiles.boot.

Exit status, so `systemctl status tuner-apply` tells the truth:
- a single-card profile whose card is not here is a skip by design (a profile for another machine): exit 0;
- a rig profile's card that is missing or replaced is not: the rig was proven and confirmed with that card, so
  the run exits non-zero (HARDWARE, as a card that was lost) after the other cards got their parts. Those parts
  still apply because each was proven on its own card and confirmed under a heavier load (every card at once);
  leaving them at stock would lose what is known to be safe, and saying nothing would hide a missing card.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.actions.profile_apply import find_part_card
from tuner.actions.setting import SetRequest, apply_setting_now
from tuner.backends.base import Backend
from tuner.core import exit_codes, paths
from tuner.core.atomic import write_atomic
from tuner.core.errors import TunerError, Unsupported
from tuner.core.models import DeviceInfo
from tuner.profiles import Profile, load_profile
from tuner.profiles import boot as boot_rules
from tuner.profiles.identity import Match, fingerprint, match_device
from tuner.profiles.schema import ProfilePart
from tuner.profiles.store import scan


@dataclass(frozen=True)
class BootCardResult:
    """What the boot run did with one part: applied, skipped (not this machine's card), missing or error."""

    profile: str
    status: str  # "applied" | "skipped" | "missing" | "error"
    exit_code: int = exit_codes.OK
    card: int | None = None  # the part's index in a rig profile (None: a single-card profile)
    device: str | None = None
    value: int | None = None  # read back after applying
    reason: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class BootReport:
    skipped: str | None  # why nothing was applied this boot (tuner.reset, an open trial), else None
    results: tuple[BootCardResult, ...]
    exit_code: int
    lines: tuple[str, ...]  # every line logged, for `tuner service status` and the UI

    def to_dict(self) -> dict:
        return {"skipped": self.skipped, "exit_code": self.exit_code, "results": [r.to_dict() for r in self.results],
                "lines": list(self.lines)}


def last_run_path() -> Path:
    return paths.state_dir() / "boot" / "last-run.json"


def run_boot_apply(open_backend: Callable[[], Backend], *, profile: str | None = None,
                   wait_s: float = boot_rules.DEFAULT_DISCOVERY_WAIT_S,
                   log: Callable[[str], None] = boot_rules.log) -> BootReport:
    """Apply `profile` (a name or path), else every system profile, at boot. Records the run (last_run_path)."""
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        log(line)

    try:
        report = _run(open_backend, profile, wait_s, say, lines)
    except TunerError as e:  # no backend, a bad profile named on the command line: the record says so too
        _record(BootReport(None, (), e.exit_code, (*lines, f"error: {e.one_line()}")))
        raise
    _record(report)
    return report


def _run(open_backend: Callable[[], Backend], profile_name: str | None, wait_s: float,
         say: Callable[[str], None], lines: list[str]) -> BootReport:
    reason = boot_rules.skip_reason()
    if reason:
        say(f"skipped: {reason}")
        return BootReport(reason, (), exit_codes.OK, tuple(lines))
    if profile_name is not None:
        profiles = [load_profile(profile_name)]
    else:
        profiles, bad = scan(system=True)
        for path, why in bad:
            say(f"ignoring {path}: {why}")
        if not profiles:
            say("no profiles in the system store; nothing to apply")
            return BootReport(None, (), exit_codes.OK, tuple(lines))

    def ready(backend: Backend) -> bool:  # every part's own card is up (the driver may still be probing)
        devices = backend.devices()
        return all(_same_card(part, devices, backend) is not None for p in profiles for part in p.parts)

    backend = boot_rules.discover(open_backend, ready, wait_s=wait_s)
    if backend is None:  # discover re-raises the open error itself; this only keeps the type honest
        raise Unsupported("no GPU backend could be opened at boot", "see `tuner doctor`")
    results: list[BootCardResult] = []
    for p in profiles:
        results += _apply_rig(p, backend, say) if p.is_rig else [_apply_single(p, backend, say)]
    worst = next((r.exit_code for r in results if r.exit_code), exit_codes.OK)
    return BootReport(None, tuple(results), worst, tuple(lines))


def _same_card(part: ProfilePart, devices: list[DeviceInfo], backend: Backend) -> DeviceInfo | None:
    """The card `part` was proven on, if it is here and is that very card (never another card at boot)."""
    device, _how = find_part_card(part, devices)
    if device is not None and match_device(part, device, backend.knob(device.id)).match is Match.SAME_CARD:
        return device
    return None


def _apply_single(profile: Profile, backend: Backend, say: Callable[[str], None]) -> BootCardResult:
    for device in backend.devices():
        if match_device(profile, device, backend.knob(device.id)).match is Match.SAME_CARD:
            return _apply_part(backend, profile, profile.parts[0], device, say, None)
    why = (f"its card ({fingerprint(profile.device)}) is not in this machine; at boot a profile applies only to the "
           "card it was proven on (use `tuner apply NAME --verify 5m` for another card)")
    say(f"skipped {profile.name!r}: {why}")
    return BootCardResult(profile.name, "skipped", reason=why)


def _apply_rig(profile: Profile, backend: Backend, say: Callable[[str], None]) -> list[BootCardResult]:
    """Each part to its own card; a missing or replaced card is logged and fails the run, the others apply."""
    devices = backend.devices()
    out = []
    for index, part in enumerate(profile.parts):
        device = _same_card(part, devices, backend)
        if device is None:
            found, _how = find_part_card(part, devices)
            serial = part.device.serial or "?"
            why = (f"its card (serial {serial}, slot {part.device.pci_slot or '?'}) is not in this machine" if found
                   is None else f"{found.id} is not the card it was proven on (serial {serial})")
            say(f"missing card: {profile.name!r} card[{index}] not applied: {why}; the rig's other cards are still "
                "applied. Check the card, or tune the rig again with `tuner bisect --device all`")
            out.append(BootCardResult(profile.name, "missing", exit_codes.HARDWARE, index,
                                      found.id if found else None, reason=why))
            continue
        out.append(_apply_part(backend, profile, part, device, say, index))
    return out


def _apply_part(backend: Backend, profile: Profile, part: ProfilePart, device: DeviceInfo,
                say: Callable[[str], None], card: int | None) -> BootCardResult:
    what = f"{profile.name!r}" + (f" card[{card}]" if card is not None else "")
    try:  # the unsafe list holds at boot (never --ignore-unsafe there)
        after = apply_setting_now(backend, SetRequest(device.id, part.setting.value))
    except TunerError as e:
        say(f"could not apply {what} to {device.id}: {e.one_line()}")
        return BootCardResult(profile.name, "error", e.exit_code, card, device.id, reason=e.one_line())
    say(f"applied {what} to {device.id} {device.label}: {after.current:+d} {after.unit} (read back)")
    return BootCardResult(profile.name, "applied", exit_codes.OK, card, device.id, after.current)


def _record(report: BootReport) -> None:
    """The last boot run, for `tuner service status` and the UI; a failure to write it never fails the boot."""
    doc = {"finished_at": time.time(), **report.to_dict()}
    try:
        write_atomic(last_run_path(), json.dumps(doc, indent=1).encode())
    except OSError as e:
        boot_rules.log(f"could not record this run in {last_run_path()}: {e.strerror}")


def read_last_run() -> dict | None:
    """The last boot run recorded on this machine (None: never, or unreadable)."""
    try:
        doc = json.loads(last_run_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
