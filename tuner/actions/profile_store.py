"""The profile store as the front ends reach it: list, load, save, delete, import and export profile files.

The store itself (where profiles live, how a file is read and written safely) is tuner.profiles.store; the CLI's
`profile`, `apply`, `screen` and `bisect --save`, and the UI's Profiles and Bisect screens, reach it only through
this module (the import contract `front-ends-through-actions` in pyproject.toml). The UI calls these from thread
workers: every one of them reads or writes a file.
"""

from __future__ import annotations

from pathlib import Path

from tuner.profiles.schema import Profile
from tuner.profiles.store import (
    delete_profile,
    find_in_store,
    is_system,
    list_profiles,
    load_profile,
    read_profile_file,
    save_profile,
    scan,
    write_profile_file,
)

__all__ = ["delete_profile", "export_profile", "find_in_store", "import_profile", "is_system", "list_profiles",
           "load_profile", "read_profile_file", "save_profile", "scan", "write_profile_file"]


def import_profile(path: Path) -> Profile:
    """Read a profile file from anywhere, validated before it is stored, and save it in the user's store (refused
    if one of that name is there already)."""
    profile = read_profile_file(Path(path).expanduser())
    save_profile(profile)
    return profile


def export_profile(profile: Profile, path: Path) -> Path:
    """Write `profile` to a path the user chose (never replacing a file there); returns where it went."""
    return write_profile_file(profile, Path(path).expanduser())
