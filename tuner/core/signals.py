"""Turn SIGTERM and SIGHUP (an SSH drop) into an exception, so every `finally:` that reverts a card runs."""

from __future__ import annotations

import signal


class Terminated(BaseException):
    """Raised in the main thread when the process is asked to stop by a signal. Not an Exception on purpose:
    broad `except Exception` blocks must not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, _frame) -> None:
    raise Terminated(signum)


def install() -> None:
    """Call once from the main thread of a CLI command. Ctrl-C stays KeyboardInterrupt."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)
