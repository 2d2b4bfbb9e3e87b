"""Who runs the stress engine: never root.

The engine is a multi-gigabyte framework that compiles kernels and reads caches; nothing it does needs root. The
rule, decided once here and applied where the engine is spawned (`tuner.tuning.engine_spawn`):

- not root: the engine runs as this user (nothing changes);
- root through sudo (`SUDO_UID` set and not 0): as that user, with their primary group, their supplementary
  groups (membership of `render`/`video` is what opens `/dev/kfd` and `/dev/dri/renderD*`), their home and caches;
- root without sudo (a root shell, a unit): as `TUNER_ENGINE_USER` when set, else the system user `tuner-engine`
  when it exists; else a real card is refused with the remedy. A simulated card is the exception: its engine runs
  on the CPU, touches no hardware and reads only the tuner's own files, so it runs as the process that asked
  (docs/helper.md says why; the test suite and CI run as root without sudo).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass

from tuner.core.errors import UsageError

ENGINE_SYSTEM_USER = "tuner-engine"
# root's own directories: the engine gets the user's (their defaults under HOME) instead
_ROOT_ONLY_VARIABLES = ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR")


@dataclass(frozen=True)
class EngineIdentity:
    """An unprivileged account to run the engine as (subprocess.Popen's user, group and extra_groups)."""

    uid: int
    gid: int
    extra_groups: tuple[int, ...]
    user: str
    home: str

    def environ(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` with this account's HOME, USER and LOGNAME, and without root's XDG directories."""
        out = {k: v for k, v in env.items() if k not in _ROOT_ONLY_VARIABLES}
        out.update(HOME=self.home, USER=self.user, LOGNAME=self.user)
        return out


@dataclass(frozen=True)
class EngineRefused:
    """No unprivileged account to run the engine as: the spawn raises PermissionDenied with this remedy."""

    reason: str
    remedy: str


def sudo_uid(env: Mapping[str, str] | None = None) -> int | None:
    """The uid sudo started this process for (`SUDO_UID`); None when it is unset, empty or 0. Anything but ASCII
    digits is a UsageError: sudo writes a whole number, and a value set by hand is not guessed at (int() takes
    " 5", "-1" and "\u00b2" is a digit to str.isdigit, but not to int())."""
    value = (os.environ if env is None else env).get("SUDO_UID", "")
    if not value:
        return None
    if not (value.isascii() and value.isdigit()):
        raise UsageError(f"SUDO_UID={value!r} is not a uid", "unset it, or start this through sudo")
    return int(value) or None


def identity_of(user: str | int, gid: int | None = None) -> EngineIdentity:
    """The account named by `user` (a name or a uid), with `gid` (default: its primary group) and every group
    the account belongs to. Raises KeyError when there is no such account."""
    entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
    primary = entry.pw_gid if gid is None else gid
    groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, primary)) - {primary}))
    return EngineIdentity(entry.pw_uid, primary, groups, entry.pw_name, entry.pw_dir)


def engine_identity(*, simulated: bool, euid: int | None = None,
                    env: Mapping[str, str] | None = None) -> EngineIdentity | EngineRefused | None:
    """Who the engine runs as; None: as this process (it is not root, or the card is simulated, see above)."""
    euid = os.geteuid() if euid is None else euid
    env = os.environ if env is None else env
    if euid != 0:
        return None
    try:
        sudo = sudo_uid(env)
    except UsageError as e:
        return EngineRefused(f"the stress engine must not run as root, and {e.message}", e.remedy or "")
    if sudo is not None:
        sudo_gid = env.get("SUDO_GID", "")
        try:
            return identity_of(sudo, int(sudo_gid) if sudo_gid.isascii() and sudo_gid.isdigit() else None)
        except KeyError:
            return EngineRefused(f"the stress engine must not run as root, and SUDO_UID {sudo} has no account",
                                 "run the tuner from your own account through sudo, or set TUNER_ENGINE_USER")
    chosen = env.get("TUNER_ENGINE_USER", "")
    for name in ((chosen,) if chosen else (ENGINE_SYSTEM_USER,)):
        try:
            # ASCII digits only, as SUDO_UID (sudo_uid): "\u00b2" is a digit to str.isdigit, not to int()
            identity = identity_of(int(name) if name.isascii() and name.isdigit() else name)
        except KeyError:
            if chosen:
                return EngineRefused(f"TUNER_ENGINE_USER={chosen} names no account",
                                     "set it to an unprivileged user, or run the tuner through sudo")
            continue
        if identity.uid == 0:
            return EngineRefused(f"TUNER_ENGINE_USER={name} is root", "name an unprivileged user")
        return identity
    if simulated:
        return None
    return EngineRefused(
        "the stress engine must not run as root, and no unprivileged account is known (not started through sudo)",
        f"run `sudo tuner ...` from your own account, set TUNER_ENGINE_USER=<user>, or create the system user "
        f"{ENGINE_SYSTEM_USER} with a home for its caches (`useradd --system --create-home --home-dir "
        f"/var/lib/{ENGINE_SYSTEM_USER} {ENGINE_SYSTEM_USER}`)")
