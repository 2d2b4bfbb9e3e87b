"""Apply a saved profile: the identity rules, `--force` limits, the unsafe list and the lock clock, in one place.

`tuner apply` and the Profiles screen both call `plan_profile_apply` (every check, nothing written) and then
write `ProfileApply.set_request()` (the value with its lock clock, so a revert puts the card's lock back too;
keep-or-revert or a direct apply), or `verify_profile` (a verify trial with the profile's own workload, lock clock
and bundled reference). Rules (tuner.profiles.identity): another vendor or knob kind is always refused; another
model needs `force`; another card of the same model needs a verify trial or `force`; the value must lie in the
card's current range, on its step, and never overvolts.

A rig profile (one part per card) goes through `plan_rig_apply` (every part checked, nothing written; each part's
card found by serial, then PCI slot; a missing or different card refused unless `force`) and `prepare_rig_apply`
(one `RigChange`: all cards applied in turn, the applied ones put back if a later one fails, one keep-or-revert
for the whole rig). The single-card planner refuses a rig profile.
"""

from __future__ import annotations

import contextlib
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tuner.actions import other_tools
from tuner.actions.keep_or_revert import DEFAULT_TIMEOUT_S, Countdown, PendingChange
from tuner.actions.setting import SetRequest, can_lock_clock, check_setting
from tuner.actions.verify import VerifyOutcome, Workload, verify_setting
from tuner.backends.base import Backend
from tuner.core.card_lock import CardLock
from tuner.core.errors import TunerError, UsageError
from tuner.core.models import DeviceInfo, Knob, same_serial
from tuner.profiles import Profile, ProfilePart, evidence
from tuner.profiles import reference_bundle as rb
from tuner.profiles.identity import Match, MatchResult, fingerprint, match_device


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

    def set_request(self) -> SetRequest:
        """The value as a `set` request, with the profile's lock clock where the backend can set it: for
        `prepare_setting`, which checks everything again before it writes (the card may have changed since)."""
        return SetRequest(self.device.id, self.value, lock_clock_mhz=_lock_to_set(self.profile, self.knob))


def _lock_to_set(profile: Profile | ProfilePart, knob: Knob) -> int | None:
    """The lock clock to set before the value: the profile's, where it differs from the card's and the backend can
    set it (None: nothing to change)."""
    lock = profile.setting.lock_clock_mhz
    return lock if lock != knob.lock_clock_mhz and can_lock_clock(knob) else None


def pick_profile_device(profile: Profile, backend: Backend, device_id: str | None) -> DeviceInfo:
    """The card named, else the one the profile was proven on, else the only one."""
    if device_id:
        return backend.device(device_id)
    devices = backend.devices()
    if (proven := proven_card(profile, devices, backend)) is not None:
        return proven
    if len(devices) == 1:
        return devices[0]
    raise UsageError(f"the card this profile was proven on ({fingerprint(profile.device)}) is not here, and there are "
                     "several GPUs", "name one with --device ID")


def plan_profile_apply(backend: Backend, profile: Profile, device_id: str | None, *, force: bool = False,
                       verify: bool = False, ignore_unsafe: bool = False) -> ProfileApply:
    """Every check of applying `profile`; raises UsageError/OutOfRange before anything is written.

    `verify`: the front end will run a verify trial (so another card of the same model is allowed)."""
    if profile.is_rig:  # its `device`/`setting` are only the first card's: applying them alone would be wrong
        raise UsageError(f"{profile.name!r} is a rig profile ({len(profile.parts)} cards); nothing was applied",
                         f"apply the whole rig with `tuner apply {profile.name}`")
    device = pick_profile_device(profile, backend, device_id)
    knob = backend.knob(device.id)
    result = match_device(profile, device, knob, kernel=platform.release())
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
    # range, step, no overvolt (a profile never overvolts, --force or not), damaged safety files (even with
    # --ignore-unsafe: fail closed), the unsafe list
    check_setting(backend, SetRequest(device.id, profile.setting.value, ignore_unsafe=ignore_unsafe))
    warnings = list(result.warnings)
    if result.match is not Match.SAME_CARD:
        warnings.insert(0, result.reason)
    warnings += _unapplied_fields(profile, knob, backend)
    warnings += filter(None, [evidence.apply_warning(profile.parts[0], repr(name))])
    warnings += other_tools.warnings_for(backend, [device.id])  # issue 23: LACT, CoreCtrl, nvidia-powerd
    return ProfileApply(profile, device, knob, result, verify_required, tuple(warnings), Workload.of_profile(profile))


