"""Reset cards to stock and check they got there. `tuner reset`, the Tune screen and the safe quit call this."""

from __future__ import annotations

from tuner.backends.base import Backend
from tuner.core.card_lock import CardLock, describe_holder
from tuner.core.errors import NotApplied, UsageError
from tuner.core.models import DeviceInfo, Knob


def reset_targets(backend: Backend, device_id: str | None, *, all_devices: bool = False) -> list[DeviceInfo]:
    """The cards a reset acts on: the one named, else all of them when asked or when there is only one (or they
    are simulated, where nothing real is at stake)."""
    devices = backend.devices()
    if device_id:
        return [backend.device(device_id)]
    if all_devices or len(devices) == 1 or backend.simulated:
        return devices
    raise UsageError("several GPUs found", "name one with --device ID or pass --all")


def reset_device(backend: Backend, device_id: str, *, force: bool = False) -> Knob:
    """Back to stock, read back; NotApplied when the card reports anything else.

    A reset is a write, so it takes the card's writer lock (CardBusy names the holder). `force` resets anyway:
    for a holder that is stuck (stopped, hung in the driver), and for the App's own safe exit, whose jobs may
    still hold the lock in this process while they wind down."""
    if force:
        knob = _reset(backend, device_id)
    else:
        with CardLock(device_id, "tuner reset"):
            knob = _reset(backend, device_id)
    return knob


def holder_of(device_id: str) -> str | None:
    """Who holds the card's writer lock now, as `reset --force` reports it (None: nobody named)."""
    return describe_holder(device_id)


def _reset(backend: Backend, device_id: str) -> Knob:
    knob = backend.reset(device_id)
    if knob.current != knob.stock:
        raise NotApplied(f"{device_id}: reset to stock left {knob.current:+d} {knob.unit} (stock {knob.stock:+d})",
                         "run `tuner reset` again as root, or reboot")
    return knob
