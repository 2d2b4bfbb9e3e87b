"""Signals that would end the process: recorded, never acted on inside the handler.

Two modes, both for the main thread:
- `install()` (every CLI command, once): a fatal signal raises `Terminated` (or KeyboardInterrupt for SIGINT) so
  a command that owns nothing ends at once and every `finally:` runs.
- `Inbox()` (a region that owns a card's setting: a pending change, a revert, a bisect): while it is open the
  handlers only *record* the signal and wake a file descriptor. Nothing is raised half-way through a write or a
  revert; the owner looks at `inbox.first` when it chooses (between steps, or when `wait()` wakes) and makes the
  card safe before it leaves. A second or third signal is recorded the same way, so it cannot cut a revert short.

A storm (signal after signal) must end with the documented exit code, not with death by the signal or a
traceback from a handler that fired inside the error handling: once the process is ending (`install(
ends_process=True)`, the `tuner` command itself), the first fatal signal's exception is the only one; every later
fatal signal is ignored (`ending()`), and the command's `finally:` blocks run to the end.

Fatal means "ends the process by default": HUP (an SSH drop), INT, TERM, QUIT (Ctrl-\\), USR1, USR2, ALRM and PIPE.
SIGTSTP (Ctrl-Z) is recorded too when the owner asks (`Inbox(stop_signals=True)`): a change waiting for
confirmation must be reverted before the process stops, since a stopped process never reverts. So are SIGTTIN and
SIGTTOU, the kernel's stop for a background job (`&`, or Ctrl-Z then `bg`) that reads its terminal, or writes to it
under `stty tostop`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from types import FrameType
from typing import Self

FATAL: tuple[signal.Signals, ...] = (
    signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT,
    signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGPIPE,
)
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
# Caught, these would be sent again on every retry of the terminal read or write that raised them (the kernel's
# tty_check_change answers a caught one with -ERESTARTSYS; Python retries on EINTR, PEP 475): a loop the owner never
# leaves to revert. Once recorded they are ignored until the owner took the stop (`take_stop`): the read then fails
# (EIO), the write goes through.
TERMINAL_STOPS: tuple[signal.Signals, ...] = (signal.SIGTTIN, signal.SIGTTOU)


class Terminated(BaseException):
    """Raised in the main thread when the process is asked to stop by a signal. Not an Exception on purpose:
    broad `except Exception` blocks must not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_ends_process = False  # set by install(ends_process=True): the first fatal signal ends this process


def exception_for(signum: int) -> BaseException:
    """What a recorded signal becomes once the card is safe: Ctrl-C stays KeyboardInterrupt. In a process that
    ends on it, every later fatal signal is only recorded from here on (`ending`)."""
    if _ends_process:
        ending()
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _pipe_error_in_flight() -> bool:
    """A BrokenPipeError is already on its way out (raised, or being handled): the SIGPIPE that came with the
    same failed write adds nothing, and raising it too would cut that error's handling short."""
    error = sys.exc_info()[1]
    while error is not None:
        if isinstance(error, BrokenPipeError):
            return True
        error = error.__context__
    return False


def _raise(signum: int, _frame: FrameType | None) -> None:
    if signum == signal.SIGPIPE and _pipe_error_in_flight():
        if _ends_process:
            ending()
        return
    raise exception_for(signum)


def install(*, ends_process: bool = False) -> None:
    """Call once from the main thread of a CLI command: every fatal signal ends it through its `finally:` blocks.
    `ends_process`: this process exits when the command does (the `tuner` command itself, not a test calling
    `cli.main`): the first fatal signal's exception is then the only one raised."""
    global _ends_process
    _ends_process = ends_process
    for sig in FATAL:
        signal.signal(sig, _raise)


