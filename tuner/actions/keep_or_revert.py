"""Apply a setting, then keep it only if someone confirms in time; anything else puts the previous value back.

Used by `tuner set` and the TUI. As a context manager it reverts on leaving unless `keep()` was called: on a normal
exit, an exception, Ctrl-C (KeyboardInterrupt) or SIGTERM/SIGHUP (`tuner.core.signals.Terminated`). While it reverts,
further SIGINT/SIGTERM/SIGHUP are held back (in the main thread) so a second signal cannot cut the revert short;
the held signal is raised once the card is back.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

from tuner.backends.base import Backend
from tuner.core.errors import NotApplied
from tuner.core.models import Knob
from tuner.core.signals import Terminated

DEFAULT_TIMEOUT_S = 15.0
_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Defer SIGINT/SIGTERM/SIGHUP until the block ends, then raise the first one that arrived."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _f: arrived.append(signum)) for sig in _HELD}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if arrived:
        if arrived[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(arrived[0])


class PendingChange:
    def __init__(
        self,
        backend: Backend,
        device_id: str,
        value: int,
        *,
        allow_overvolt: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.backend, self.device_id, self.value = backend, device_id, value
        self.allow_overvolt = allow_overvolt
        self.timeout_s = timeout_s
        self._clock = clock
        self.before: Knob | None = None  # the knob as it was before apply()
        self.applied: Knob | None = None  # the knob as read back after apply()
        self.reverted_to: Knob | None = None
        self.kept = False
        self._deadline: float | None = None

    @property
    def previous(self) -> int | None:
        return None if self.before is None else self.before.current

    @property
    def pending(self) -> bool:
        """Applied, and neither kept nor reverted yet."""
        return self.applied is not None and not self.kept and self.reverted_to is None

    def apply(self) -> Knob:
        """Record the current value, then apply (validated, read back). The timer starts once it took."""
        if self.applied is not None:
            raise RuntimeError("a PendingChange applies once")
        self.before = self.backend.knob(self.device_id)
        # A signal between the write and recording it would leave a change nobody reverts: hold signals until
        # the change is recorded as pending (a held signal is raised right after, and reverts it).
        with signals_held():
            self.applied = self.backend.apply(self.device_id, self.value, allow_overvolt=self.allow_overvolt)
            self._deadline = self._clock() + self.timeout_s
        return self.applied

    def keep(self) -> None:
        if not self.pending:
            raise RuntimeError("nothing pending to keep")
        self.kept = True

    def revert(self) -> Knob:
        """Put the previous value back (stock through `reset` when it was stock) and verify it."""
        if self.before is None or self.kept or self.reverted_to is not None:
            raise RuntimeError("nothing pending to revert")
        before = self.before
        with signals_held():
            if before.current == before.stock:
                knob = self.backend.reset(self.device_id)
            else:
                knob = self.backend.apply(self.device_id, before.current, allow_overvolt=True)
            self.reverted_to = knob
        if knob.current != before.current:
            raise NotApplied(
                f"{self.device_id}: reverting to {before.current:+d} {before.unit} left {knob.current:+d}",
                "run `tuner reset` (as root)",
            )
        return knob

    def seconds_left(self) -> float:
        if self._deadline is None:
            return self.timeout_s
        return max(0.0, self._deadline - self._clock())

    def expired(self) -> bool:
        return self._deadline is not None and self.seconds_left() <= 0.0

    def __enter__(self) -> PendingChange:
        if self.applied is None:
            try:
                self.apply()
            except BaseException:
                if self.pending:  # applied, then a held signal arrived: `with` will not call __exit__
                    self.revert()
                raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.pending:
            self.revert()
