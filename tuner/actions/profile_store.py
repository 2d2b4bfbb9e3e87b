"""The profile store as the front ends reach it: list, load, save, delete, import and export profile files.

The store itself (where profiles live, how a file is read and written safely) is tuner.profiles.store; the CLI's
`profile`, `apply`, `screen` and `bisect --save`, and the UI's Profiles and Bisect screens, reach it only through
this module (the import contract `front-ends-through-actions` in pyproject.toml). The UI calls these from thread
workers: every one of them reads or writes a file.
"""

from __future__ import annotations

import os
from pathlib import Path

from tuner.core.errors import UsageError
from tuner.profiles import reference_bundle
from tuner.profiles.reference_bundle import Bundle
from tuner.profiles.schema import Profile
from tuner.profiles.store import delete_profile as _delete_file
from tuner.profiles.store import (
    find_in_store,
    is_system,
    list_profiles,
    load_profile,
    profile_path,
    read_profile_file,
    save_profile,
    scan,
    write_profile_file,
)

Bundled = tuple[Bundle, Path, int]  # a stock reference beside a profile: the bundle, its path, its size

__all__ = ["Bundled", "delete_profile", "export_profile", "find_in_store", "import_profile", "is_system",
           "list_profiles", "load_profile", "read_profile_file", "save_profile", "scan", "write_profile_file"]


def import_profile(path: Path, *, name: str | None = None, overwrite: bool = False,
                   system: bool = False) -> tuple[Profile, Path, Bundled | None]:
    """Read a profile file from anywhere, validated before it is stored, and save it in a store (refused if one of
    that name is there already, unless `overwrite`), with the stock reference beside it (`NAME.ref`, docs/screen.md)
    when there is one. Both are checked before anything is stored; a replaced profile's old reference goes.
    Returns the profile, where it went, and the reference as stored."""
    path = Path(path).expanduser()
    profile = read_profile_file(path)  # validated (and never through a symlink) before storing
    bundled = reference_bundle.reference_beside(path)  # checked before anything is stored
    if name is not None:
        profile = profile.renamed(name)
    if bundled is not None:
        reference_bundle.check_beside(profile_path(profile.name, system=system))  # before the profile
    stored = save_profile(profile, overwrite=overwrite, system=system)
    if bundled is None:
        reference_bundle.remove_beside(stored)  # a replaced profile's old reference is not this one's
        return profile, stored, None
    ref_path, size = reference_bundle.write_beside(bundled[0], stored, overwrite=True)
    return profile, stored, (bundled[0], ref_path, size)


def export_profile(profile: Profile, path: Path, *, overwrite: bool = False) -> tuple[Path, Bundled | None]:
    """Write `profile` to a path the user chose (never replacing a file there unless `overwrite`), with its stock
    reference beside it when the store has one (checked, and the place beside `path` too, before anything is
    written). Returns where the profile went and the reference as written."""
    path = Path(path).expanduser()
    bundled = None if profile.source is None else reference_bundle.reference_beside(profile.source)
    if bundled is not None:
        place = reference_bundle.check_beside(path)  # before the profile is written
        if not overwrite and os.path.lexists(place):
            raise UsageError(f"{place} already exists; nothing was written",
                             "pass --overwrite to replace it (and the profile)")
    written = write_profile_file(profile, path, overwrite=overwrite)
    if bundled is None:
        return written, None
    ref_path, size = reference_bundle.write_beside(bundled[0], written, overwrite=overwrite)
    return written, (bundled[0], ref_path, size)


def delete_profile(name: str, *, system: bool = False) -> tuple[Path, Path | None]:
    """Remove a stored profile and the stock reference beside it; their paths (the reference's None if none)."""
    path = _delete_file(name, system=system)
    return path, reference_bundle.remove_beside(path)
