"""Is this code only root's to change? A unit that runs as root at every boot must not run anything another user
can write: whoever can write the interpreter, the package, a directory on its import path or any directory above
them gets root at the next boot (`tuner service install` refuses; docs/install.md).

A path may be changed by a non-root user when it is owned by one (the owner can always chmod), writable by a group
other than root's, or writable by everyone. A world-writable directory with the sticky bit (/tmp) is accepted
above the code only: there nobody but an entry's owner may rename or delete it. POSIX ACLs are not read (os.stat
does not show them); a directory with an ACL granting writes shows `+` in `ls -l`. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def why_writable(path: Path, *, above_code: bool = False) -> str | None:
    """Why a non-root user can change `path` itself (not following a final symlink), or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if st.st_uid != 0:
        return f"owned by {_owner(st.st_uid)}"
    if stat.S_ISLNK(st.st_mode):  # a link's own mode is always 0777 and means nothing; its directory decides
        return None
    if st.st_mode & stat.S_IWGRP and st.st_gid != 0:
        return f"writable by group {st.st_gid}"
    if st.st_mode & stat.S_IWOTH:
        if above_code and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
            return None
        return "writable by everyone"
    return None


def _chain(path: Path) -> list[Path]:
    """`path` and every directory above it, from / down; through a symlink (at its end or any directory on the
    way), the real path's chain too: whoever can change a directory above the link's target can swap the code."""
    path = Path(os.path.abspath(path))
    out = [*reversed(path.parents), path]
    real = path.resolve()
    if real != path:
        out += _chain(real)
    return out


def first_writable(code: Iterable[Path], *, recursive: Sequence[Path] = ()) -> tuple[Path, str] | None:
    """The first path, highest first, that a non-root user can change: each of `code` with every directory above
    it; and every file and directory below each of `recursive` (the package itself; a link there, with what it
    points to and every directory above that). None: all root's."""
    seen: set[Path] = set()
    for target in [*code, *recursive]:
        chain = _chain(target)
        for i, path in enumerate(chain):
            if path in seen:
                continue
            seen.add(path)
            why = why_writable(path, above_code=i < len(chain) - 1)
            if why:
                return path, why
    for top in recursive:
        for dirpath, dirnames, filenames in os.walk(top):
            for name in (*dirnames, *filenames):
                path = Path(dirpath) / name
                why = why_writable(path)
                if why:
                    return path, why
                if path.is_symlink():  # its own owner and mode mean nothing: what it points to runs
                    found = first_writable([path])
                    if found:
                        return found
    return None


def import_code() -> tuple[list[Path], list[Path]]:
    """What `PYTHON -P -m tuner` runs: (the interpreter and each directory on its import path, with the entries
    directly inside those directories (a `.pth` file there runs at start-up)), and the package tree itself."""
    import tuner

    code = [Path(sys.executable)]
    for entry in sys.path[1:]:  # [0]: this process's start directory
        directory = Path(entry)
        if not entry or not directory.is_dir():
            continue
        code.append(directory)
        with contextlib.suppress(OSError):
            code += sorted(directory.iterdir())
    return code, [Path(tuner.__file__).parent]
