"""A rig profile: one part per card of a machine, proven together (issue 16; schema 2, profiles/README.md).

Each part is what a single-card profile holds (the card's identity, its setting, that card's bisect evidence);
the optional `rig` evidence records the whole-rig confirmation that ran every card at its setting at once.
`tuner bisect --device all --save NAME` builds one with `build_rig_profile`; `tuner apply` and the boot service
apply each part to the card it was proven on (tuner.actions.profile_apply).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.core.models import DeviceInfo, Knob
from tuner.profiles.build import meta_doc, part_doc
from tuner.profiles.schema import RIG_SCHEMA, Profile, ProfileError


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


__all__ = ["RigPart", "build_rig_profile"]
