"""The Bisect form remembers its last values per card, in `$XDG_CONFIG_HOME/tuner/bisect-form.json`.

A card is known by its vendor and serial (its id when it has no serial), so two cards keep their own values and a
card keeps them when it moves slot. A damaged file is ignored (the form starts blank), never fatal.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from tuner.core import paths
from tuner.core.atomic import write_atomic
from tuner.core.models import DeviceInfo

FILE_NAME = "bisect-form.json"


def card_key(device: DeviceInfo) -> str:
    return f"{device.vendor}:{device.serial or device.id}"


def _path() -> Path:
    return paths.config_dir() / FILE_NAME


def _load_all() -> dict:
    try:
        doc = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def recall(device: DeviceInfo) -> dict[str, str]:
    values = _load_all().get(card_key(device))
    if not isinstance(values, dict):
        return {}
    return {str(k): str(v) for k, v in values.items() if isinstance(v, str)}


def remember(device: DeviceInfo, values: dict[str, str]) -> None:
    """Keep the non-blank fields; a failed write only loses the convenience, so it is not an error."""
    doc = _load_all()
    doc[card_key(device)] = {k: v for k, v in values.items() if v.strip()}
    with contextlib.suppress(OSError):
        write_atomic(_path(), (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
