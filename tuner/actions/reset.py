"""Reset cards to stock and check they got there. `tuner reset`, the Tune screen and the safe quit call this.

Returning a card to stock never needs the state directory (issue 28, item 2): the card is written first, and
what cannot be recorded (the lock file on a read-only, full or unsafe state directory; the backends' per-card
records) is said in one line each, never an error. A reset is safe whatever else holds: the card lock only keeps
it from interleaving with another writer, and a lock file no one can create is a lock no one holds.
"""

from __future__ import annotations

from tuner.backends.base import Backend, warn_on_stderr
from tuner.core.card_lock import CardLock, LockUnavailable, lock_path
from tuner.core.errors import NotApplied, UsageError
from tuner.core.models import DeviceInfo, Knob


def reset_targets(backend: Backend, device_id: str | None, *, all_devices: bool = False) -> list[DeviceInfo]:
    """The cards a reset acts on: the one named, else all of them when asked or when there is only one (or they
    are simulated, where nothing real is at stake)."""
    devices = backend.devices()
    if device_id is not None:  # an empty id is unknown (UnknownDevice), not "all of them"
        return [backend.device(device_id)]
    if all_devices or len(devices) == 1 or backend.simulated:
        return devices
    raise UsageError("several GPUs found", "name one with --device ID or pass --all")


def reset_device(backend: Backend, device_id: str, *, force: bool = False) -> Knob:
    """Back to stock, read back; NotApplied when the card reports anything else.

    A reset is a write, so it takes the card's writer lock (CardBusy names the holder). `force` resets anyway:
    for a holder that is stuck (stopped, hung in the driver), and for the App's own safe exit, whose jobs may
    still hold the lock in this process while they wind down. When the state directory cannot hold the lock
    (read-only, full, unsafe) the card is reset anyway and a line on stderr says so."""
    if force:
        return _reset(backend, device_id, force=True)
    lock = CardLock(device_id, "tuner reset")
    try:
        lock.acquire()
    except LockUnavailable as e:
        warn_on_stderr(f"{device_id}: reset without the card lock ({e.message})")
        return _reset(backend, device_id)
    try:
        knob = _reset(backend, device_id)
    finally:
        lock.release()
    if lock.unnamed is not None:
        warn_on_stderr(f"{device_id} is at stock; the state directory could not record this reset "
                        f"({lock.unnamed.strerror or lock.unnamed}: {lock_path(device_id).parent})")
    return knob


def _reset(backend: Backend, device_id: str, *, force: bool = False) -> Knob:
    knob = backend.reset(device_id, force=True) if force else backend.reset(device_id)
    if knob.current != knob.stock:
        raise NotApplied(f"{device_id}: reset to stock left {knob.current:+d} {knob.unit} (stock {knob.stock:+d})",
                         "run `tuner reset` again as root, or reboot")
    return knob
