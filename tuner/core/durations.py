"""Durations as people type them: `90`, `90s`, `5m`, `1h`, `1h30m`."""

from __future__ import annotations

import re

from tuner.core.errors import UsageError

_PART = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration_s(text: str) -> float:
    """Seconds in `text`.

    >>> parse_duration_s("90s"), parse_duration_s("5m"), parse_duration_s("1h30m"), parse_duration_s("2.5")
    (90.0, 300.0, 5400.0, 2.5)
    """
    t = str(text).strip().lower()
    try:
        value = float(t)
    except ValueError:
        parts = _PART.findall(t)
        if not parts or "".join(n + u for n, u in parts) != t:
            raise UsageError(f"bad duration {text!r}", "use seconds or a form like 90s, 5m, 1h") from None
        value = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if not value > 0 or value > 7 * 24 * 3600:
        raise UsageError(f"duration {text!r} out of range", "use a duration between 1s and 7 days")
    return value


def format_duration(seconds: float) -> str:
    """`format_duration(3725) == '1h02m'`; short forms for ETAs."""
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
