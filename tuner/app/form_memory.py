"""The Bisect form remembers its last values per card, in `$XDG_CONFIG_HOME/tuner/bisect-form.json`.

A card is known by its vendor and serial (its id when it has no serial), so two cards keep their own values and a
card keeps them when it moves slot. A damaged file is ignored (the form starts blank), never fatal; a FIFO or a
device node there is neither read (it would block) nor replaced, and said in one line.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from tuner.core import paths
from tuner.core.atomic import write_atomic
from tuner.core.kernel_files import NotARegularFile, read_regular
from tuner.core.models import DeviceInfo

FILE_NAME = "bisect-form.json"
MAX_BYTES = 2**20


def card_key(device: DeviceInfo) -> str:
    return f"{device.vendor}:{device.serial or device.id}"


def _path() -> Path:
    return paths.config_dir() / FILE_NAME


def _load_all() -> tuple[dict, str | None]:
    """The file's document ({} when missing or damaged), and the one line saying it is not a file, if it is not."""
    path = _path()
    try:
        doc = json.loads(read_regular(path, MAX_BYTES))
    except NotARegularFile as e:
        return {}, f"{path} is {e.kind}, not a file: the form starts blank (move it aside)"
    except (OSError, ValueError, RecursionError):
        return {}, None
    return (doc if isinstance(doc, dict) else {}), None


def recall(device: DeviceInfo) -> tuple[dict[str, str], str | None]:
    """The card's remembered fields, and the one line saying why none could be read (None: nothing to say)."""
    doc, note = _load_all()
    values = doc.get(card_key(device))
    if not isinstance(values, dict):
        return {}, note
    return {str(k): str(v) for k, v in values.items() if isinstance(v, str)}, note


def remember(device: DeviceInfo, values: dict[str, str]) -> None:
    """Keep the non-blank fields; a failed write only loses the convenience, so it is not an error."""
    doc, note = _load_all()
    if note is not None:  # not a file of ours: left as it is
        return
    doc[card_key(device)] = {k: v for k, v in values.items() if v.strip()}
    with contextlib.suppress(OSError):
        write_atomic(_path(), (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
