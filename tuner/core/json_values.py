"""JSON out of Python numbers: JSON has no NaN or Infinity (RFC 8259 section 6), so a non-finite float is written
as null, never as the `NaN` Python's json module would emit (which no strict parser reads back).

One rule for every JSON document the tuner writes for a reader (`--json` output, `tuner report x.json`).
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every NaN or +-Infinity (at any depth of dicts, lists and tuples) replaced by None.

    >>> finite({"tok_per_j": float("nan"), "trials": [1.5, float("inf")], "note": "ok"})
    {'tok_per_j': None, 'trials': [1.5, None], 'note': 'ok'}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(document: Any, **kwargs: Any) -> str:
    """`json.dumps` that writes strict JSON: non-finite numbers become null, anything else unknown its str()."""
    kwargs.setdefault("default", str)
    return json.dumps(finite(document), allow_nan=False, **kwargs)
