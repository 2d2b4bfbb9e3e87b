"""Opening the tuner's own files (its state directory, the simulated cards) so that nobody else can steer a write.

The tuner may run as root, and its state holds files it truncates and appends to (card locks, journals, the
unsafe list). A link planted at one of those paths would turn such a write into a write to any file on the
machine. So, for every path under a *trusted root* (`paths.state_dir()`, `paths.simulated_dir()`):

- every directory from the root down to the file must be a directory owned by the user running the tuner and not
  writable by anyone else (group-writable is accepted only for the user's private group, the usual umask-002
  set-up: a group of the user's own name that is their primary group). Then no other user can plant or swap an
  entry there between our check and our open. Missing directories are created with mode 0700;
- below the root no directory may be a symbolic link (the root itself may be: it is where the user chose to keep
  the state), and a file is opened with O_NOFOLLOW and must be a regular file.
- as root, the root (a link there and what it points to) and every directory above it must be root's alone
  (`tuner.core.root_owned`): the boot and resume units pin the installer's state folder, and a user who can change
  it, or a directory above it, could plant a link there or swap it between our check and our write.

A refusal is an `UnsafeStatePath` (an OSError, so every caller that already turns a failed state write into one
line keeps doing so) whose message names the path and the fix. Paths outside the trusted roots (a report the user
names, a profile export) are the user's to choose and are not checked here.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
from pathlib import Path

from tuner.core import paths, root_owned
from tuner.core.kernel_files import read_at_most


class UnsafeStatePath(OSError):
    """A state path the tuner will not write through (a link, a foreign owner, writable by others)."""

    def __init__(self, path: Path | str, problem: str, remedy: str):
        super().__init__(errno.EPERM, f"{problem}; {remedy}", str(path))
        self.path = Path(path)
        self.problem = problem
        self.remedy = remedy

    def __str__(self) -> str:
        return f"{self.path} {self.problem}; {self.remedy}"


def trusted_root(path: Path) -> Path | None:
    """The trusted root `path` lies under (the state directory or the simulated cards' directory), else None."""
    path = Path(path)
    for root in (paths.state_dir(), paths.simulated_dir()):
        if path == root or path.is_relative_to(root):
            return root
    return None


def user_name(uid: int) -> str:
    """`uid`'s login name, or `uid N` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _private_group(gid: int, uid: int) -> bool:
    """The user's own group (same name, their primary group): group-writable there means writable by them."""
    try:
        user = pwd.getpwuid(uid)
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return user.pw_gid == gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _check_dir_stat(path: Path, st: os.stat_result) -> None:
    uid = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStatePath(path, "is not a directory", "move it aside; the tuner recreates its directories")
    if st.st_uid != uid:
        raise UnsafeStatePath(
            path, f"belongs to {user_name(st.st_uid)}, not to {user_name(uid)} who runs the tuner",
            "point XDG_STATE_HOME at a directory of your own (under sudo: run `sudo -i` or unset it), or chown it")
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not _private_group(st.st_gid, uid)):
        raise UnsafeStatePath(path, f"is writable by other users (mode {mode:04o})", f"run `chmod go-w {path}`")


def _refuse_what_others_can_change_above(root: Path) -> None:
    """As root: the trusted root, a link there and what it points to, and every directory above them, must be
    root's alone (`root_owned.first_writable`). Whoever can change one of them (the installer's state folder the
    boot and resume units pin, `~/.local/state` above it) could plant a link there, or swap the folder between our
    check and our write, and turn root's writes into writes to any file on the machine."""
    found = root_owned.first_writable([root])
    if found is not None:
        where, why = found
        raise UnsafeStatePath(
            root, f"is reached through {where}, which is {why}, and the tuner runs as root: whoever can change it "
            "could point root's writes anywhere", "as root, keep the state in a folder only root can change, above "
            "it too (run `sudo -i`, or unset XDG_STATE_HOME; the units: `sudo tuner service install` again)")


def check_dir(directory: Path) -> None:
    """Refuse (UnsafeStatePath) when an existing directory from `directory`'s trusted root down to it is a link
    (below the root), not a directory, not the running user's, or writable by others. Paths outside the trusted
    roots are not checked."""
    directory = Path(directory)
    root = trusted_root(directory)
    if root is None:
        return
    try:
        st = os.stat(root)  # the root may be a link: following it is the user's own choice of place
    except FileNotFoundError:
        return
    _check_dir_stat(root, st)
    if os.geteuid() == 0:
        _refuse_what_others_can_change_above(root)
    current = root
    for part in directory.relative_to(root).parts:
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeStatePath(current, "is a symbolic link", "remove the link; the tuner recreates its directories")
        _check_dir_stat(current, st)


def ensure_dir(directory: Path) -> Path:
    """Create `directory` (mode 0700 for the tuner's own directories) and check it as `check_dir` does."""
    directory = Path(directory)
    root = trusted_root(directory)
    if root is None:
        directory.mkdir(parents=True, exist_ok=True)
        return directory
    check_dir(directory)
    if not root.exists():
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    current = root
    for part in directory.relative_to(root).parts:
        current = current / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(current, 0o700)
    check_dir(directory)  # a race lost to another writer of ours is fine; anything else is refused here
    return directory


def open_regular(path: Path, flags: int, mode: int = 0o600, *,
                 link_remedy: str = "remove the link (its target was not touched)") -> int:
    """`os.open` that follows no link and cannot block on a FIFO, refused (UnsafeStatePath) unless `path` is a
    regular file; the descriptor is returned in blocking mode."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeStatePath(path, "is a symbolic link", link_remedy) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeStatePath(path, "is not a regular file", "move it aside")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(path: Path, flags: int, mode: int = 0o600) -> int:
    """`os.open` for a file in the tuner's state: the directory made and checked, the file opened without
    following a link, and refused unless it is a regular file of the running user's. Returns the descriptor."""
    path = Path(path)
    ensure_dir(path.parent)
    fd = open_regular(path, flags, mode)
    try:
        st = os.fstat(fd)
        if trusted_root(path) is not None and st.st_uid != os.geteuid():
            raise UnsafeStatePath(path, f"belongs to {user_name(st.st_uid)}", "move it aside")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(path: Path, max_bytes: int) -> bytes:
    """A state file's bytes, read without following a link, only when it is a regular file (a FIFO or a device
    node there would hang the read or never end) and at most `max_bytes` long (UnsafeStatePath beyond);
    FileNotFoundError when there is none."""
    fd = open_regular(path, os.O_RDONLY, link_remedy="remove the link; the tuner does not follow one")
    try:
        data = read_at_most(fd, max_bytes)
        if len(data) > max_bytes:
            raise UnsafeStatePath(path, f"is larger than {max_bytes} bytes", "move it aside")
        return data
    finally:
        os.close(fd)