def profile_lock_note(plan: ProfileApply) -> str | None:
    """What a front end says when the profile's lock clock comes with its value (None: the lock stays)."""
    lock = _lock_to_set(plan.profile, plan.knob)
    if lock is None:
        return None
    return f"{plan.device.id}: the offset is applied at a locked max graphics clock of {lock} MHz (as proven)"


def verify_profile(backend: Backend, plan: ProfileApply, duration_s: float, *, on_line: Callable[[str], None],
                   stop_event: threading.Event | None = None) -> VerifyOutcome:
    """A verify trial of the profile on the plan's card, for `tuner apply --verify` and the Profiles screen alike:
    the reference bundled beside the profile is read first (a damaged one is refused before anything is written),
    then the profile's lock clock, then `verify_setting` with the profile's workload, compared with that bundle."""
    source = plan.profile.source
    bundled = None if source is None else rb.reference_beside(source)
    locked = profile_lock_note(plan)
    if locked:
        on_line(locked)
    # the lock is set inside the verify, so anything but a pass puts back the lock the card had too
    return verify_setting(backend, plan.device.id, plan.value, duration_s, workload=plan.workload, bundled=bundled,
                          on_line=on_line, stop_event=stop_event, lock_clock_mhz=plan.set_request().lock_clock_mhz)


def _unapplied_fields(profile: Profile | ProfilePart, knob: Knob, backend: Backend) -> list[str]:
    """Fields the backend cannot set: said out loud, never silently dropped."""
    out = []
    s = profile.setting
    if s.lock_clock_mhz is not None and s.lock_clock_mhz != knob.lock_clock_mhz and not can_lock_clock(knob):
        out.append(f"the profile was proven at a locked max clock of {s.lock_clock_mhz} MHz, this card is at "
                   f"{knob.lock_clock_mhz or 'no lock'}, and this backend cannot change the lock")
    if s.power_limit_w is not None:
        out.append(f"the profile records a power limit of {s.power_limit_w:g} W, which apply does not set")
    return out


# --- rig profiles: every part to the card it was proven on, all or nothing ---------------------------------------


@dataclass(frozen=True)
class RigPartApply:
    """One part of a rig profile and the card it goes to (None: its card is missing and --force skips it)."""

    index: int
    part: ProfilePart
    device: DeviceInfo | None
    knob: Knob | None  # that card's knob before anything was written
    match: MatchResult | None
    found_by: str  # "serial", "pci_slot" or "missing"

    @property
    def value(self) -> int:
        return self.part.setting.value

    @property
    def label(self) -> str:
        """`card[1] (serial SIM-0000-01)`: how a message names the part."""
        d = self.part.device
        return f"card[{self.index}] ({f'serial {d.serial}' if d.serial else f'slot {d.pci_slot}'})"

    def where(self, profile_name: str) -> str:
        """`'rig' card[1] (serial SIM-0000-01) on sim1`: how a refusal names the part on its card."""
        assert self.device is not None, "a skipped part is on no card"
        return f"{profile_name!r} {self.label} on {self.device.id}"

    def set_request(self, *, ignore_unsafe: bool = False) -> SetRequest:
        """The part as a `set` request, with its lock clock where the backend can set it."""
        assert self.device is not None and self.knob is not None, "a skipped part has nothing to set"
        return SetRequest(self.device.id, self.value, ignore_unsafe=ignore_unsafe,
                          lock_clock_mhz=_lock_to_set(self.part, self.knob))

    def to_dict(self) -> dict:
        return {"card": self.index, "device": self.device.to_dict() if self.device else None,
                "found_by": self.found_by, "match": self.match.to_dict() if self.match else None,
                "value": self.value, "unit": self.part.setting.unit}


@dataclass(frozen=True)
class RigApply:
    """A rig profile every part of which was checked: what goes where, and what to warn about."""

    profile: Profile
    parts: tuple[RigPartApply, ...]
    warnings: tuple[str, ...]

    @property
    def to_apply(self) -> tuple[RigPartApply, ...]:
        return tuple(p for p in self.parts if p.device is not None)


def find_part_card(part: Profile | ProfilePart, devices: list[DeviceInfo]) -> tuple[DeviceInfo | None, str]:
    """The card a part was proven on: the one with its serial (wherever it sits now), else the one in its PCI
    slot (whatever it is: the identity rules then say whether it is the same card), else none. Serials compare as
    the identity rules compare them (`same_serial`: a hex serial as a number, a placeholder never matches)."""
    for dev in devices:
        if same_serial(part.device.serial, dev.serial):
            return dev, "serial"
    slot = part.device.pci_slot
    for dev in devices:
        if slot and (dev.pci_slot or "").lower() == slot.lower():
            return dev, "pci_slot"
    return None, "missing"


