"""Turn what the tuner knows (a device, its knob, a value, and optionally a bisect's evidence) into a Profile: one
card's (schema 1), or a rig's (schema 2, issue 16, profiles/README.md): one part per card of a machine, proven
together, each holding what a single-card profile holds, with the optional `rig` evidence of the whole-rig
confirmation that ran every card at its setting at once. `tuner bisect --save NAME` builds them; `tuner apply` and
the boot service apply each part to the card it was proven on (tuner.actions.profile_apply).

The result goes through the same validation as a file read from disk, so a bisect that records something odd
fails here, at save time, rather than when someone tries to apply the profile.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass

from tuner import __version__
from tuner.core.models import DeviceInfo, Knob
from tuner.profiles.schema import MAX_STRING_CHARS, RIG_SCHEMA, SINGLE_SCHEMA, Profile, ProfileError, utc_now


def _shorten_reason(trial: dict) -> dict:
    """A failure reason is free text from the engine or the kernel log: cut it to fit rather than fail the save."""
    reason = trial.get("reason")
    if isinstance(reason, str) and len(reason) > MAX_STRING_CHARS:
        return {**trial, "reason": reason[: MAX_STRING_CHARS - 3] + "..."}
    return trial


def meta_doc(name: str, schema: int) -> dict:
    return {"name": name, "created": utc_now(), "tool_version": __version__, "schema": schema}


def part_doc(device: DeviceInfo, knob: Knob, value: int, tuning: dict | None, kernel: str | None) -> dict:
    """One card's [device], [setting] and [tuning] tables, as a single-card profile or a rig's [[card]] has them.
    A None value is an unknown one: left out of the file."""
    doc: dict[str, object] = {
        "device": {"vendor": device.vendor, "name": device.name, "pci_id": device.pci_id,
                   "subsystem_id": device.subsystem_id, "pci_slot": device.pci_slot, "vbios": device.vbios,
                   "serial": device.serial, "driver_version": device.driver_version,
                   "kernel": kernel if kernel is not None else platform.release(), "od_format": device.od_format},
        "setting": {"kind": knob.kind.value, "unit": knob.unit, "value": value, "lock_clock_mhz": knob.lock_clock_mhz},
    }
    if tuning:
        doc["tuning"] = {**tuning, "trials": [_shorten_reason(t) for t in tuning.get("trials") or ()]}
    return doc


def build_profile(
    name: str,
    device: DeviceInfo,
    knob: Knob,
    value: int,
    *,
    tuning: dict | None = None,
    kernel: str | None = None,
) -> Profile:
    """A validated single-card profile (schema 1) for `value` on `device`. `tuning` keys whose value is None are
    left out (TOML has no null); `kernel` defaults to the running kernel's release."""
    return Profile.from_dict({"profile": meta_doc(name, SINGLE_SCHEMA),
                              **part_doc(device, knob, value, tuning, kernel)})



@dataclass(frozen=True)
class RigPart:
    """What the tuner knows about one card of the rig: who it is, its knob, the setting, and its evidence."""

    device: DeviceInfo
    knob: Knob
    setting: int
    tuning: dict | None = None  # BisectOutcome.tuning() of that card (None values are left out)


def build_rig_profile(name: str, parts: Sequence[RigPart], *, rig: dict | None = None,
                      kernel: str | None = None) -> Profile:
    """A validated rig profile (schema 2): one [[card]] per part, in the order given.

    `rig`: the whole-rig confirmation's evidence, keys of `RigEvidence` (confirm_duration_s, attempts, backend
    (gloo|nccl|rccl), mode, preset, dtype, tok_s, power_w, tok_per_j); None values are left out, an unknown key
    is a ProfileError naming `rig.KEY`. `kernel` defaults to the running kernel's release. Raises ProfileError
    for no parts, two parts naming the same card, or a part whose card has neither a serial nor a PCI slot.
    """
    if not parts:
        raise ProfileError("card: a rig profile needs at least one card")
    doc: dict[str, object] = {"profile": meta_doc(name, RIG_SCHEMA)}
    if rig:
        doc["rig"] = rig
    doc["card"] = [part_doc(p.device, p.knob, p.setting, p.tuning, kernel) for p in parts]
    return Profile.from_dict(doc)
