"""Signals that would end the process: recorded, never acted on inside the handler.

Two modes, both for the main thread:
- `install()` (every CLI command, once): a fatal signal raises `Terminated` (or KeyboardInterrupt for SIGINT) so
  a command that owns nothing ends at once and every `finally:` runs.
- `Inbox()` (a region that owns a card's setting: a pending change, a revert, a bisect): while it is open the
  handlers only *record* the signal and wake a file descriptor. Nothing is raised half-way through a write or a
  revert; the owner looks at `inbox.first` when it chooses (between steps, or when `wait()` wakes) and makes the
  card safe before it leaves. A second or third signal is recorded the same way, so it cannot cut a revert short.

Fatal means "ends the process by default": HUP (an SSH drop), INT, TERM, QUIT (Ctrl-\\), USR1, USR2, ALRM and PIPE.
SIGTSTP (Ctrl-Z) is recorded too when the owner asks (`Inbox(stop_signals=True)`): a change waiting for
confirmation must be reverted before the process stops, since a stopped process never reverts.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from types import FrameType, TracebackType
from typing import Self

FATAL: tuple[signal.Signals, ...] = (
    signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT,
    signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGPIPE,
)
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTSTP,)


class Terminated(BaseException):
    """Raised in the main thread when the process is asked to stop by a signal. Not an Exception on purpose:
    broad `except Exception` blocks must not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exception_for(signum: int) -> BaseException:
    """What a recorded signal becomes once the card is safe: Ctrl-C stays KeyboardInterrupt."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise exception_for(signum)


def install() -> None:
    """Call once from the main thread of a CLI command: every fatal signal ends it through its `finally:` blocks."""
    for sig in FATAL:
        signal.signal(sig, _raise)


def name(signum: int) -> str:
    return signal.Signals(signum).name


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
        try:
            while os.read(self._read_fd, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def raise_received(self) -> None:
        """Act on a recorded fatal signal now that the card is safe."""
        if self.first is not None:
            raise exception_for(self.first)

    # --- life cycle ---------------------------------------------------------------------------------------------
    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self._received.append(signum)  # only record: the owner of the card decides what happens

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

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.active:
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
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
