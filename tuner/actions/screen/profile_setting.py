"""`tuner screen --profile NAME`: which setting each selected card is screened at, checked as `tuner apply` checks it.

`plan_profile_screen` runs the apply action's own checks (`tuner.actions.profile_apply.plan_profile_apply`: the
identity rules, vendor and knob kind, the card's range, step and no overvolt, a damaged safety state; then the
unsafe list, `tuner.tuning.journal.refuse_unsafe`) for every card before anything is written to any of them, and
refuses the whole screen on the first card that fails one, naming it. The policy is apply's with the screen as its
verify trial: the card the profile was proven on and other cards of its model are screened (another card of the
model is what a screen is for); another model is refused (a screen has no --force: the value was never proven on
that silicon, and its reference would not compare); the unsafe list is never overridden (a screen has no
--ignore-unsafe).

Nothing here writes: the setting is applied by the card's screen (`card.CardScreen`) as a keep-or-revert change it
owns for the screen's duration and always reverts (docs/screen.md, "At a profile's setting").
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.actions.profile_apply import plan_profile_apply
from tuner.backends.base import Backend
from tuner.core.errors import TunerError, UsageError
from tuner.profiles import Profile
from tuner.profiles.identity import Match
from tuner.tuning import journal


@dataclass(frozen=True)
class ProfileSetting:
    """The setting one card is screened at, from profile `name`: `value`, and NVIDIA's locked max clock to set
    first (None: leave the lock as it is). `warnings`: what apply would warn about, said before the screen."""

    name: str
    value: int
    lock_clock_mhz: int | None
    warnings: tuple[str, ...]

    @property
    def source(self) -> str:
        """The verdict's `setting.source`."""
        return f"profile {self.name}"


OWN_MODEL = "screen this card at a profile of its own model, or at its current setting (drop --profile)"


class ProfileRefused(TunerError):
    """The profile cannot be screened on a selected card (nothing was written, nothing run). Exit code: the
    cause's (2 for bad input)."""


def plan_profile_screen(backend: Backend, profile: Profile, device_ids: list[str]) -> dict[str, ProfileSetting]:
    """Every selected card checked against `profile` before any is written; the first refusal raised (a
    ProfileRefused naming the card, with the cause's exit code). The caller holds every card's writer lock, so the
    cards cannot change between these checks and the writes."""
    name = profile.name
    if profile.is_rig:
        raise UsageError(f"--profile {name!r} is a rig profile ({len(profile.parts)} cards): a screen at a rig's "
                         "settings is not supported; nothing was run",
                         "screen each card at its current setting (drop --profile), or export one card's part as "
                         "its own profile")
    planned: dict[str, ProfileSetting] = {}
    for device_id in device_ids:
        where = f"refusing to screen {device_id} at {name!r}"
        try:
            # force: another model is refused below in the screen's words (apply's remedy is its --force);
            # ignore_unsafe: the unsafe list is checked below with the screen's remedy (it has no --ignore-unsafe)
            plan = plan_profile_apply(backend, profile, device_id, force=True, verify=True, ignore_unsafe=True)
        except TunerError as e:
            identity = f"refusing to apply {name!r} to {device_id}: "  # another vendor or knob kind
            remedy = OWN_MODEL if e.message.startswith(identity) else e.remedy
            # apply's refusals end in '; nothing was applied': the screen says '; nothing was run' instead
            why = e.message.removeprefix(identity).removesuffix("; nothing was applied")
            raise ProfileRefused(f"{where}: {why}; nothing was run", remedy, exit_code=e.exit_code) from None
        if plan.match.match is Match.OTHER_MODEL:
            raise ProfileRefused(f"{where}: {plan.match.reason}; nothing was run", OWN_MODEL)
        try:
            journal.refuse_unsafe(device_id, plan.knob, plan.value, backend)
        except TunerError as e:
            raise ProfileRefused(f"{where}: {e.message}; nothing was run",
                                 "screen at a less aggressive profile, or at the card's current setting (drop "
                                 "--profile)", exit_code=e.exit_code) from None
        lock = plan.set_request().lock_clock_mhz
        planned[device_id] = ProfileSetting(name, plan.value, lock, plan.warnings)
    return planned


__all__ = ["ProfileRefused", "ProfileSetting", "plan_profile_screen"]
