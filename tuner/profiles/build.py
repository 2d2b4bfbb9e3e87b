"""Turn what the tuner knows (a device, its knob, a value, and optionally a bisect's evidence) into a Profile.

The result goes through the same validation as a file read from disk, so a bisect that records something odd
fails here, at save time, rather than when someone tries to apply the profile.
"""

from __future__ import annotations

import platform

from tuner import __version__
from tuner.core.models import DeviceInfo, Knob
from tuner.profiles.schema import MAX_STRING_CHARS, SINGLE_SCHEMA, Profile, utc_now


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


__all__ = ["build_profile", "meta_doc", "part_doc"]
