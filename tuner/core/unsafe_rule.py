"""The unsafe-list rule, as a pure function: a value at or beyond a setting that failed hard is refused.

"Beyond" is in the knob's aggressive direction: with -60 mV on the list, -60 and -65 are refused and -55 is not.
The root helper applies it to the machine's list before every write; `tuner.tuning.journal.refuse_unsafe` states
the same rule for the per-user list (it should call this one once the journal modules are merged).
"""

from __future__ import annotations

from collections.abc import Iterable

from tuner.core.models import Knob


def blocking_setting(knob: Knob, value: int, unsafe: Iterable[int]) -> int | None:
    """The least aggressive listed setting that `value` is at or beyond, or None when nothing blocks it.

    >>> from tuner.core.models import KnobKind
    >>> knob = Knob(KnobKind.VOLTAGE_OFFSET, "mV", 0, 0, -200, 0, 5, -1)
    >>> blocking_setting(knob, -65, [-80, -60]), blocking_setting(knob, -55, [-60])
    (-60, None)
    """
    blocking = [s for s in unsafe if s == value or knob.more_aggressive(value, s)]
    if not blocking:
        return None
    return max(blocking, key=lambda s: (s - knob.stock) * -knob.aggressive_direction)
