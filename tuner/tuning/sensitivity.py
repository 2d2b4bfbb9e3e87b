"""What the weaker comparison (`--tolerance`, "reduced" sensitivity) costs, as measured: the share of
consequential single-bit flips a tolerance comparison catches on their own step, against the bitwise reference.

Figures from `bench/engine_detection.py --parts D --trials 10` (tiny preset, CPU, fp32 and bf16, 11 sites of a
training step, 206 consequential flips: 206 caught bit for bit on their own step, 4 by the tolerance comparison;
see docs/engine.md "Detection"); rerun it and update them when the detectors change.
"""

from __future__ import annotations

TOLERANCE_CAUGHT_PCT = 1.9  # --tolerance: caught on their own step, % of consequential flips
BITWISE_CAUGHT_PCT = 100.0  # bit for bit (the default)
_CATCHES = (f"catches {TOLERANCE_CAUGHT_PCT:g} % of consequential single-bit flips on their own step, against "
            f"{BITWISE_CAUGHT_PCT:g} % bit for bit")


def detection_rate_text() -> str:
    """The measured detection rate of the reduced-sensitivity mode, in words for any front end."""
    return f"reduced sensitivity: {_CATCHES}"


def tolerance_note() -> str:
    return (f"reduced sensitivity (--tolerance): the tolerance comparison {_CATCHES} (bench/engine_detection.py); "
            "a silent miscomputation at a setting may go unnoticed")
