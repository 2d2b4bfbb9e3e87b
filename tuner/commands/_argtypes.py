"""argparse `type=` converters shared by the commands. Each raises ArgumentTypeError, which the parser turns into
one `tuner: error:` line and exit 2."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any, Protocol

from tuner.core.durations import parse_duration_s
from tuner.core.errors import UsageError
from tuner.core.numbers import parse_whole_number


class Subparsers(Protocol):
    """What each command's `add_parser(subparsers)` is given: argparse's subparsers, or tuner.cli's wrapper that adds
    the global options to every command (it has the one method the commands use)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


# ASCII only, as whole numbers are (tuner.core.numbers): float() also accepts other scripts' digits and underscores.
_DECIMAL = re.compile(r"[+-]?[0-9]{1,18}(?:\.[0-9]{1,9})?")


def whole_number(text: str) -> int:
    try:
        return parse_whole_number(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def seconds_between(low_s: float, high_s: float) -> Callable[[str], float]:
    """A converter for a plain number of seconds in [low_s, high_s]."""

    def convert(text: str) -> float:
        if not _DECIMAL.fullmatch(text.strip()):
            raise argparse.ArgumentTypeError(f"expected seconds (ASCII digits), got {text!r}")
        value = float(text)
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
