"""Profiles: a proven setting with its evidence, bound to the card it was proven on (TOML; schema 1 for one card,
schema 2 for a rig of cards, one part per card).

Core code: no UI toolkit, no torch. The CLI commands `tuner profile`, `tuner apply` and `tuner service` and the
bisect's `--save` go through this facade.
"""

from tuner.profiles.build import RigPart, build_profile, build_rig_profile
from tuner.profiles.schema import SCHEMA_VERSION, Profile, ProfileError, ProfilePart, validate_name
from tuner.profiles.store import delete_profile, list_profiles, load_profile, save_profile

__all__ = [
    "SCHEMA_VERSION",
    "Profile",
    "ProfileError",
    "ProfilePart",
    "RigPart",
    "build_profile",
    "build_rig_profile",
    "delete_profile",
    "list_profiles",
    "load_profile",
    "save_profile",
    "validate_name",
]
