"""Is this the card a profile was proven on? A stable limit belongs to one piece of silicon.

The rules, in order:
1. Another vendor, or another kind of knob (a mV offset vs a MHz offset): refused, and `--force` cannot override
   it, because the number would mean something else entirely.
2. Another model (PCI vendor:device, subsystem or overdrive format differ): refused unless `--force`.
3. The same model, another card (serial/UUID differs, or unknown serials and another slot): silicon differs, so
   it needs `--verify DUR` (a stress trial at the setting, reverted on failure) or `--force`.
4. The same card (same serial/UUID; or serials unknown and the same model in the same slot): applies.
Driver, VBIOS or kernel changes on the same card are warnings: the limit can move with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from tuner.core.models import DeviceInfo, Knob, printable, same_serial
from tuner.profiles.schema import Profile, ProfileDevice, ProfilePart


class Match(str, Enum):
    SAME_CARD = "same_card"
    SAME_MODEL = "same_model"  # another card of the same model: needs --verify or --force
    OTHER_MODEL = "other_model"  # refused unless --force
    INCOMPATIBLE = "incompatible"  # another vendor or knob kind: always refused


@dataclass(frozen=True)
class MatchResult:
    match: Match
    reason: str
    warnings: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"match": self.match.value, "reason": self.reason, "warnings": list(self.warnings)}


def fingerprint(device: DeviceInfo | ProfileDevice) -> str:
    """One line that identifies a card: `vendor pci_id/subsystem_id od_format @slot #serial` (unknowns as '?')."""
    return printable(f"{device.vendor} {device.pci_id or '?'}/{device.subsystem_id or '?'} {device.od_format or '?'} "
                     f"@{device.pci_slot or '?'} #{device.serial or '?'}")  # a profile's text: escaped


def _differs(a: str | None, b: str | None) -> bool:
    """Known on both sides and different (an unknown never counts as a difference or as a match)."""
    return a is not None and b is not None and a.lower() != b.lower()


def _shown(value: str | None) -> str:
    """A field of a profile (a stranger's file) or of a card, as a message shows it: control and format characters
    escaped (`printable`), as a card's name is."""
    return printable(str(value))


def match_device(profile: Profile | ProfilePart, target: DeviceInfo, knob: Knob, *,
                 kernel: str | None = None) -> MatchResult:
    """How `target` relates to the card `profile` (or one part of a rig profile) was proven on."""
    theirs = profile.device
    if theirs.vendor != target.vendor:
        return MatchResult(Match.INCOMPATIBLE, f"vendor mismatch: the profile is for {theirs.vendor}, {target.id} is "
                                               f"{target.vendor}")
    if profile.setting.kind != knob.kind.value or profile.setting.unit != knob.unit:
        return MatchResult(Match.INCOMPATIBLE, f"the profile sets a {profile.setting.kind} in {profile.setting.unit}, "
                                               f"{target.id} has a {knob.kind.value} in {knob.unit}")
    for attr, what in (("pci_id", "PCI id"), ("subsystem_id", "subsystem id"), ("od_format", "overdrive format")):
        if _differs(getattr(theirs, attr), getattr(target, attr)):
            mine, yours = _shown(getattr(theirs, attr)), _shown(getattr(target, attr))
            return MatchResult(Match.OTHER_MODEL, f"another model: the profile's {what} is {mine}, "
                                                  f"{target.id} has {yours}")
    if (theirs.pci_id is None or target.pci_id is None) and theirs.name != target.name:
        return MatchResult(Match.OTHER_MODEL, f"another model: the profile is for {theirs.name!r}, {target.id} "
                                              f"is {target.name!r}")
    warnings = _drift_warnings(theirs, target, kernel)
    same = same_serial(theirs.serial, target.serial)
    if same is not None:
        if not same:
            return MatchResult(Match.SAME_MODEL, f"the same model but another card (serial "
                                                 f"{_shown(theirs.serial)}, {target.id} is {_shown(target.serial)}); "
                                                 "silicon differs card to card")
        moved = _differs(theirs.pci_slot, target.pci_slot)
        return MatchResult(Match.SAME_CARD, "the same card (serial matches)" + (
            f"; it moved from slot {_shown(theirs.pci_slot)} to {target.pci_slot}" if moved else ""), warnings)
    if theirs.pci_slot and target.pci_slot and theirs.pci_slot.lower() == target.pci_slot.lower():
        return MatchResult(Match.SAME_CARD, "the same model in the same slot (no serial to compare)", warnings)
    return MatchResult(Match.SAME_MODEL, "the same model, but nothing proves it is the same card (no serial, "
                                         "another or unknown slot); silicon differs card to card")


def _drift_warnings(theirs: ProfileDevice, target: DeviceInfo, kernel: str | None) -> tuple[str, ...]:
    out = []
    for attr, what in (("vbios", "VBIOS"), ("driver_version", "driver")):
        if _differs(getattr(theirs, attr), getattr(target, attr)):
            was, now = _shown(getattr(theirs, attr)), _shown(getattr(target, attr))
            out.append(f"{what} changed since tuning ({was} -> {now}); "
                       "the stable limit can move, consider --verify")
    if _differs(theirs.kernel, kernel):
        out.append(f"kernel changed since tuning ({_shown(theirs.kernel)} -> {_shown(kernel)}); consider --verify")
    return tuple(out)
