"""Where profiles live, and safe reading and writing of profile files.

User profiles: `$XDG_CONFIG_HOME/tuner/profiles/NAME.toml`; boot profiles: `/etc/tuner/profiles/NAME.toml`
(`TUNER_SYSTEM_PROFILES` overrides). Files are read without following a symlink in the last path component (a
link planted in the store must not make the tuner read, or a later overwrite clobber, some other file), only
when they are regular files (a FIFO or /dev/zero would hang or never end), and never past the size cap.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from tuner.core import paths
from tuner.core.atomic import write_atomic
from tuner.core.errors import PermissionDenied, StateError, TunerError, UsageError, write_errors
from tuner.core.kernel_files import NotARegularFile, open_regular, read_at_most
from tuner.profiles.schema import MAX_PROFILE_BYTES, NAME_PATTERN, Profile, ProfileError, validate_name

SUFFIX = ".toml"


def store_dir(*, system: bool = False) -> Path:
    return paths.system_profiles_dir() if system else paths.user_profiles_dir()


def profile_path(name: str, *, system: bool = False) -> Path:
    return store_dir(system=system) / f"{validate_name(name)}{SUFFIX}"


def read_profile_file(path: Path) -> Profile:
    """Read and validate one file; every failure is a ProfileError (exit 2) that names the file."""
    path = Path(path)
    try:
        raw = _read_capped(path)
        return Profile.from_bytes(raw, source=path)
    except ProfileError as e:
        raise ProfileError(f"profile {path}: {e.message}", e.remedy) from None


def _read_capped(path: Path) -> bytes:
    try:
        fd = open_regular(path, follow_links=False)
    except FileNotFoundError:
        raise ProfileError("no such file") from None
    except PermissionError:
        raise PermissionDenied(f"profile {path}: permission denied", "check the file's permissions") from None
    except NotARegularFile:
        raise ProfileError("not a regular file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ProfileError("is a symbolic link; the tuner does not follow links to profiles",
                               "copy the file itself (cp -L) and use that") from None
        raise ProfileError(f"cannot open: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_size > MAX_PROFILE_BYTES:
            raise ProfileError(f"file is {st.st_size} bytes, larger than {MAX_PROFILE_BYTES // 1024} KiB; "
                               "not a profile")
        return read_at_most(fd, MAX_PROFILE_BYTES)  # up to one byte over: a file that grew after fstat is caught
    finally:
        os.close(fd)


def load_profile(name_or_path: str, *, system: bool | None = None) -> Profile:
    """A profile by store name (user store first, then the system store; `system=True`: the system store only)
    or by file path.

    One rule for `apply`, `apply --boot` and `service install`, matching `profile show`: a store name is looked
    up first (a profile imported as `abc.toml` is applied by that name, as it is shown by it), then anything that
    looks like a path (a separator or the .toml suffix) is a file; a name with a separator is only ever a path.
    `apply --boot` passes `system=True`: it runs as root with the installer's XDG_CONFIG_HOME, whose user store is
    that user's to edit, and `service install` copied the profile into the system store."""
    has_separator = "/" in name_or_path or os.sep in name_or_path
    if not has_separator and re.search(NAME_PATTERN, name_or_path):
        for sys_store in ((False, True) if system is None else (system,)):
            path = profile_path(name_or_path, system=sys_store)
            if os.path.lexists(path):
                return read_profile_file(path)
    if has_separator or name_or_path.endswith(SUFFIX):
        return read_profile_file(Path(name_or_path))
    validate_name(name_or_path, path="profile name")
    where = " in the system store" if system else " in the user store" if system is False else ""
    raise UsageError(f"no profile named {name_or_path!r}{where}",
                     "see `tuner profile list`, or give a path to a .toml file")


def find_in_store(name: str, *, system: bool | None = None) -> Path:
    """The store file for `name` (user first when `system` is None); UsageError when there is none."""
    validate_name(name, path="profile name")
    for sys_store in ((False, True) if system is None else (system,)):
        path = profile_path(name, system=sys_store)
        if os.path.lexists(path):
            return path
    where = {None: "", False: " in the user store", True: " in the system store"}[system]
    raise UsageError(f"no profile named {name!r}{where}", "see `tuner profile list`")


def save_profile(profile: Profile, *, overwrite: bool = False, system: bool = False) -> Path:
    """Write `profile` to the store as NAME.toml, atomically. Refuses to replace an existing file unless
    `overwrite`; the system store needs root (PermissionDenied otherwise)."""
    return write_profile_file(profile, profile_path(profile.name, system=system), overwrite=overwrite)


def write_profile_file(profile: Profile, path: Path, *, overwrite: bool = False) -> Path:
    path = Path(path)
    if os.path.lexists(path) and not overwrite:
        raise UsageError(f"{path} already exists; nothing was written", "pass --overwrite to replace it")
    _refuse_non_regular(path)
    data = profile.to_toml().encode("utf-8")
    with write_errors(path, refused=f"cannot write {path}"):
        try:
            write_atomic(path, data)
        except PermissionError:
            hint = "run as root (sudo)" if path.is_relative_to(paths.system_profiles_dir()) else "check its permissions"
            raise PermissionDenied(f"cannot write {path}: permission denied", hint) from None
    return path


def _refuse_non_regular(path: Path) -> None:
    """--overwrite replaces a profile we wrote, never anything else: not a symlink (its target could be any file,
    and replacing the link hides where it pointed), a device node (as root, /dev/null), a FIFO, a socket or a
    directory. Checked with lstat, so a link is seen as a link."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise StateError(f"cannot check {path}: {e.strerror}; nothing was written") from None
    if stat.S_ISREG(mode):
        return
    what = ("a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a device node" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    raise UsageError(f"{path} is {what}; nothing was written (--overwrite replaces only a regular file)",
                     "choose another path, or remove it yourself if you mean to")


def delete_profile(name: str, *, system: bool = False) -> Path:
    path = find_in_store(name, system=system)
    try:
        path.unlink()  # unlinks a symlink itself, never its target
    except PermissionError:
        raise PermissionDenied(f"cannot delete {path}: permission denied", "run as root (sudo)") from None
    return path


def scan(*, system: bool | None = None) -> tuple[list[Profile], list[tuple[Path, str]]]:
    """Every valid profile in the stores (user, then system), and (path, one-line reason) for each bad file."""
    stores = (False, True) if system is None else (system,)
    good: list[Profile] = []
    bad: list[tuple[Path, str]] = []
    for sys_store in stores:
        directory = store_dir(system=sys_store)
        try:
            entries = sorted(p for p in directory.iterdir() if p.name.endswith(SUFFIX) and not p.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError:
            bad.append((directory, "permission denied"))
            continue
        for path in entries:
            try:
                good.append(read_profile_file(path))
            except TunerError as e:  # one bad file (of any kind) never hides the others
                bad.append((path, e.one_line()))
    return good, bad


def list_profiles() -> list[Profile]:
    """Valid profiles from the user store, then the system store (bad files are skipped; see `scan`)."""
    return scan()[0]


def is_system(profile: Profile) -> bool:
    return profile.source is not None and profile.source.parent == paths.system_profiles_dir()
