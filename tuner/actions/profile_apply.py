"""Apply a saved profile: the identity rules, `--force` limits, the unsafe list and the lock clock, in one place.

`tuner apply` and the Profiles screen both call `plan_profile_apply` (every check, nothing written) and then
`set_profile_lock_clock` before they write the value (keep-or-revert, a direct apply, or a verify trial with the
profile's own workload). Rules (tuner.profiles.identity): another vendor or knob kind is always refused; another
model needs `force`; another card of the same model needs a verify trial or `force`; the value must lie in the
card's current range, on its step, and never overvolts.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from tuner.actions.setting import SetRequest, can_lock_clock
from tuner.actions.verify import Workload
from tuner.backends.base import Backend
from tuner.core.errors import UsageError
from tuner.core.models import DeviceInfo, Knob
from tuner.profiles import Profile
from tuner.profiles.identity import Match, MatchResult, fingerprint, match_device
from tuner.tuning import journal


@dataclass(frozen=True)
class ProfileApply:
    """A profile that may be applied to `device`: what to write, how, and what to warn about."""

    profile: Profile
    device: DeviceInfo
    knob: Knob  # the card's knob before anything was written
    match: MatchResult
    verify_required: bool  # another card of the same model and no --force: only a verify trial may apply it
    warnings: tuple[str, ...]
    workload: Workload  # the profile's own preset/mode/dtype, for its verify trial

    @property
    def value(self) -> int:
        return self.profile.setting.value

    @property
    def lock_clock_mhz(self) -> int | None:
        """The lock clock to set before the value (None: nothing to change)."""
        lock = self.profile.setting.lock_clock_mhz
        return lock if lock is not None and lock != self.knob.lock_clock_mhz else None

    def set_request(self, backend: Backend) -> SetRequest:
        """The value as a `set` request, with the profile's lock clock where the backend can set it: for
        `prepare_setting`, which checks everything again before it writes (the card may have changed since)."""
        lock = self.lock_clock_mhz if can_lock_clock(backend, self.knob) else None
        return SetRequest(self.device.id, self.value, lock_clock_mhz=lock)


def pick_profile_device(profile: Profile, backend: Backend, device_id: str | None) -> DeviceInfo:
    """The card named, else the one the profile was proven on, else the only one."""
    if device_id:
        return backend.device(device_id)
    devices = backend.devices()
    for dev in devices:
        if match_device(profile, dev, backend.knob(dev.id)).match is Match.SAME_CARD:
            return dev
    if len(devices) == 1:
        return devices[0]
    raise UsageError(f"the card this profile was proven on ({fingerprint(profile.device)}) is not here, and there are "
                     "several GPUs", "name one with --device ID")


def plan_profile_apply(backend: Backend, profile: Profile, device_id: str | None, *, force: bool = False,
                       verify: bool = False, ignore_unsafe: bool = False,
                       kernel: str | None = None) -> ProfileApply:
    """Every check of applying `profile`; raises UsageError/OutOfRange before anything is written.

    `verify`: the front end will run a verify trial (so another card of the same model is allowed)."""
    if profile.is_rig:  # its `device`/`setting` are only the first card's: applying them alone would be wrong
        raise UsageError(f"{profile.name!r} is a rig profile ({len(profile.parts)} cards); nothing was applied",
                         f"apply the whole rig with `tuner apply {profile.name}`")
    device = pick_profile_device(profile, backend, device_id)
    knob = backend.knob(device.id)
    result = match_device(profile, device, knob, kernel=platform.release() if kernel is None else kernel)
    name = profile.name
    if result.match is Match.INCOMPATIBLE:
        raise UsageError(f"refusing to apply {name!r} to {device.id}: {result.reason}; nothing was applied",
                         "--force does not override a vendor or knob mismatch; tune this card with `tuner bisect`")
    if result.match is Match.OTHER_MODEL and not force:
        raise UsageError(f"refusing to apply {name!r} to {device.id}: {result.reason}; nothing was applied",
                         "tune this card with `tuner bisect`, or pass --force (and ideally --verify DUR)")
    verify_required = result.match is Match.SAME_MODEL and not force
    if verify_required and not verify:
        raise UsageError(f"{name!r} was proven on another card: {result.reason}; nothing was applied",
                         "pass --verify 5m to test it on this card first (reverted on failure), or --force")
    value = profile.setting.value
    knob.validate(value)  # range, step, no overvolt (a profile never overvolts, --force or not)
    journal.check_safety_state(device.id)  # damaged safety files block even --ignore-unsafe (fail closed)
    if not ignore_unsafe:
        journal.refuse_unsafe(device.id, knob, value)
    warnings = list(result.warnings)
    if result.match is not Match.SAME_CARD:
        warnings.insert(0, result.reason)
    warnings += _unapplied_fields(profile, knob, backend)
    return ProfileApply(profile, device, knob, result, verify_required, tuple(warnings), Workload.of_profile(profile))


def set_profile_lock_clock(backend: Backend, plan: ProfileApply) -> str | None:
    """NVIDIA: the offset was proven at a locked max clock; lock to it before the value (as `set --lock-mhz`).
    Returns what was done, for the front end to say."""
    lock = plan.lock_clock_mhz
    if lock is None or not can_lock_clock(backend, plan.knob):
        return None
    backend.set_lock_clock(plan.device.id, lock)  # type: ignore[attr-defined]
    return f"{plan.device.id}: the offset is applied at a locked max graphics clock of {lock} MHz (as proven)"


def _unapplied_fields(profile: Profile, knob: Knob, backend: Backend) -> list[str]:
    """Fields the backend cannot set: said out loud, never silently dropped."""
    out = []
    s = profile.setting
    if s.lock_clock_mhz is not None and s.lock_clock_mhz != knob.lock_clock_mhz and not can_lock_clock(backend, knob):
        out.append(f"the profile was proven at a locked max clock of {s.lock_clock_mhz} MHz, this card is at "
                   f"{knob.lock_clock_mhz or 'no lock'}, and this backend cannot change the lock")
    if s.power_limit_w is not None:
        out.append(f"the profile records a power limit of {s.power_limit_w:g} W, which apply does not set")
    return out
