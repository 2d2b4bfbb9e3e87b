"""Apply a setting, then keep it only if someone confirms in time; anything else puts the previous value back.

Used by `tuner set` and the TUI. As a context manager it reverts on leaving unless `keep()` was called: on a normal
exit, an exception, or a fatal signal (`tuner.core.signals`). While it applies and while it reverts, fatal signals
are only recorded (in the main thread), so a second signal cannot cut either short; a recorded signal is raised
once the card is in a known state, unless an outer `signals.Inbox` owns the signals and decides.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Self

from tuner.backends.base import Backend
from tuner.core.card_lock import CardLock
from tuner.core.errors import NotApplied, TunerError
from tuner.core.models import Knob
from tuner.core.signals import Inbox

DEFAULT_TIMEOUT_S = 15.0


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Record fatal signals until the block ends (nothing is raised inside it), then raise the first one.

    A nested block (inside an owner's `signals.Inbox`) records into the outer inbox's handlers instead, and the
    owner decides; `Inbox` records nothing off the main thread, so this is a plain block there.
    """
    with Inbox() as inbox:
        yield
    inbox.raise_received()


class Countdown:
    """The keep-or-revert timer of a change (and of a rig's): `timeout_s` seconds of `clock` once the change took."""

    timeout_s: float
    clock: Callable[[], float]
    _deadline: float | None = None  # set to clock() + timeout_s once the change took

    def seconds_left(self) -> float:
        return self.timeout_s if self._deadline is None else max(0.0, self._deadline - self.clock())

    def expired(self) -> bool:
        return self._deadline is not None and self.seconds_left() <= 0.0


