"""What scripts/install-system.sh asks the installed tuner before it removes anything: is a bisect in progress?

`--uninstall` resets the cards and removes the program. While a bisect runs, that would pull the tuner from under a
trial and leave its card at whatever step the trial had reached, so it refuses (exit 6, one line naming the
bisect). A bisect is found by its process (`tuner bisect`, `python -m tuner bisect`; the UI's bisect shows in the
card locks instead) and by a held card lock (tuner.core.card_lock: the writer lock a bisect holds for its whole
life) in root's state directory and in every home directory's.

`python -m tuner.actions.system_install --check-idle`: exit 0 when nothing runs, else the one line and exit 6.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from tuner.core import exit_codes, kernel_files, paths, state_files

Process = tuple[int, Sequence[str]]


def _processes() -> Iterable[Process]:
    import psutil

    for proc in psutil.process_iter(["pid", "cmdline"]):
        yield proc.info["pid"], proc.info.get("cmdline") or ()


def is_bisect(cmdline: Sequence[str]) -> bool:
    """`.../tuner [options] bisect ...` or `python -m tuner [options] bisect ...`."""
    words = list(cmdline)
    for i, word in enumerate(words):
        if os.path.basename(word) == "tuner" or (word == "tuner" and i and words[i - 1] == "-m"):
            return "bisect" in words[i + 1:]
    return False


def _state_dirs() -> list[Path]:
    dirs = [paths.state_dir(), Path("/root/.local/state/tuner")]
    with contextlib.suppress(OSError):
        dirs += [home / ".local/state/tuner" for home in Path("/home").iterdir()]
    return list(dict.fromkeys(dirs))


def held_locks(state_dirs: Iterable[Path]) -> list[str]:
    """Card locks someone holds now (flock(2) refuses us), with what the lock file says of its holder."""
    held = []
    for directory in state_dirs:
        try:
            locks = sorted((directory / "locks").glob("*.lock"))
        except OSError:
            continue
        for lock in locks:
            try:  # as root, in users' directories: no link followed, no FIFO waited on (not a lock file either)
                fd = state_files.open_regular(lock, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                text = kernel_files.read_at_most(fd, 160).decode(errors="replace").strip()[:160]
                held.append(f"{lock} ({text or 'holder not named'})")
            finally:
                os.close(fd)
    return held


def busy(processes: Iterable[Process] | None = None, state_dirs: Iterable[Path] | None = None) -> str | None:
    """What is in progress (a bisect process, a held card lock), or None."""
    me = os.getpid()
    for pid, cmdline in (_processes() if processes is None else processes):
        if pid != me and is_bisect(cmdline):
            return f"a bisect is in progress (pid {pid}: {' '.join(cmdline)[:120]})"
    held = held_locks(_state_dirs() if state_dirs is None else state_dirs)
    return f"a card is held by a running tuner ({held[0]})" if held else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--check-idle"]:
        print("usage: python -m tuner.actions.system_install --check-idle", file=sys.stderr)
        return exit_codes.USAGE
    what = busy()
    if what is None:
        return exit_codes.OK
    print(f"install-system.sh: error: {what}: uninstalling now would leave its card at the trial's setting; nothing "
          "was removed; let it finish or stop it (Ctrl-C puts the card back), then run --uninstall again",
          file=sys.stderr)
    return exit_codes.BUSY


if __name__ == "__main__":
    sys.exit(main())
