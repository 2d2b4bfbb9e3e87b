"""Whole numbers as people type them, for the CLI's arguments and the UI's form fields alike: ASCII digits and a
sign only (Python's int() also takes other scripts' digits, `-٣٠`, and underscores, `-3_0`), at most 18 digits (more
than any knob or count needs, and clear of int()'s 4,300-digit limit), optionally followed by the unit the field is in.
"""

from __future__ import annotations

import re

_WHOLE = re.compile(r"[+-]?[0-9]{1,18}")


def parse_whole_number(text: str, unit: str = "") -> int:
    """The whole number in `text` ("15", "-40", "15 MHz" when `unit` is "MHz"); ValueError when it is not one.

    >>> parse_whole_number("-40"), parse_whole_number(" 15 mhz", "MHz")
    (-40, 15)
    """
    number = text.strip()
    if unit and number.lower().endswith(unit.lower()):
        number = number[: -len(unit)].strip()
    if not _WHOLE.fullmatch(number):
        raise ValueError(f"expected a whole number (ASCII digits and a sign), got {text!r}")
    return int(number, 10)
