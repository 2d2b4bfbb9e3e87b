"""Reset cards to stock and check they got there. `tuner reset`, the Tune screen and the safe quit call this."""

from __future__ import annotations

from tuner.backends.base import Backend
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


def reset_device(backend: Backend, device_id: str) -> Knob:
    """Back to stock, read back; NotApplied when the card reports anything else."""
    knob = backend.reset(device_id)
    if knob.current != knob.stock:
        raise NotApplied(f"{device_id}: reset to stock left {knob.current:+d} {knob.unit} (stock {knob.stock:+d})",
                         "run `tuner reset` again as root, or reboot")
    return knob
