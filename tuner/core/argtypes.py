"""The command lines' shared argparse pieces (`tuner` and `tuner-helper` alike): a parser whose usage errors are one
line and exit 2 like every other bad input, and `type=` converters that raise ArgumentTypeError (argparse's one
line). Numbers are ASCII only (tuner.core.numbers): int() and float() also take other scripts' digits, underscores,
`nan` and `inf`."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any, NoReturn

from tuner.core import exit_codes
from tuner.core.durations import parse_duration_s
from tuner.core.errors import UsageError
from tuner.core.numbers import parse_whole_number

# A decimal number as the command line takes it (seconds, rates): ASCII digits, a sign and a point, no exponent.
DECIMAL = re.compile(r"[+-]?[0-9]{1,18}(?:\.[0-9]{1,9})?")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2 (argparse's own prints the whole usage block first), and a
    comma list of negative numbers (`--sim-vmin -52,-67,-40`) is a value, not an option (argparse knows only single
    numbers). The line names the command (`tuner`, `tuner-helper`) and where its help is (`tuner set --help`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\d+(?:,\S*)?$|^-\d*\.\d+$")

    def error(self, message: str) -> NoReturn:
        self.exit(exit_codes.USAGE, f"{self.prog.split()[0]}: error: {message} (see `{self.prog} --help`)\n")


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
        if not DECIMAL.fullmatch(text.strip()):
            raise argparse.ArgumentTypeError(f"expected seconds (ASCII digits), got {text!r}")
        value = float(text)
        if not low_s <= value <= high_s:
            raise argparse.ArgumentTypeError(f"expected {low_s:g}..{high_s:g} seconds, got {text!r}")
        return value

    return convert
