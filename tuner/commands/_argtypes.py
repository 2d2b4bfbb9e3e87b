"""The commands' argparse pieces: what `add_parser` is given, and the options of the declared parameters (their
converters raise ArgumentTypeError, which the parser turns into one `tuner: error:` line and exit 2; the converters
the helper shares are tuner.core.argtypes)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any, Protocol

from tuner.actions.parameters import Parameter
from tuner.core.argtypes import argparse_type


class Subparsers(Protocol):
    """What each command's `add_parser(subparsers)` is given: argparse's subparsers, or tuner.cli's wrapper that adds
    the global options to every command (it has the one method the commands use)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_arguments(parser: argparse._ActionsContainer, params: Iterable[Parameter]) -> None:
    """Each declared parameter as its option (tuner.actions.parameters). Argparse converts a whole number or a choice
    with the parameter's parser (`argument --step: <its words>`); a duration is kept as typed for the command."""
    for p in params:
        if p.parser is None and not p.choices:  # on or off
            parser.add_argument(p.flag, action=argparse.BooleanOptionalAction, help=p.help)
        else:
            parser.add_argument(p.flag, type=str if p.later else argparse_type(p.parse), metavar=p.metavar,
                                choices=p.choices or None, default=p.default, help=p.help)
