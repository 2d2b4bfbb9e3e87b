"""Leaving safely when the session goes away (SIGHUP, SIGTERM, the terminal gone), even if the UI cannot move.

Found in the field (issue 28, item 7): two `tuner --simulate` UIs still alive 40 minutes after their tmux server
was killed, deaf to SIGTERM. The event loop was stuck writing to the terminal (tuner.app.terminal_driver says how
Textual gets there), and the old signal handler only asked that event loop to leave, so nothing ever ran: a change
waiting for keep-or-revert stayed on the card, a trial's setting too, and the process never ended.

So the safe step never waits for the event loop. `HangUpGuard` owns the fatal signals while the UI runs and keeps
one thread of its own; on the first fatal signal, or when the terminal is found gone, that thread:
1. makes the cards safe at once (the App's `make_safe`: stop the jobs, which kill their engine's process group;
   revert an unconfirmed change; reset every card a job or change touched, read back), before any terminal I/O;
2. asks the App to leave as well (a hang-up is an ordinary exit when the event loop is free);
3. gives the process `grace_s` to end by itself after step 1, then ends it with `os._exit` and the documented
   code (130): whatever the UI's threads are blocked on, the process is gone in bounded time.
A bisect trial cut short this way is inconclusive and runs again on resume, as after a tuner death: the job
records the stop, or (past `grace_s`) the journal holds a trial that never finished.

It also checks, once a second, that the terminal is still there (a hang-up makes `tcgetattr` fail with EIO), for
a process that gets no SIGHUP (one that is not in the terminal's session) and whose screen writes nothing; and runs
the App's `tick` (TunerApp.revert_overdue: a keep-or-revert whose countdown the stuck event loop cannot run, on a
terminal that stopped reading, is reverted from here).
Plain Python (no Textual): tested without a terminal; the App and run_app supply the callables.
"""

from __future__ import annotations

import contextlib
import os
import signal
import termios
import threading
from collections.abc import Callable
from types import FrameType

from tuner.core import exit_codes
from tuner.core.signals import FATAL

EXIT_GRACE_S = 10.0  # after the cards are safe, how long the process may take to end by itself
TERMINAL_CHECK_S = 1.0  # how often the guard checks that the terminal is still there
SAY_TIMEOUT_S = 1.0  # the last lines to a terminal that takes nothing: given up on after this


def terminal_gone(fd: int) -> bool:
    """The terminal on `fd` hung up: every tty call on it fails (EIO) once its other end (the pty's master, the
    SSH session) is gone."""
    try:
        termios.tcgetattr(fd)
    except termios.error:
        return True
    return False


def say_best_effort(lines: list[str], fd: int = 1, timeout_s: float = SAY_TIMEOUT_S) -> None:
    """Write `lines` to `fd` from a thread that may block for good (a terminal that stopped reading): waited for
    `timeout_s` at most, errors ignored. Raw os.write: nothing is left in a Python buffer to fail at exit."""
    data = "".join(f"tuner: {line}\n" for line in lines).encode()

    def write() -> None:
        with contextlib.suppress(OSError):
            os.write(fd, data)

    writer = threading.Thread(target=write, name="tuner-last-words", daemon=True)
    writer.start()
    writer.join(timeout_s)