def ending() -> None:
    """From now on fatal signals are ignored: the process is on its way out with an exit code already chosen.
    SIG_IGN rather than a Python handler, because the interpreter resets Python handlers to SIG_DFL while it
    finalizes, and a signal then would still kill it. Main thread only (elsewhere it does nothing). Nothing is
    started after this (an ignored signal would be inherited across exec)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _quiet_race_reports()
    for sig in FATAL:
        signal.signal(sig, signal.SIG_IGN)


def _quiet_race_reports() -> None:
    """A signal that arrived just before its handler became SIG_IGN is still pending in CPython; the next
    `signal.signal` call (or check) finds no Python handler for it and reports "Signal N ignored due to race
    condition" as an unraisable OSError on stderr (CPython's `_PyErr_CheckSignalsTstate`, bpo-43406). Once the
    process is ending, ignoring it is the intent: that report is dropped, every other one still goes to the hook."""
    previous = sys.unraisablehook
    if getattr(previous, "_tuner_quiet_race", False):
        return

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        error = unraisable.exc_value
        if isinstance(error, OSError) and str(error).endswith("ignored due to race condition"):
            return
        previous(unraisable)

    hook._tuner_quiet_race = True  # type: ignore[attr-defined]  # marks the hook as installed (idempotent)
    sys.unraisablehook = hook


class Inbox:
    """Record fatal signals (and optionally SIGTSTP) instead of acting on them; restore the old handlers on exit.

    Off the main thread (Python delivers signals only there) an Inbox records nothing and `first` stays None: the
    main thread's own handlers decide, as in the TUI, whose App owns the signals. Inside another Inbox it records
    nothing either: the outermost owner keeps the signals and decides.
    """

    def __init__(self, *, stop_signals: bool = False):
        self._signals = FATAL + (STOP_SIGNALS if stop_signals else ())
        self._received: list[int] = []
        self._previous: dict[int, object] = {}
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._previous_wakeup_fd = -1
        self.active = False

    # --- what arrived ------------------------------------------------------------------------------------------
    @property
    def received(self) -> tuple[int, ...]:
        return tuple(self._received)

    @property
    def first(self) -> int | None:
        """The first fatal signal recorded (a stop signal alone does not count: see `stop_requested`)."""
        return next((s for s in self._received if s not in STOP_SIGNALS), None)

    @property
    def stop_requested(self) -> bool:
        return any(s in STOP_SIGNALS for s in self._received)

    def take_stop(self) -> bool:
        """Whether a stop signal (Ctrl-Z) arrived since the last call; forgets it, so the next one counts again (a
        bisect pauses, stops, and goes on after SIGCONT)."""
        stops = [s for s in self._received if s in STOP_SIGNALS]
        for s in stops:
            self._received.remove(s)
        if stops and self.active and threading.current_thread() is threading.main_thread():
            for sig in TERMINAL_STOPS:  # `_record` ignored them until now
                if sig in self._signals:
                    signal.signal(sig, self._record)
        return bool(stops)

    @property
    def fd(self) -> int | None:
        """Readable when a signal arrived: add it to a select() set to wake at once."""
        return self._read_fd

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to `timeout_s`, waking early when a signal arrives; True when any signal was recorded."""
        if self._read_fd is not None and not self._received:
            ready, _, _ = select.select([self._read_fd], [], [], max(0.0, timeout_s))
            if ready:
                self.drain()
        elif not self._received:
            threading.Event().wait(timeout_s)
        return bool(self._received)

    def drain(self) -> None:
        if self._read_fd is None:
            return
        with contextlib.suppress(OSError):  # BlockingIOError: drained
            while os.read(self._read_fd, 512):
                pass

    def raise_received(self) -> None:
        """Act on a recorded fatal signal now that the card is safe."""
        if self.first is not None:
            raise exception_for(self.first)

    # --- life cycle ---------------------------------------------------------------------------------------------
    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self._received.append(signum)  # only record: the owner of the card decides what happens
        if signum in TERMINAL_STOPS:
            for sig in TERMINAL_STOPS:
                signal.signal(sig, signal.SIG_IGN)

    def __enter__(self) -> Self:
        if threading.current_thread() is not threading.main_thread() or _open_inboxes:
            return self
        _open_inboxes.append(self)
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._record)
        self.active = True
        return self

    def __exit__(self, *_: object) -> None:
        if not self.active:
            return
        if _ends_process and self.first is not None:
            ending()  # the process ends on the signal recorded here: a later one must not cut its last line short
        for sig, handler in self._previous.items():
            # a process already ending keeps ignoring fatal signals (`ending`), whatever was there before
            ignoring = sig in FATAL and signal.getsignal(sig) == signal.SIG_IGN
            signal.signal(sig, signal.SIG_IGN if ignoring else handler)  # type: ignore[arg-type]  # getsignal's
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        for fd in (self._read_fd, self._write_fd):
            if fd is not None:
                os.close(fd)
        self._read_fd = self._write_fd = None
        self.active = False
        _open_inboxes.remove(self)


_open_inboxes: list[Inbox] = []  # the main thread's open Inbox, if any (at most one records)


def stop_now() -> None:
    """Stop this process as Ctrl-Z would have (after the owner made the card safe)."""
    previous = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    try:
        os.kill(os.getpid(), signal.SIGTSTP)
    finally:
        signal.signal(signal.SIGTSTP, previous)
