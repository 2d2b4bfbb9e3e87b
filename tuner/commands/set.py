"""`tuner set`: apply one undervolt setting, then keep it only if confirmed in time.

The prompt is `tuner.commands._confirm` (shared with `apply`): on a terminal it counts down; otherwise a `y`/`yes`
line on stdin keeps, any other line or EOF reverts at once (so `echo y | tuner set ...` works and
`tuner set ... </dev/null` never keeps anything). Every signal that would end the process reverts first; Ctrl-Z
reverts, then stops. `--yes` keeps without asking. While the change is pending this process holds the card's
writer lock: a second `set`, `apply`, `reset` or bisect is refused (exit 6).

Exit codes: 0 kept; 2 bad value (nothing written); 3 permission; 4 unsupported; 5 the card did not take it
(previous value restored); 6 the card is busy; 8 not confirmed (reverted); 130 interrupted (reverted).
"""

from __future__ import annotations

import time
from argparse import Namespace

from tuner.actions import other_tools
from tuner.actions.context import Context
from tuner.actions.keep_or_revert import DEFAULT_TIMEOUT_S, PendingChange
from tuner.actions.setting import SetRequest, prepare_setting
from tuner.commands._argtypes import Subparsers
from tuner.commands._confirm import keep_or_revert, say_applied, say_reverted
from tuner.commands._device import pick_device
from tuner.commands._output import format_value, print_json, warn
from tuner.core import exit_codes
from tuner.core.argtypes import seconds_between, whole_number


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "set",
        help="apply an undervolt setting, then keep or revert it",
        description="Apply one undervolt setting (AMD: voltage offset in mV, negative undervolts; NVIDIA: graphics "
        "clock offset in MHz at a locked max clock, positive undervolts), read it back, and ask whether to keep "
        "it. No answer within the timeout, EOF, Ctrl-C, SIGTERM or SIGHUP reverts to the previous value. When stdin "
        "is not a terminal, a 'y' line on stdin keeps; anything else reverts.",
    )
    p.add_argument("--device", metavar="ID", help="device id from `tuner list` (optional with one GPU)")
    p.add_argument(
        "--offset",
        metavar="VALUE",
        type=whole_number,
        required=True,
        help="the setting in the knob's unit (see `tuner list`), e.g. -50",
    )
    p.add_argument("--yes", action="store_true", help="keep without asking (scripts)")
    p.add_argument(
        "--keep-timeout",
        metavar="S",
        type=seconds_between(1, 600),
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds to wait for confirmation before reverting (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    p.add_argument(
        "--allow-overvolt",
        action="store_true",
        help="allow a setting on the less efficient side of stock (more voltage than stock)",
    )
    p.add_argument(
        "--lock-mhz",
        metavar="MHZ",
        type=whole_number,
        help="NVIDIA: the max graphics clock to lock to (default: the card's stock max boost)",
    )
    p.add_argument("--ignore-unsafe", action="store_true",
                   help="apply even a value at or beyond one that froze, hung or reset this card in a trial")
    p.add_argument("--json", action="store_true", help="print one JSON document (the prompt goes to stderr)")
    p.set_defaults(run=run)


def run(args: Namespace, ctx: Context) -> int:
    backend = ctx.backend
    dev = pick_device(backend, args.device)
    request = SetRequest(dev.id, args.offset, allow_overvolt=args.allow_overvolt,
                         ignore_unsafe=args.ignore_unsafe, lock_clock_mhz=args.lock_mhz)
    change = prepare_setting(backend, request, timeout_s=args.keep_timeout, clock=time.monotonic,
                             purpose=f"tuner set --offset {args.offset:+d}")
    warn(other_tools.warnings_for(backend, [dev.id]))  # issue 23: warned, not refused (a person confirms)

    def announce(change: PendingChange) -> None:
        locked = change.applied.lock_clock_mhz if change.applied else None
        say_applied(change, dev, f" at a locked {locked} MHz" if locked else "", as_json=args.json)

    answer = keep_or_revert(change, announce=announce, yes=args.yes)
    applied = change.applied
    assert applied is not None and change.before is not None  # keep_or_revert applied it (or raised)
    if args.json:
        print_json(
            {
                "device": dev.id,
                "before": change.before.to_dict(),
                "applied": applied.to_dict(),
                "kept": change.kept,
                "reverted_to": change.reverted_to.to_dict() if change.reverted_to else None,
            }
        )
    if change.kept:
        if not args.json:
            print(
                f"kept {format_value(applied.current, applied.unit)} (not saved: it lasts until reboot or "
                "`tuner reset`)"
            )
        return exit_codes.OK
    return say_reverted(answer, change)
