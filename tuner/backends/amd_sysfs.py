"""The amdgpu sysfs surface: find cards, read hwmon, and the one seam through which every OD write passes.

All paths are taken under a root (`paths.sysfs_root()`, i.e. `TUNER_SYSFS_ROOT`, default `/`) so tests and dry
runs can point the tuner at a fake tree. Nothing else in the tuner opens files under /sys.
"""

from __future__ import annotations

import re
from pathlib import Path

AMD_VENDOR_ID = 0x1002
PP_OVERDRIVE_MASK = 0x4000  # bit 14 of amdgpu.ppfeaturemask (amd_shared.h)
PPFEATUREMASK_PATH = "sys/module/amdgpu/parameters/ppfeaturemask"

_CARD_NAME = re.compile(r"card(\d+)")  # not the connectors (card0-DP-1), which also match card*


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def amd_card_dirs(root: Path | str) -> list[Path]:
    """`<root>/sys/class/drm/cardN/device` for every amdgpu card (PCI vendor 0x1002), ordered by N.

    A directory is listed once even when two cardN entries point at it (render nodes never do, but be safe).
    """
    drm = Path(root) / "sys" / "class" / "drm"
    try:
        entries = list(drm.iterdir())
    except OSError:
        return []
    found: list[tuple[int, Path]] = []
    seen: set[Path] = set()
    for entry in entries:
        m = _CARD_NAME.fullmatch(entry.name)
        if not m:
            continue
        device = entry / "device"
        vendor = _read_text(device / "vendor")
        if vendor is None:
            continue
        try:
            if int(vendor.strip().strip("\0"), 0) != AMD_VENDOR_ID:
                continue
        except ValueError:
            continue
        try:
            key = device.resolve()
        except OSError:
            key = device
        if key in seen:
            continue
        seen.add(key)
        found.append((int(m.group(1)), device))
    return [device for _, device in sorted(found)]


def read_ppfeaturemask(root: Path | str) -> int | None:
    """The amdgpu module's `ppfeaturemask` (printed in hex, e.g. `0xfff7bfff`), or None when amdgpu is not
    loaded or the value is unreadable."""
    text = _read_text(Path(root) / PPFEATUREMASK_PATH)
    if text is None:
        return None
    try:
        return int(text.strip().strip("\0"), 0)
    except ValueError:
        return None


def overdrive_enabled(mask: int | None) -> bool | None:
    """True/False from the mask's bit 14; None when the mask is unknown."""
    return None if mask is None else bool(mask & PP_OVERDRIVE_MASK)