@dataclass(eq=False)  # one change is one change: compared (and found in a list) by identity
class PendingChange(Countdown):
    backend: Backend
    device_id: str
    value: int
    _: KW_ONLY
    allow_overvolt: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    lock: CardLock | None = None  # the card's writer lock, held until the change is kept or reverted
    # NVIDIA: a max graphics clock apply() locks before the value (a rig's part, a screen's profile); None:
    # apply() leaves the lock alone (prepare_setting locks it for `set --lock-mhz` and passes the previous one)
    lock_clock_mhz: int | None = None
    # NVIDIA: the lock clock in force before this change chose a new one (read by apply() when it locks); a
    # revert sets it back before restoring the value, so the card is not left locked at an unconfirmed clock
    previous_lock_clock_mhz: int | None = None
    before: Knob | None = field(default=None, init=False)  # the knob as it was before apply()
    applied: Knob | None = field(default=None, init=False)  # the knob as read back after apply()
    reverted_to: Knob | None = field(default=None, init=False)
    # why the card went to stock instead of the previous value
    restore_note: str | None = field(default=None, init=False)
    kept: bool = field(default=False, init=False)

    @property
    def device_ids(self) -> tuple[str, ...]:
        """The cards this change touches (one; a RigChange answers with every card of the rig)."""
        return (self.device_id,)

    @property
    def applied_by_card(self) -> dict[str, Knob]:
        """Each touched card's knob as read back after apply() (empty before), as RigChange answers it."""
        return {} if self.applied is None else {self.device_id: self.applied}

    @property
    def restore_notes(self) -> dict[str, str]:
        """Each card whose revert went to stock instead of its previous value, and why (as RigChange answers it)."""
        return {} if self.restore_note is None else {self.device_id: self.restore_note}

    @property
    def pending(self) -> bool:
        """Applied, and neither kept nor reverted yet."""
        return self.applied is not None and not self.kept and self.reverted_to is None

    def apply(self) -> Knob:
        """Lock the clock when asked, record the current value, then apply (validated, read back). The timer starts
        once it took."""
        if self.applied is not None:
            raise RuntimeError("a PendingChange applies once")
        try:
            if self.lock_clock_mhz is not None:
                self.previous_lock_clock_mhz = self.backend.knob(self.device_id).lock_clock_mhz
                self.backend.set_lock_clock(self.device_id, self.lock_clock_mhz)
            self.before = self.backend.knob(self.device_id)
            # A signal between the write and recording it would leave a change nobody reverts: hold signals until
            # the change is recorded as pending (a held signal is raised right after, and reverts it).
            with signals_held():
                self.applied = self.backend.apply(self.device_id, self.value, allow_overvolt=self.allow_overvolt)
                self._deadline = self.clock() + self.timeout_s
        except BaseException:
            if not self.pending:  # nothing to keep or revert: the card is free again
                self._unchoose_lock()
                self._release_lock()
            raise
        return self.applied

    def _unchoose_lock(self) -> None:
        """The value did not take: the lock clock chosen for it (by apply(), or by prepare_setting, which passes
        the previous one) goes back to the card's own (a later write in this process would otherwise lock at this
        change's clock)."""
        if self.previous_lock_clock_mhz is None:  # set only when a lock was chosen for this change
            return
        try:
            self.backend.set_lock_clock(self.device_id, self.previous_lock_clock_mhz)
        except TunerError:
            pass  # the cause of the failure is what the user needs; the card itself was not written

    def _release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def keep(self) -> None:
        if not self.pending:
            raise RuntimeError("nothing pending to keep")
        # through the root helper this stops it putting the value back; a failure leaves the change pending, so
        # leaving the `with` block reverts it
        self.backend.keep(self.device_id)
        self.kept = True
        self._release_lock()

    def revert(self) -> Knob:
        """Put the card back in a known state: the previous value, else stock, else say it could not be restored.

        The previous value is what the card held, not a request: it is never re-validated as new input. If the
        card refuses it (an off-step or out-of-range value another tool left there), stock is the known state we
        fall back to; if even the reset fails, NotApplied says so with the remedy. Fatal signals are only recorded
        meanwhile, so a second Ctrl-C or a hang-up cannot cut the revert short.
        """
        if self.before is None or self.kept or self.reverted_to is not None:
            raise RuntimeError("nothing pending to revert")
        before = self.before
        try:
            with signals_held():
                knob = self._restore(before)
                self.reverted_to = knob
        finally:
            self._release_lock()  # restored or not, this change no longer owns the card
        return knob

    def _restore(self, before: Knob) -> Knob:
        if self.previous_lock_clock_mhz is not None:
            try:  # the lock choice first: restoring the value re-locks at it, a reset releases it
                self.backend.set_lock_clock(self.device_id, self.previous_lock_clock_mhz)
            except TunerError as e:
                before = replace(before, current=before.stock)  # a value at an unknown lock is no known state
                self.restore_note = (f"the previous lock clock {self.previous_lock_clock_mhz} MHz could not be set "
                                     f"back ({e.message}); reset to stock instead")
        elif self.lock_clock_mhz is not None and before.current != before.stock:
            # no lock was known before this change chose one: writing the value back would lock it at this
            # change's unconfirmed clock, so stock (a reset releases the lock) is the known state
            before = replace(before, current=before.stock)
            self.restore_note = (f"no lock clock was known before this change's {self.lock_clock_mhz} MHz, and the "
                                 "previous value cannot be written back without one; reset to stock instead")
        # also where the knob read stock: it is one figure (NVIDIA: P0's offset), and the card may have held more
        # (another tool's P2 offset) that a revert puts back and a reset would not; a stock value reverts as a reset
        note = None
        try:
            knob = self.backend.revert(self.device_id, before.current)
            if knob.current == before.current:
                return knob
            note = (f"the card read back {knob.current:+d} {before.unit} after restoring {before.current:+d}; reset "
                    "to stock instead")
        except TunerError as e:
            note = (f"the previous value {before.current:+d} {before.unit} could not be written back ({e.message}); "
                    "reset to stock instead")
        if before.current != before.stock:
            self.restore_note = note
        try:
            knob = self.backend.reset(self.device_id)
        except TunerError as e:
            raise NotApplied(f"{self.device_id}: the card could not be restored: {e.message}",
                             "run `sudo tuner reset`, or reboot to return the card to stock") from e
        if knob.current != knob.stock:
            raise NotApplied(f"{self.device_id}: the card could not be restored: it reads {knob.current:+d} "
                             f"{knob.unit} after a reset to stock", "reboot to return the card to stock")
        return knob

    def __enter__(self) -> Self:
        if self.applied is None:
            try:
                self.apply()
            except BaseException:
                if self.pending:  # applied, then a held signal arrived: `with` will not call __exit__
                    self.revert()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pending:
            self.revert()
