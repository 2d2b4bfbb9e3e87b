"""How strong a profile's evidence is, in the words every view of it uses (`tuner profile show`, the Profiles
screen, `tuner apply`): a part whose search or any trial was compared with tolerances (`tuner bisect
--tolerance`; the TOML records `sensitivity = "reduced"`) is "sensitivity reduced (--tolerance)". Someone importing
the file on another machine must be able to tell. One rule, one place; no textual, no torch.
"""

from __future__ import annotations

from tuner.profiles.schema import Profile, ProfilePart
from tuner.tuning.sensitivity import BITWISE_CAUGHT_PCT, TOLERANCE_CAUGHT_PCT

REDUCED = "sensitivity reduced (--tolerance)"
WORDS = {"reduced": REDUCED, "full": "full sensitivity (bit for bit)", None: "sensitivity not recorded"}
REDUCED_COST = (f"its trials were compared with tolerances, which catch {TOLERANCE_CAUGHT_PCT:g} % of consequential "
                f"single-bit flips on their own step, against {BITWISE_CAUGHT_PCT:g} % bit for bit")


def sensitivity(part: Profile | ProfilePart) -> str | None:
    """"reduced" when the part's search or any of its trials used a tolerance, "full" when what it recorded was
    compared bit for bit, None when it recorded neither (no bisect evidence, or a file from before the record)."""
    t = part.tuning
    if t is None:
        return None
    recorded = {t.sensitivity, *(trial.sensitivity for trial in t.trials)} - {None}
    return "reduced" if "reduced" in recorded else "full" if recorded else None


def profile_sensitivity(profile: Profile) -> str | None:
    """The weakest of its parts': "reduced" when any part is."""
    recorded = {sensitivity(part) for part in profile.parts} - {None}
    return "reduced" if "reduced" in recorded else "full" if recorded else None


def strength(part: Profile | ProfilePart, *, why: bool = False) -> str | None:
    """The words for the part's evidence (None: it has none); `why`: with what a tolerance costs."""
    if part.tuning is None:
        return None
    level = sensitivity(part)
    return f"{REDUCED}: {REDUCED_COST}" if why and level == "reduced" else WORDS[level]


def apply_warning(part: ProfilePart, who: str) -> str | None:
    """What `tuner apply` (CLI and UI) says before it applies a part proven with a tolerance; `who` names it."""
    return f"{who} was proven with {REDUCED}: {REDUCED_COST}" if sensitivity(part) == "reduced" else None
