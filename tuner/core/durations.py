"""Durations as people type them: `90`, `90s`, `5m`, `1h`, `1h30m`.

ASCII only: Python's float() and int() also take other scripts' digits (`٣٠`), underscores (`3_0`), `inf` and
`nan`; a duration here is ASCII digits with an optional decimal part, and each unit (h, m, s) at most once, in
that order (`5m5m` is a mistake, not ten minutes). Under 1 s is too short to measure anything: an error.
"""

from __future__ import annotations

import re

from tuner.core.errors import UsageError

_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_PLAIN = re.compile(_NUMBER)
_UNITS = re.compile(rf"(?:(?P<h>{_NUMBER})h)?(?:(?P<m>{_NUMBER})m)?(?:(?P<s>{_NUMBER})s)?")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0}
MIN_DURATION_S = 1.0
MAX_DURATION_S = 7 * 24 * 3600.0


def parse_duration_s(text: str) -> float:
    """Seconds in `text`.

    >>> parse_duration_s("90s"), parse_duration_s("5m"), parse_duration_s("1h30m"), parse_duration_s("2.5")
    (90.0, 300.0, 5400.0, 2.5)
    """
    t = str(text).strip().lower()
    if _PLAIN.fullmatch(t):
        value = float(t)
    else:
        m = _UNITS.fullmatch(t)
        if not t or m is None:
            raise UsageError(f"bad duration {text!r}", "use seconds or a form like 90s, 5m, 1h30m (ASCII digits, "
                             "each unit once)")
        value = sum(float(n) * _UNIT_S[u] for u, n in m.groupdict().items() if n is not None)
    if not MIN_DURATION_S <= value <= MAX_DURATION_S:
        raise UsageError(f"duration {text!r} out of range", "use a duration between 1s and 7 days")
    return value


def duration_text(seconds: float) -> str:
    """A duration as `--trial` takes it, in the largest whole unit: "30m", "90s"."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:g}{unit}"
    return f"{seconds:g}s"


def format_duration(seconds: float) -> str:
    """`format_duration(3725) == '1h02m'`; short forms for ETAs."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
