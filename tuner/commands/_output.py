"""Small output helpers shared by the commands: JSON documents, warnings, aligned tables, the in-place status line,
a yes/no question on the terminal."""

from __future__ import annotations

import os
import re
import shutil
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from typing import IO

from tuner.core import json_values


def said_yes(question: str) -> bool:
    """A person's y or yes to `question`, asked on the terminal (`tuner bisect`'s consent, `tuner unsafe clear`);
    Ctrl-D, or a terminal that closed, is a no, not a traceback (EOFError maps to no exit code). Asked on stderr:
    with --json, stdout holds only the JSON."""
    print(question, end="", file=sys.stderr, flush=True)
    try:
        answer = input()
    except EOFError:  # nobody said yes
        return False
    return answer.strip().lower() in ("y", "yes")


def print_json(document: object) -> None:
    """One JSON document on stdout (what `--json` promises): strict JSON, a non-finite number is null."""
    sys.stdout.write(json_values.dumps(document, indent=2) + "\n")


def warn(warnings: Iterable[str]) -> None:
    """Each warning as its own `tuner: warning:` line on stderr."""
    for warning in warnings:
        print(f"tuner: warning: {warning}", file=sys.stderr)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; None shows as '-'. Widths in terminal columns (display_width):
    a name in CJK takes two a character, and len() would push the columns after it out of line."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(display_width(h), *(display_width(r[i]) for r in cells)) if cells else display_width(h)
              for i, h in enumerate(headers)]

    def pad(text: str, columns: int) -> str:
        return text + " " * (columns - display_width(text))

    lines = ["  ".join(pad(h, w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(pad(c, w) for c, w in zip(r, widths, strict=False)).rstrip() for r in cells]
    return "\n".join(lines)


def format_value(value: int, unit: str) -> str:
    return f"{value:+d} {unit}"


def display_width(text: str) -> int:
    """Terminal columns `text` takes: East Asian wide and fullwidth characters take two, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def fit(text: str, columns: int) -> str:
    """`text` cut to at most `columns` terminal columns (never wrapped); a cut line ends in '…'."""
    if display_width(text) <= columns:
        return text
    out, used = [], 0
    for c in text:
        w = display_width(c)
        if used + w > columns - 1:
            break
        out.append(c)
        used += w
    return "".join(out) + "…"


def wrap(text: str, columns: int, initial_indent: str = "", subsequent_indent: str = "") -> list[str]:
    """`text` wrapped to lines of at most `columns` terminal columns (textwrap counts characters: a line of CJK, two
    columns a character, came out twice as wide), at spaces, and a word wider than a line cut where it must. Nothing
    is dropped but the spaces the lines break at."""
    lines: list[str] = []
    line, empty = initial_indent, True
    for gap, word in re.findall(r"(\s*)(\S+)", text):  # the spaces between words kept, as textwrap keeps them
        gap = " " * len(gap)
        if not empty and display_width(line) + len(gap) + display_width(word) <= columns:
            line += gap + word
            continue
        if not empty:
            lines.append(line)
            line = subsequent_indent
        while display_width(line) + display_width(word) > columns:
            room, cut = columns - display_width(line), 1  # at least one character a line, or it never ends
            while cut < len(word) and display_width(word[: cut + 1]) <= room:
                cut += 1
            lines.append(line + word[:cut])
            line, word = subsequent_indent, word[cut:]
        line, empty = line + word, not word
    if not empty:
        lines.append(line)
    return lines


PROGRESS_INTERVAL_S = 0.25  # a status line that follows every step is redrawn at most this often


class StatusLine:
    """The one in-place status line of a command (bisect progress, stress progress), redrawn on a terminal.

    Every redraw is cut to the terminal's width minus one column (the last column would put the cursor in the
    wrap-pending state, where some terminals already start a new line), so an update never wraps: a wrapped
    update cannot be overwritten by the next `\r` and becomes a new line each time (issue 24: 84-column
    `trial 1 of ≤24 [####....] ... bisect ~2m03s left` lines at 80 columns, about 20 lines a trial). The width
    is read at each redraw, from the stream's own terminal, so a resized window is followed."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.shown = False
        self._last_due = 0.0

    @property
    def tty(self) -> bool:
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError, OSError):
            return False

    def columns(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            return shutil.get_terminal_size().columns

    def due(self, now: float) -> bool:
        """Whether a line that follows every step may be redrawn `now`: on a terminal, every PROGRESS_INTERVAL_S."""
        if not self.tty or now - self._last_due < PROGRESS_INTERVAL_S:
            return False
        self._last_due = now
        return True

    def show(self, text: str) -> None:
        """Replace the line with `text` (cut to the width)."""
        self.stream.write("\r\033[K" + fit(text, max(10, self.columns() - 1)))
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        """Erase the line, if one is shown, leaving the cursor at its start."""
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False

