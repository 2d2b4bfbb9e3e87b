"""Where the tuner keeps things (XDG base directories, honoured when set) and where it reads sysfs."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from tuner.core.errors import UsageError


def _home() -> Path:
    """$HOME when it is absolute, else the account's home from the password database (as with no HOME at all): a
    relative or empty HOME would put the state, the unsafe list and the trial journals included, relative to the
    current directory, so two commands run from two directories would not see the same ones."""
    home = os.environ.get("HOME", "")
    if os.path.isabs(home):
        return Path(home)
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        raise UsageError("HOME is not an absolute path and this user has no home directory in the password "
                         "database", "set HOME (or XDG_CONFIG_HOME, XDG_STATE_HOME) to an absolute path") from None


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    # The spec says relative paths are invalid and must be ignored.
    return Path(value) if value and os.path.isabs(value) else _home() / fallback


def config_dir() -> Path:
    """`$XDG_CONFIG_HOME/tuner`: user profiles."""
    return _xdg("XDG_CONFIG_HOME", ".config") / "tuner"


def state_dir() -> Path:
    """`$XDG_STATE_HOME/tuner`: tuning journals, the unsafe list, card locks and records."""
    return _xdg("XDG_STATE_HOME", ".local/state") / "tuner"


def simulated_dir() -> Path:
    """`$XDG_STATE_HOME/tuner-simulated`: the simulated cards' settings (one file per card).

    Beside the state directory, not in it: a simulated card stands for hardware, and returning a card to stock
    never depends on the tuner's own records (a read-only or full state directory stops a real card's reset no
    more than it stops this one's)."""
    return _xdg("XDG_STATE_HOME", ".local/state") / "tuner-simulated"


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/tuner`: things that can be rebuilt (the engine's tokenizer, compiled kernels)."""
    return _xdg("XDG_CACHE_HOME", ".cache") / "tuner"


def user_profiles_dir() -> Path:
    return config_dir() / "profiles"


def system_profiles_dir() -> Path:
    """Profiles the boot service applies; written only as root."""
    return Path(os.environ.get("TUNER_SYSTEM_PROFILES") or "/etc/tuner/profiles")  # empty: unset, as the others


DEFAULT_SYSTEM_STATE_DIR = "/var/lib/tuner"
DEFAULT_HELPER_SOCKET = "/run/tuner/helper.sock"


def system_state_dir() -> Path:
    """The machine's one safety state, owned by the root helper (`tuner-helper --state-dir`): the unsafe list, the
    open-trial journal and the helper's own write journal, keyed by card. `TUNER_STATE_DIR` moves it (tests)."""
    return Path(os.environ.get("TUNER_STATE_DIR") or DEFAULT_SYSTEM_STATE_DIR)


def helper_socket() -> tuple[Path, bool]:
    """Where the root helper listens, and whether the user chose it: `$TUNER_HELPER_SOCKET` (chosen), else
    `/run/tuner/helper.sock` (the systemd socket unit's path)."""
    chosen = os.environ.get("TUNER_HELPER_SOCKET")
    return (Path(chosen), True) if chosen else (Path(DEFAULT_HELPER_SOCKET), False)


def sysfs_root() -> Path:
    """Root under which `/sys` and `/proc` are read: `TUNER_SYSFS_ROOT` lets tests and dry runs use a fake tree."""
    return Path(os.environ.get("TUNER_SYSFS_ROOT") or "/")  # empty is unset: Path("") would be the current directory
