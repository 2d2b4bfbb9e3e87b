"""Set one value by hand: every check before the first write, then a keep-or-revert change.

`tuner set` and the Tune screen both call `prepare_setting`; neither may write to the card another way. The
checks, in order: the knob's range and step, the overvolt guard, the unsafe list (a value at or beyond one that
froze, hung or reset this card), and the NVIDIA lock clock. Only when all pass is anything written; the change
itself is applied by the returned `PendingChange` (the lock clock first, as the offset is defined at it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tuner.actions.keep_or_revert import DEFAULT_TIMEOUT_S, PendingChange
from tuner.backends.base import Backend
from tuner.core.card_lock import CardLock
from tuner.core.errors import UsageError
from tuner.core.models import Knob, KnobKind
from tuner.tuning import journal


@dataclass(frozen=True)
class SetRequest:
    """What a front end asks for. `lock_clock_mhz` is NVIDIA's max graphics clock (None: leave it)."""

    device_id: str
    value: int
    allow_overvolt: bool = False
    ignore_unsafe: bool = False
    lock_clock_mhz: int | None = None


def can_lock_clock(knob: Knob) -> bool:
    """True when this card's offset is defined at a lock clock (NVIDIA: `Backend.set_lock_clock` changes it), also
    where the driver reports no max boost clock to default to (the knob's lock is then None, and a profile's lock
    is the only one there is)."""
    return knob.lock_clock_mhz is not None or knob.kind is KnobKind.CLOCK_OFFSET


def check_setting(backend: Backend, request: SetRequest) -> Knob:
    """Raise the TunerError a front end shows when `request` may not be written; nothing is written here."""
    knob = backend.knob(request.device_id)
    knob.validate(request.value, allow_overvolt=request.allow_overvolt)
    # damaged safety files block even --ignore-unsafe (fail closed)
    journal.check_safety_state(request.device_id, backend)
    if not request.ignore_unsafe:
        journal.refuse_unsafe(request.device_id, knob, request.value, backend)
    if request.lock_clock_mhz is not None and not can_lock_clock(knob):
        raise UsageError("--lock-mhz applies only to NVIDIA cards", "drop --lock-mhz")
    return knob


def prepare_setting(
    backend: Backend,
    request: SetRequest,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    purpose: str | None = None,
) -> PendingChange:
    """Check `request` and return the keep-or-revert change (it sets the lock clock when asked), not yet applied.

    The caller applies it (`with change:` or `change.apply()`) and keeps or reverts it."""
    check_setting(backend, request)
    lock = CardLock(request.device_id, purpose).acquire()  # one writer per card, held until kept or reverted
    try:
        # apply() locks the clock first and records the lock in force before it, which a revert puts back with
        # the value (or, where none was known, goes to stock rather than keep this request's lock)
        return PendingChange(backend, request.device_id, request.value, allow_overvolt=request.allow_overvolt,
                             timeout_s=timeout_s, clock=clock, lock=lock, lock_clock_mhz=request.lock_clock_mhz)
    except BaseException:
        lock.release()
        raise


def apply_setting_now(backend: Backend, request: SetRequest) -> Knob:
    """The same checks, then the write, read back, with no keep-or-revert: for `apply --yes` and the boot
    service, where nobody is there to confirm (a profile's value was confirmed when it was saved)."""
    check_setting(backend, request)
    with CardLock(request.device_id, "tuner apply"):
        if request.lock_clock_mhz is not None:
            backend.set_lock_clock(request.device_id, request.lock_clock_mhz)
        knob = backend.apply(request.device_id, request.value, allow_overvolt=request.allow_overvolt)
        backend.keep(request.device_id)  # nobody confirms later: through the root helper, it is kept now
        return knob
