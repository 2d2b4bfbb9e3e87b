"""`tuner apply --boot`: the rules that keep an undervolt from turning into a boot loop, and the systemd unit.

At boot the tuner applies only a profile proven on this very card, and skips applying (saying why) when:
- the kernel command line holds `tuner.reset` (the escape hatch when a setting crashes the machine early), or
- the tuning journal shows a trial still open when the previous boot ended: that boot probably died testing a
  setting, so nothing is re-applied until someone looks (control.md section 6, items 1 and 10).
Log lines go to stderr; under systemd, stderr is captured by the journal (`journalctl -u tuner-apply`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tuner.core import kernel_files, paths, root_owned, system_units
from tuner.core.errors import UsageError

UNIT_NAME = system_units.APPLY_UNIT
RESUME_UNIT_NAME = system_units.RESUME_UNIT
RESET_FLAG = system_units.RESET_FLAG
DEFAULT_DISCOVERY_WAIT_S = 30.0
DISCOVERY_INTERVAL_S = 3.0  # LACT retries 5 times at 3 s; amdgpu can take seconds to load firmware


def log(message: str) -> None:
    """One line to stderr, which systemd stores in the journal for this unit."""
    print(f"tuner: boot: {message}", file=sys.stderr, flush=True)


def systemd_dir() -> Path:
    return Path(os.environ.get("TUNER_SYSTEMD_DIR", "/etc/systemd/system"))


def unit_path() -> Path:
    return systemd_dir() / UNIT_NAME


def resume_unit_path() -> Path:
    return systemd_dir() / RESUME_UNIT_NAME


def user_writable_system_path() -> tuple[Path, str] | None:
    """As root: the first path a user other than root can change (tuner.core.root_owned) among the system profiles
    folder (every file below it too) and the sysfs root, with every directory above each; None when all are
    root's, or when not running as root (nothing is read as root then). TUNER_SYSTEM_PROFILES and TUNER_SYSFS_ROOT
    are pinned from the installer's environment into the root units (system_units.pinned_environment)."""
    if os.geteuid() != 0:
        return None
    return root_owned.first_writable([paths.sysfs_root()], recursive=[paths.system_profiles_dir()])


def refuse_user_writable_system_paths(doing: str, nothing: str) -> None:
    """UsageError (exit 2, one line naming the path) when `user_writable_system_path` finds one: root would read
    profiles (or write a card's files) that someone else can change."""
    found = user_writable_system_path()
    if found is not None:
        path, why = found
        raise UsageError(f"refusing to {doing}: {path} is {why}, and the boot service reads the system profiles "
                         f"({paths.system_profiles_dir()}) and the cards' files (under {paths.sysfs_root()}) as "
                         f"root; whoever can change it would choose what root applies; {nothing}",
                         "use a folder owned by root and writable by root alone, above it too (the defaults: "
                         "unset TUNER_SYSTEM_PROFILES and TUNER_SYSFS_ROOT)")


def reset_requested() -> bool:
    """True when the kernel command line has `tuner.reset` (or `tuner.reset=1`) as a word."""
    try:
        cmdline = kernel_files.read_text(paths.sysfs_root() / "proc/cmdline")
    except OSError:
        return False
    return any(word == RESET_FLAG or word.startswith(RESET_FLAG + "=") for word in cmdline.split())


def skip_reason() -> str | None:
    """Why this boot must not apply anything, or None."""
    if reset_requested():
        return f"the kernel command line contains {RESET_FLAG}; leaving the cards at stock"
    from tuner.tuning import journal

    trial = journal.trial_open_at_previous_boot()  # the trial a previous boot left open: the journal owns the rule
    if trial is not None:
        what = trial.get("reason") or "a tuning trial was still open when the previous boot ended"
        where = trial.get("journal") or paths.state_dir() / "journal"
        detail = ", ".join(f"{k} {trial[k]}" for k in ("device", "setting", "phase") if trial.get(k) is not None)
        return (f"{what}{f' ({detail})' if detail else ''}; that setting may have crashed the machine, so nothing "
                f"is applied. Resume or finish the tuning run with `tuner bisect`, or remove its journal in {where}, "
                "to re-enable")
    return None


B = TypeVar("B")  # whatever backend type open_backend returns


def discover(
    open_backend: Callable[[], B],
    ready: Callable[[B], bool],
    *,
    wait_s: float,
    interval_s: float = DISCOVERY_INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> B | None:
    """Open the backend until `ready(backend)` or `wait_s` has passed (the driver may still be probing).

    Returns the last backend opened (ready or not); re-raises the last error if none could be opened.
    """
    deadline = clock() + wait_s
    while True:
        error = None
        backend = None
        try:
            backend = open_backend()
            if ready(backend):
                return backend
        except Exception as e:  # noqa: BLE001 - any discovery failure is retried, then re-raised
            error = e
        if clock() + interval_s > deadline:
            if backend is None and error is not None:
                raise error
            return backend
        log(f"waiting for the GPU driver ({error.args[0] if error else 'card not found yet'}); "
            f"retrying in {interval_s:g} s")
        if backend is not None and hasattr(backend, "close"):
            backend.close()
        sleep(interval_s)
