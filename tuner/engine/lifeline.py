"""The engine's tie to the process that started it: when that process dies (even by SIGKILL), the engine ends.

The stress client starts the engine in its own session (so a hang can be killed as a group), which also means a
`kill -9` of the tuner leaves the engine running. Two ways back:

- at start-up, `set_parent_death_signal()`: Linux's `prctl(PR_SET_PDEATHSIG, SIGTERM)`, so the kernel sends
  SIGTERM when the parent dies (strictly: when the parent *thread* that started us ends; the stress client starts
  the engine from the thread that then waits for it). Then `parent_alive()` once, since the parent may have died
  before the call;
- `parent_alive()` from the heartbeat thread, as a fallback on other systems and for a main thread that does not
  get to act on the signal.

No torch here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PARENT_EXIT = "the exit of the process that started the engine"  # a stop_signal, like "SIGTERM"


def _prctl(option: int, arg: object) -> int | None:
    """Linux's `prctl(option, arg)`: what it returns (0: done); None where it cannot be called (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        return None


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` when the parent dies. False where that is not available (not Linux)."""
    return _prctl(PR_SET_PDEATHSIG, int(sig)) == 0


def parent_alive(parent_pid: int | None) -> bool:
    """False once the process that started us is gone: we were re-parented (to init or a subreaper), so our
    parent pid is no longer `parent_pid`. True when there is nothing to watch (`parent_pid` None)."""
    return parent_pid is None or os.getppid() == parent_pid


def exit_when_orphaned(parent_pid: int, grace_s: float, code: int, poll_s: float = 0.5) -> None:
    """A backstop from the first moment: a daemon thread that ends the process `grace_s` after the parent is gone,
    whatever the main thread is doing. Until the engine's own heartbeat thread watches the parent (and stops it
    cleanly), nothing else would: the SIGTERM handler runs only when the main thread returns to the interpreter,
    and a setup step (a torch import, the tokenizer's training) can hold it for a minute on a loaded machine."""
    import threading
    import time

    def watch() -> None:
        while parent_alive(parent_pid):
            time.sleep(poll_s)
        time.sleep(grace_s)
        os._exit(code)

    threading.Thread(target=watch, name="engine-orphan-backstop", daemon=True).start()