def proven_card(part: Profile | ProfilePart, devices: list[DeviceInfo], backend: Backend) -> DeviceInfo | None:
    """The card `part` was proven on, if it is here and is that very card (never another card of its model)."""
    device, _how = find_part_card(part, devices)
    if device is not None and match_device(part, device, backend.knob(device.id)).match is Match.SAME_CARD:
        return device
    return None


def plan_rig_apply(backend: Backend, profile: Profile, *, force: bool = False, ignore_unsafe: bool = False,
                   kernel: str | None = None) -> RigApply:
    """Every check of applying a rig profile, for every part, before anything is written; raises the first
    refusal (UsageError/OutOfRange/DamagedState), naming the part, so a refusal changes nothing.

    Per part (tuner.profiles.identity): another vendor or knob kind is always refused; a missing card, another
    card or another model is refused unless `force` (a missing card is then skipped, with a warning); two parts
    may never go to one card. The value must lie in the card's range, on its step, and not be on the unsafe list
    (unless `ignore_unsafe`)."""
    kernel = platform.release() if kernel is None else kernel
    devices = backend.devices()
    name = profile.name
    planned: list[RigPartApply] = []
    warnings: list[str] = []
    taken: dict[str, int] = {}
    for index, part in enumerate(profile.parts):
        device, found_by = find_part_card(part, devices)
        where = f"{name!r} {RigPartApply(index, part, None, None, None, found_by).label}"
        if device is None:
            if not force:
                raise UsageError(f"refusing to apply {where}: its card is not in this machine (no card has its "
                                 "serial or sits in its slot); nothing was applied",
                                 "check `tuner list`, or pass --force to apply the other parts and skip this one")
            warnings.append(f"{where}: its card is not in this machine; skipped (--force)")
            planned.append(RigPartApply(index, part, None, None, None, found_by))
            continue
        if device.id in taken:
            raise UsageError(f"refusing to apply {name!r}: card[{taken[device.id]}] and card[{index}] both match "
                             f"{device.id}; nothing was applied", "a rig profile holds one part per card; save it "
                             "again with `tuner bisect --device all --save NAME`")
        taken[device.id] = index
        knob = backend.knob(device.id)
        result = match_device(part, device, knob, kernel=kernel)
        if result.match is Match.INCOMPATIBLE:
            raise UsageError(f"refusing to apply {where} to {device.id}: {result.reason}; nothing was applied",
                             "--force does not override a vendor or knob mismatch")
        if result.match is not Match.SAME_CARD and not force:
            raise UsageError(f"refusing to apply {where} to {device.id}: {result.reason}; nothing was applied",
                             "tune this rig with `tuner bisect --device all`, or pass --force")
        plan = RigPartApply(index, part, device, knob, result, found_by)
        _checked_request(backend, name, plan, ignore_unsafe)
        warnings += [f"{where} on {device.id}: {w}" for w in result.warnings]
        if result.match is not Match.SAME_CARD:
            warnings.append(f"{where} on {device.id}: {result.reason} (--force)")
        warnings += [f"{where} on {device.id}: {w}" for w in _unapplied_fields(part, knob, backend)]
        warnings += filter(None, [evidence.apply_warning(part, where)])
        planned.append(plan)
    if not any(p.device is not None for p in planned):
        raise UsageError(f"none of the cards of {name!r} is in this machine; nothing was applied",
                         "check `tuner list`")
    warnings += other_tools.warnings_for(backend, [p.device.id for p in planned if p.device is not None])
    return RigApply(profile, tuple(planned), tuple(warnings))


def _checked_request(backend: Backend, name: str, part: RigPartApply, ignore_unsafe: bool) -> SetRequest:
    """The part's `set` request once `check_setting` passed; a refusal names the part (RigPartError)."""
    request = part.set_request(ignore_unsafe=ignore_unsafe)
    try:
        check_setting(backend, request)
    except TunerError as e:
        raise RigPartError.of(e, part.where(name)) from None
    return request


class RigPartError(TunerError):
    """A part of a rig profile was refused (nothing was applied). Names the part; exit code: the cause's."""

    @classmethod
    def of(cls, cause: TunerError, where: str, tail: str = "; nothing was applied") -> RigPartError:
        return cls(f"{where}: {cause.message}{tail}", cause.remedy, exit_code=cause.exit_code)


