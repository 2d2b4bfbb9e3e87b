"""argparse `type=` converters shared by the commands. Each raises ArgumentTypeError, which the parser turns into
one `tuner: error:` line and exit 2."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from tuner.core.durations import parse_duration_s
from tuner.core.errors import UsageError


def whole_number(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def seconds_between(low_s: float, high_s: float) -> Callable[[str], float]:
    """A converter for a plain number of seconds in [low_s, high_s]."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
        if not low_s <= value <= high_s:
            raise argparse.ArgumentTypeError(f"expected {low_s:g}..{high_s:g} seconds, got {text!r}")
        return value

    return convert


def duration(text: str) -> float:
    """`90s`, `5m`, `1h` (see tuner.core.durations)."""
    try:
        return parse_duration_s(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(e.one_line()) from None
