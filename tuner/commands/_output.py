"""Small output helpers shared by the commands: JSON documents and plain aligned tables."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tuner.core import json_values


def print_json(document) -> None:
    """One JSON document on stdout (what `--json` promises): strict JSON, a non-finite number is null."""
    sys.stdout.write(json_values.dumps(document, indent=2) + "\n")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; None shows as '-'."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in cells]
    return "\n".join(lines)


def format_value(value: int, unit: str) -> str:
    return f"{value:+d} {unit}"
