"""The keep-or-revert prompt `tuner set` and `tuner apply` share, and the signals around it.

While a change waits for an answer this process owns the card, so fatal signals (a hang-up, Ctrl-C, Ctrl-\\,
SIGTERM, USR1/2, ALRM, PIPE) are only recorded (`signals.Inbox`) and wake the prompt, which then reverts; nothing
is raised half-way through the write or the revert. Ctrl-Z reverts first and only then stops the process (a
stopped process could never revert in time).

Confirmation is read from stdin with a select()-based timeout. On a terminal the prompt counts down. When stdin is
not a terminal it is still read: a `y`/`yes` line keeps, any other line or EOF reverts at once, and no line within
the timeout reverts. A closed stdin reverts at once.
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import IO, TypeVar

from tuner.actions.keep_or_revert import PendingChange
from tuner.actions.profile_apply import RigChange
from tuner.commands._output import format_value
from tuner.core import exit_codes, signals
from tuner.core.models import DeviceInfo, Knob


class Answer(StrEnum):
    KEPT = "kept"
    NOT_CONFIRMED = "not-confirmed"  # no yes in time, a no, EOF, or Ctrl-Z: reverted
    INTERRUPTED = "interrupted"  # a fatal signal: reverted


# one card's change or a rig's (every card at once): the same apply, announce, ask, keep-or-revert
Change = TypeVar("Change", PendingChange, RigChange)


def keep_or_revert(change: Change, *, announce: Callable[[Change], None], yes: bool = False) -> Answer:
    """Apply `change`, announce it, keep it only on a yes in time; revert on anything else. Returns what happened
    (`change.reverted_to` says where a revert left the card)."""
    with signals.Inbox(stop_signals=True) as inbox, change:  # applies now; reverts on leaving unless kept
        announce(change)
        if inbox.received:
            pass  # a signal arrived while it was applied: revert at once
        elif yes or _ask(change, inbox, sys.stdin, sys.stderr):
            change.keep()
    if inbox.first is not None:
        return Answer.INTERRUPTED
    if inbox.stop_requested:
        signals.stop_now()  # the card is back; now stop, as Ctrl-Z asked
    return Answer.KEPT if change.kept else Answer.NOT_CONFIRMED


def say_applied(change: PendingChange, device: DeviceInfo, note: str, *, as_json: bool) -> None:
    """`ID  LABEL: BEFORE -> AFTER NOTE (read back)`: one card's change, announced once applied and read back; on
    stderr with --json (stdout holds the one document)."""
    before, applied = change.before, change.applied
    assert before is not None and applied is not None  # announced once applied and read back
    print(f"{device.id}  {device.label}: {format_value(before.current, applied.unit)} -> "
          f"{format_value(applied.current, applied.unit)}{note} (read back)",
          file=sys.stderr if as_json else sys.stdout, flush=True)


def say_reverted(answer: Answer, change: PendingChange | RigChange) -> int:
    """Say on stderr why a change was not kept and where the revert left each card (and why a card went to stock
    instead of its previous value, when one did); the exit code for that."""
    notes = change.restore_notes

    def left(device_id: str, knob: Knob) -> str:
        note = f" ({notes[device_id]})" if device_id in notes else ""
        return f"to {format_value(knob.current, knob.unit)}{note}"

    if isinstance(change, PendingChange):
        assert change.reverted_to is not None  # not kept: leaving keep_or_revert reverted it (or raised)
        where = left(change.device_id, change.reverted_to)
    else:
        where = "every card (" + ", ".join(f"{d} {left(d, k)}" for d, k in change.reverted_to.items()) + ")"
    why = "interrupted" if answer is Answer.INTERRUPTED else "not confirmed"
    print(f"{why}: reverted {where}", file=sys.stderr)
    return exit_codes.INTERRUPTED if answer is Answer.INTERRUPTED else exit_codes.NOT_CONFIRMED


def _ask(change: PendingChange | RigChange, inbox: signals.Inbox, stream: IO[str] | None, out: IO[str]) -> bool:
    """True when the user answers yes before the change expires; False on anything else, a signal included."""
    if stream is None:  # started with stdin closed (`<&-`): no one can answer, so no
        return False
    try:
        tty = stream.isatty()
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return False
    wake = [fd] + ([inbox.fd] if inbox.fd is not None else [])
    shown = None
    while not change.expired() and not inbox.received:
        left = change.seconds_left()
        if tty and shown != int(left + 0.999):
            shown = int(left + 0.999)
            out.write(f"\rkeep? [y/N], reverting in {shown:2d} s ")
            out.flush()
        elif shown is None:
            shown = int(left + 0.999)
            out.write(f"keep? [y/N], reverting in {shown} s\n")
            out.flush()
        ready, _, _ = select.select(wake, [], [], min(1.0, max(0.05, left)))
        if fd not in ready:
            inbox.drain()
            continue
        try:
            line = os.read(fd, 256).decode(errors="replace")
        except OSError:  # EIO: a background job's read of its terminal (signals.TERMINAL_STOPS), a hung-up one
            return False
        if tty:
            out.write("\n")
        return line.strip().lower() in ("y", "yes")  # EOF reads b"" and is a no
    if tty:
        out.write("\n")
    return False
