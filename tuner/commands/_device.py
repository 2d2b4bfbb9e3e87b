"""Which device a command acts on: the one named with --device, or the only one there is."""

from __future__ import annotations

from tuner.backends.base import Backend
from tuner.core.errors import UsageError
from tuner.core.models import DeviceInfo


def pick_device(backend: Backend, device_id: str | None) -> DeviceInfo:
    if device_id:
        return backend.device(device_id)  # UnknownDevice lists the known ids
    devices = backend.devices()
    if len(devices) == 1:
        return devices[0]
    raise UsageError("several GPUs found", "name one with --device ID (see `tuner list`)")
