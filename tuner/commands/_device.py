"""Which device a command acts on: the one named with --device, or the only one there is."""

from __future__ import annotations

from tuner.backends.base import Backend
from tuner.core.errors import TunerError, UsageError
from tuner.core.models import DeviceInfo, Knob


def pick_device(backend: Backend, device_id: str | None) -> DeviceInfo:
    """`device_id` None: the only card. An empty id (`--device "$DEV"` with DEV unset) is an unknown id, never
    "not given": it must not act on whichever card happens to be the only one."""
    if device_id is not None:
        return backend.device(device_id)  # UnknownDevice lists the known ids
    devices = backend.devices()
    if len(devices) == 1:
        return devices[0]
    raise UsageError("several GPUs found", "name one with --device ID (see `tuner list`)")


def knob_or_error(backend: Backend, device_id: str) -> tuple[Knob | None, TunerError | None]:
    """One card with Overdrive off must not hide the others (`list`, `status` of every card): its knob error is shown
    in its place."""
    try:
        return backend.knob(device_id), None
    except TunerError as e:
        return None, e
