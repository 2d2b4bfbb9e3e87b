"""argparse `type=` converters shared by the commands, and the options of the declared parameters. Each converter
raises ArgumentTypeError, which the parser turns into one `tuner: error:` line and exit 2."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from tuner.actions.parameters import Parameter
from tuner.core.durations import parse_duration_s
from tuner.core.errors import UsageError
from tuner.core.numbers import parse_whole_number


class Subparsers(Protocol):
    """What each command's `add_parser(subparsers)` is given: argparse's subparsers, or tuner.cli's wrapper that adds
    the global options to every command (it has the one method the commands use)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


# ASCII only, as whole numbers are (tuner.core.numbers): float() also accepts other scripts' digits and underscores.
_DECIMAL = re.compile(r"[+-]?[0-9]{1,18}(?:\.[0-9]{1,9})?")


def argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` as argparse's `type=`: its ValueError or UsageError becomes argparse's one line."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, UsageError) as e:
            raise argparse.ArgumentTypeError(e.one_line() if isinstance(e, UsageError) else str(e)) from None

    return convert


whole_number = argparse_type(parse_whole_number)
duration = argparse_type(parse_duration_s)  # `90s`, `5m`, `1h` (see tuner.core.durations)


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


def add_arguments(parser: argparse._ActionsContainer, params: Iterable[Parameter]) -> None:
    """Each declared parameter as its option (tuner.actions.parameters). Argparse converts a whole number or a choice
    with the parameter's parser (`argument --step: <its words>`); a duration is kept as typed for the command."""
    for p in params:
        if p.parser is None and not p.choices:  # on or off
            parser.add_argument(p.flag, action=argparse.BooleanOptionalAction, help=p.help)
        else:
            parser.add_argument(p.flag, type=str if p.later else argparse_type(p.parse), metavar=p.metavar,
                                choices=p.choices or None, default=p.default, help=p.help)