class HangUpGuard:
    """Owns the fatal signals while the UI runs; makes the cards safe off the event loop and ends the process.

    `make_safe`: the App's (runs once; safe to call from any thread; returns what it did). `leave`: asks the App to
    exit (thread-safe, never blocks). `terminal_fd`: watched for a hang-up (None: not a terminal, not watched).
    `exit`: how the process ends when it does not end by itself (tests pass a fake). `tick`: run on the guard's
    thread at every check until a trigger (errors in it are ignored: it must not stop the guard).
    """

    def __init__(self, *, make_safe: Callable[[], list[str]], leave: Callable[[], None],
                 terminal_fd: int | None = None, grace_s: float = EXIT_GRACE_S, check_s: float = TERMINAL_CHECK_S,
                 exit: Callable[[int], object] = os._exit, say: Callable[[list[str]], None] = say_best_effort,
                 tick: Callable[[], object] | None = None) -> None:
        self._make_safe = make_safe
        self._leave = leave
        self._terminal_fd = terminal_fd
        self.grace_s = grace_s
        self._check_s = check_s
        self._exit = exit
        self._say = say
        self._tick = tick
        self._lock = threading.Lock()
        self._triggered = threading.Event()
        self._closed = threading.Event()
        self.reason: str | None = None  # why the process is leaving (the first signal, or the terminal gone)
        self.lines: list[str] | None = None  # what make_safe did, once it ran here
        self.safe = threading.Event()  # set once the cards were made safe by this guard
        self._previous: dict[int, object] = {}
        self._thread = threading.Thread(target=self._watch, name="tuner-hangup-guard", daemon=True)

    @property
    def triggered(self) -> bool:
        return self._triggered.is_set()

    # --- set up and tear down (main thread) -------------------------------------------------------------------
    def install(self) -> None:
        """Take the fatal signals (main thread only, as Python requires) and start the guard's thread."""
        for sig in FATAL:
            self._previous[sig] = signal.signal(sig, self.handle_signal)
        self._thread.start()

    def release_signals(self) -> None:
        """The UI has ended (main thread). After a normal quit the CLI's handlers take the fatal signals back. After
        a hang-up they are ignored from now on: the process is on its way out with 130, and a signal in a storm's
        tail must not kill it while Python finalizes (it resets Python handlers to the default then; SIG_IGN
        stays). Nothing is started afterwards, so nothing inherits the ignored signals."""
        self.close()  # a signal from here on is the CLI's, not a hang-up of the UI
        ending = self.triggered
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if ending else handler)  # type: ignore[arg-type]  # what getsignal gave
        self._previous.clear()

    def close(self) -> None:
        """The UI ended without a hang-up: stop watching. After a trigger this does nothing: the deadline stays
        armed until the process is gone."""
        with self._lock:
            if self.reason is None:
                self._closed.set()

    # --- triggers (any thread, the signal handler included) ---------------------------------------------------
    def handle_signal(self, signum: int, _frame: FrameType | None) -> None:
        """A fatal signal: leave. It runs on the main thread between two bytecodes, even while that thread is
        blocked on a lock (Textual's write queue): it only records and wakes the guard's thread. It never waits
        for the guard's lock: in a storm the next signal lands inside this very handler while it holds the lock,
        and waiting there waits for itself forever (a UI found hung, every thread in futex wait). A lock that is
        held means a trigger (or a normal quit's close) is already under way, so this signal adds nothing."""
        self._trigger(signal.Signals(signum).name, blocking=False)

    def trigger(self, reason: str) -> None:
        """Leave: the cards are made safe on the guard's thread and the process ends. The first reason counts;
        later ones (a second signal, a storm) change nothing."""
        self._trigger(reason, blocking=True)

    def _trigger(self, reason: str, *, blocking: bool) -> None:
        if not self._lock.acquire(blocking=blocking):
            return
        try:
            if self.reason is not None or self._closed.is_set():
                return
            self.reason = reason
        finally:
            self._lock.release()
        # first: the App stops starting anything new before make_safe looks at what it has
        with contextlib.suppress(Exception):  # the App's loop may be closing; the guard makes the cards safe anyway
            self._leave()
        self._triggered.set()

    # --- the guard's thread -----------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._triggered.wait(self._check_s):
            if self._closed.is_set():
                return
            if self._terminal_fd is not None and terminal_gone(self._terminal_fd):
                self.trigger("the terminal went away")
            elif self._tick is not None:
                with contextlib.suppress(Exception):  # the tick says what failed itself; the guard goes on
                    self._tick()
        if self._closed.is_set() and self.reason is None:
            return
        try:
            self.lines = self._make_safe()
        except BaseException as e:  # noqa: BLE001 - the process must still end; say what failed
            self.lines = [f"making the cards safe failed: {type(e).__name__}: {e}"]
        self.safe.set()
        self._closed.wait(self.grace_s)  # close() is a no-op once triggered: this waits the full grace
        # still here: the UI could not end by itself (its event loop blocked on a terminal that is gone or full)
        self._say([*self.lines, f"the terminal does not answer; ending now ({self.reason})"])
        self._exit(exit_codes.INTERRUPTED)
