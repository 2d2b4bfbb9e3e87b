"""Textual's Linux driver, changed in two places so that a terminal that goes away cannot wedge the UI.

How Textual 8.2.8 wedges when the terminal goes away (reproduced by tests/tui/test_hangup.py):
- Every screen update goes through one writer thread (`textual.drivers._writer_thread.WriterThread`) fed by a
  queue of 30 writes. A write that fails (EIO once the pty's master is closed: tmux killed, the SSH session gone)
  ends that thread with the exception; the driver keeps handing it writes, and the 31st blocks the event loop in
  `Queue.put` for good, shutdown included (`LinuxDriver.close` -> `WriterThread.stop` -> `put(None)`). The same
  wedge after `App.suspend()` is Textualize/textual#6692 (open).
- A hang-up's SIGHUP comes with a SIGCONT (the kernel sends both to the terminal's session leader). Textual's
  SIGCONT handler (`LinuxDriver._sigcont_application`) takes every SIGCONT for a return from Ctrl-Z and restarts
  application mode: a second writer thread, which dies on its first EIO, while the first is left waiting on its
  own queue. That is the picture gdb showed: the main thread in `WriterThread.stop` -> `put` on a full queue, a
  writer thread waiting in `get` on another.

Here: the writer writes through `TerminalOutput`, which never raises: the first failed write tells the App the
terminal is gone (it leaves through tuner.app.hangup) and points stdout and stderr at /dev/null, so every later
write, Textual's shutdown and Python's last flush included, goes nowhere instead of failing or blocking. And a
SIGCONT resumes application mode only after a suspend of our own (`_must_signal_resume`, set by the driver's
SIGTSTP handler); any other SIGCONT leaves the running driver alone.

And a SIGTSTP (`kill -TSTP`, `App.action_suspend_process`) no longer stops the process at once: the App makes its
cards safe first (an unconfirmed change reverted, a bisect paused at stock), as the CLI does before it stops
(tuner.core.signals).

A terminal that stops reading without going away (a stalled connection) blocks the writer inside write(); nothing
here can unblock it. tuner.app.hangup still makes the cards safe and ends the process on the signal that follows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import IO, Any

from textual.drivers.linux_driver import LinuxDriver


class TerminalOutput:
    """The file Textual's writer thread writes to: the terminal until a write fails, then nothing.

    `on_lost(reason)` is called once, from the writer thread, on the first failure, after `silence()` (by
    default: stdout and stderr pointed at /dev/null)."""

    def __init__(self, file: IO[str], on_lost: Callable[[str], None],
                 silence: Callable[[], None] | None = None) -> None:
        self._file = file
        self._on_lost = on_lost
        self._silence = silence or _silence_stdio
        self._lock = threading.Lock()
        self.lost: str | None = None

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return self._file.write(text)
            except (OSError, ValueError) as e:
                self._lose(e)
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self._file.flush()
            except (OSError, ValueError) as e:
                self._lose(e)

    def fileno(self) -> int:
        return self._file.fileno()

    def isatty(self) -> bool:
        return self.lost is None and self._file.isatty()

    def _lose(self, error: BaseException) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.lost = f"the terminal went away ({error})"
        self._silence()
        self._on_lost(self.lost)


def _silence_stdio() -> None:
    """Point fds 1 and 2 at /dev/null: output that can no longer reach anyone (what Python still holds in its
    buffers included) neither fails nor blocks from now on."""
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
    finally:
        os.close(null)


class HangUpSafeDriver(LinuxDriver):
    """LinuxDriver whose output never wedges the UI and whose SIGCONT handler restarts nothing it did not stop.

    The App it drives (run_app's TunerApp) is told with `terminal_went_away(reason)`, from the writer thread, when
    the terminal is found gone."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._file = TerminalOutput(self._file, app.terminal_went_away)  # type: ignore[arg-type, assignment]  # a TextIO in all but name
        self._stopping = False  # a SIGTSTP is being handled: the cards are made safe, then the process stops

    def start_application_mode(self) -> None:
        """Textual's, then SIGTTIN and SIGTTOU take the same safe stop as SIGTSTP: the kernel's stop for a background
        job that reads its terminal or sets its modes (after `kill -STOP` then `bg`, the UI runs on in the
        background) stopped the process at once, an unconfirmed change or a bisect trial left on the card, as the CLI
        never does (tuner.core.signals TERMINAL_STOPS). Set here, not once: Textual's start puts both back to
        SIG_DFL (its own check for a `bg` before it takes the terminal again)."""
        super().start_application_mode()
        if os.isatty(self.fileno):
            for stop in (signal.SIGTTIN, signal.SIGTTOU):
                signal.signal(stop, self._sigtstp_application)

    def _sigtstp_application(self, *args: Any) -> None:
        """SIGTSTP (`kill -TSTP`, `App.action_suspend_process`). Textual's handler stopped the process at once,
        leaving an unconfirmed change or a bisect trial on the card, unwatched, for as long as it stayed stopped.
        Here the App makes its cards safe first (`make_safe_to_stop`), on a thread of its own: this handler runs on
        the event loop's thread, which may hold the lock the App's revert waits for. The process stops from the
        event loop once they are safe; a SIGTSTP meanwhile adds nothing."""
        if self._stopping:
            return
        self._stopping = True
        threading.Thread(target=self._stop_when_safe, args=args, name="tuner-stop", daemon=True).start()

    def _stop_when_safe(self, *args: Any) -> None:
        app: Any = self._app  # run_app's TunerApp
        try:
            safe = app.make_safe_to_stop()
        except Exception:  # noqa: BLE001 - not known to be safe: not stopped (the App said what failed)
            safe = False
        if safe:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the App has ended, nothing to stop
                self._loop.call_soon_threadsafe(self._stop_now, *args)
                return
        self._stopping = False

    def _stop_now(self, *args: Any) -> None:
        """On the event loop, the cards safe: Textual's stop (application mode suspended, SIGSTOP); it returns on
        SIGCONT, and the App goes on (a paused bisect runs its trial again)."""
        app: Any = self._app  # run_app's TunerApp
        try:
            if not app.leaving:  # a hang-up meanwhile: the guard is making the cards safe, never stop it
                super()._sigtstp_application(*args)
        finally:
            self._stopping = False
            app.resume_after_stop()

    def _sigcont_application(self, *args: Any) -> None:
        if self._must_signal_resume:  # back from our own Ctrl-Z (the driver stopped itself first): resume
            super()._sigcont_application(*args)
        # else: a hang-up's SIGCONT, or `kill -CONT`: application mode was never stopped; restarting it would
        # leave the running writer thread behind and start another