class RigApplyFailed(RigPartError):
    """A part could not be applied; the cards applied before it were put back first."""


class RigChange(Countdown):
    """Every part of a rig profile as one keep-or-revert change: one timeout for the whole rig, and a revert puts
    every card back. It has the interface `keep_or_revert` uses (`with`, keep, expired, seconds_left, kept).

    Applying goes card by card (lock clock, value, read back); when one fails, the cards already applied are
    reverted before the error (RigApplyFailed, with the cause's exit code) is raised. Each card's writer lock is
    taken before the first write and held until the change is kept or reverted."""

    def __init__(self, backend: Backend, plan: RigApply, requests: list[tuple[RigPartApply, SetRequest]], *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, clock: Callable[[], float] = time.monotonic,
                 purpose: str | None = None):
        self.backend, self.plan, self.requests, self.timeout_s, self.clock = backend, plan, requests, timeout_s, clock
        # every card's lock first: a card someone else is changing refuses the rig before any write (the locks
        # taken are released); else they are held until the change is kept or reverted
        with contextlib.ExitStack() as taken:
            self._locks = [taken.enter_context(CardLock(r.device_id, purpose)) for _p, r in requests]
            taken.pop_all()
        # a part that sets a lock clock (NVIDIA) reverts to the lock its card had, as `set --lock-mhz` does
        self.changes = [PendingChange(backend, r.device_id, r.value, timeout_s=timeout_s, clock=clock, lock=lock,
                                      lock_clock_mhz=r.lock_clock_mhz)
                        for (_p, r), lock in zip(self.requests, self._locks, strict=True)]
        self.kept = False

    @property
    def applied(self) -> dict[str, Knob]:
        return {c.device_id: c.applied for c in self.changes if c.applied is not None}

    applied_by_card = applied  # the name PendingChange answers to as well

    @property
    def device_ids(self) -> tuple[str, ...]:
        return tuple(c.device_id for c in self.changes)

    @property
    def reverted_to(self) -> dict[str, Knob]:
        return {c.device_id: c.reverted_to for c in self.changes if c.reverted_to is not None}

    @property
    def restore_notes(self) -> dict[str, str]:
        return {d: note for c in self.changes for d, note in c.restore_notes.items()}

    @property
    def pending(self) -> bool:
        return any(c.pending for c in self.changes)

    def apply(self) -> dict[str, Knob]:
        for (part, _request), change in zip(self.requests, self.changes, strict=True):
            try:
                change.apply()  # the lock clock first; one the value did not take is put back
            except BaseException as e:
                done = [c.device_id for c in self.changes if c.pending]
                for unapplied, lock in zip(self.changes, self._locks, strict=True):
                    if unapplied.applied is None:  # never applied: it no longer needs its card
                        lock.release()
                self.revert()
                if not isinstance(e, TunerError):
                    raise
                back = f"; {', '.join(done)} put back as before" if done else ""
                raise RigApplyFailed.of(e, part.where(self.plan.profile.name), back) from e
        self._deadline = self.clock() + self.timeout_s
        return self.applied

    def keep(self) -> None:
        if not self.pending:
            raise RuntimeError("nothing pending to keep")
        for change in self.changes:
            change.keep()
        self.kept = True

    def revert(self) -> dict[str, Knob]:
        """Put every applied card back (each is tried even when another fails; the first failure is raised)."""
        error: BaseException | None = None
        for change in self.changes:
            if change.pending:
                try:
                    change.revert()
                except BaseException as e:  # noqa: BLE001 - the other cards are still put back
                    error = error or e
        if error is not None:
            raise error
        return self.reverted_to

    def __enter__(self) -> RigChange:
        if not self.applied:
            self.apply()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pending:
            self.revert()


def prepare_rig_apply(backend: Backend, plan: RigApply, *, ignore_unsafe: bool = False,
                      timeout_s: float = DEFAULT_TIMEOUT_S, purpose: str | None = None,
                      clock: Callable[[], float] = time.monotonic) -> RigChange:
    """The whole rig as one keep-or-revert change, not yet applied (each card checked again, its lock taken).
    `clock`: monotonic seconds for the countdown (the UI's tests move it by hand)."""
    # checked again: the card may have changed since the plan
    requests = [(p, _checked_request(backend, plan.profile.name, p, ignore_unsafe)) for p in plan.to_apply]
    return RigChange(backend, plan, requests, timeout_s=timeout_s, clock=clock,
                     purpose=purpose or f"tuner apply {plan.profile.name}")
