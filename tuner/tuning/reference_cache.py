"""Where a manual stress run's stock reference is cached: one file per card and per engine settings.

A stress run compares every step's loss bits with a reference recorded at stock (as a bisect trial does). The
reference is only valid for the run that recorded it: the same card and every engine setting that changes the
training trajectory (preset, mode, dtype, seed, compile, batch size, data, threads, ...). So the cache key holds
the card's identity (its serial, else its PCI address; never a backend's index such as `sim1`, which names another
card when `--sim-gpus` or the slot order changes) and every engine option except the few that do not change the
trajectory (how long it runs, what it compares with or records, fault injection, watchdog and canary timing).
A new engine option is therefore part of the key unless someone decides here that it is not: a changed setting
never compares against a stale reference.

Plain Python: the App's Tune screen and any other front end call `manual_reference`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from tuner.core import paths
from tuner.core.models import DeviceInfo
from tuner.engine.options import EngineOptions

# EngineOptions fields that do not change the losses the engine computes step by step. Everything else is keyed.
NOT_TRAJECTORY = frozenset({
    "device",  # the torch device string (cuda:N) follows the card's enumeration order; the identity is keyed
    "steps", "duration_s",  # how long: a compare loops over the reference (reference_loop)
    "record", "reference", "reference_loop", "verify_repeatable", "reference_tolerance", "tolerance",
    "fault_rate", "fault_seed", "injections",  # faults are what the comparison looks for, not part of stock
    "canary_every", "canary_every_s", "gemm_n", "gemm_repeats",  # side checks between steps
    "expect_pci_bus_id", "heartbeat_s", "parent_pid", "cache_dir",
    "rendezvous", "collective_timeout_s",  # where and how long ranks meet (world_size and rank pick the data: keyed)
    "test_oom_above", "test_oom_at_step",
})


@dataclass(frozen=True)
class CachedReference:
    """The reference file for a run (None: nothing to compare with), and why there is none."""

    path: Path | None
    why_none: str | None = None


def card_identity(device: DeviceInfo) -> str | None:
    """The card's own name for the cache: serial, else PCI address; None when it has neither."""
    if device.serial:
        return f"serial-{device.serial}"
    if device.pci_slot:
        return f"pci-{device.pci_slot}"
    return None


def _plain(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def manual_reference(device: DeviceInfo, options: EngineOptions) -> CachedReference:
    """The cached stock reference for a run of `options` on `device`:
    `$XDG_STATE_HOME/tuner/references/<vendor>-<serial or pci>-<preset>-<mode>-<hash of the settings>.ref`.

    None for the GEMM burn (no trajectory) and for a card with neither serial nor PCI address (no key that
    names this card and only this one)."""
    if options.mode == "gemm":
        return CachedReference(None, "n/a (GEMM)")
    identity = card_identity(device)
    if identity is None:
        return CachedReference(None, "this card reports neither a serial nor a PCI address, so a cached reference "
                                     "could not be told apart from another card's")
    key = {"vendor": device.vendor, "card": identity,  # and every engine option that changes the trajectory
           **{f.name: _plain(getattr(options, f.name)) for f in dataclasses.fields(options)
              if f.name not in NOT_TRAJECTORY}}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{device.vendor}-{identity}-{options.preset}-{options.mode}-{digest}")
    return CachedReference(paths.state_dir() / "references" / f"{name}.ref")


__all__ = ["NOT_TRAJECTORY", "CachedReference", "card_identity", "manual_reference"]
