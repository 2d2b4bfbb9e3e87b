"""`tuner unsafe list | clear`: the values that froze, hung or reset a card in a trial (see tuner.tuning.journal).

Those values are never applied again automatically: set and apply refuse them (without --ignore-unsafe), boot
apply and bisect always. Clearing one is the user's call, after asking: the next bisect may try it again.
"""

from __future__ import annotations

import sys
import time
from argparse import Namespace

from tuner.actions import safety_files
from tuner.actions.context import Context
from tuner.commands._argtypes import Subparsers
from tuner.commands._device import pick_device
from tuner.commands._output import format_table, format_value, print_json, said_yes
from tuner.core import exit_codes
from tuner.core.argtypes import whole_number
from tuner.core.errors import UsageError
from tuner.core.models import printable


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "unsafe",
        help="show or clear the values that froze, hung or reset a card in a trial",
        description="Show or clear a card's unsafe list: settings that reset the machine, hung or lost the GPU "
        "during a trial. They are never applied again automatically. A tuner that died, a full disk or an engine "
        "killed from outside never adds an entry (such a trial is re-run instead).",
    )
    sub = p.add_subparsers(dest="unsafe_command", metavar="ACTION", required=True)
    q = sub.add_parser("list", help="show the entries")
    q.add_argument("--device", metavar="ID", help="device id from `tuner list` (default: all)")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(run=run_list)
    q = sub.add_parser("clear", help="remove entries (asks first)")
    q.add_argument("value", nargs="?", type=whole_number, metavar="VALUE",
                   help="remove only this setting (default: every entry of the card)")
    q.add_argument("--device", metavar="ID", help="device id from `tuner list` (default: the only card)")
    q.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(run=run_clear)


def _when(entry: dict) -> str:
    """The entry's time, or '-' when it holds none a clock can show (NaN, Infinity, 1e308, a string)."""
    at = entry.get("recorded_at")
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if isinstance(at, int | float) else "-"
    except (OverflowError, ValueError, OSError):
        return "-"


def _row(device_id: str, entry: dict) -> tuple[str, ...]:
    """One table row, whatever the entry holds (the schema decides what is valid; this line never fails)."""
    setting, unit = entry.get("setting"), entry.get("unit")
    shown = format_value(setting, unit if isinstance(unit, str) else "") \
        if isinstance(setting, int) and not isinstance(setting, bool) else printable(repr(setting))[:12]
    return (device_id, shown, printable(str(entry.get("kind", "-")))[:20], "yes" if entry.get("edge") else "no",
            _when(entry), printable(str(entry.get("reason") or ""))[:60])


def run_list(args: Namespace, ctx: Context) -> int:
    devices = [ctx.backend.device(args.device)] if args.device is not None else ctx.backend.devices()
    report = {d.id: safety_files.unsafe_entries(d.id, ctx.backend) for d in devices}
    if args.json:
        print_json({"unsafe": [{"device": d, "entries": entries} for d, entries in report.items()]})
        return exit_codes.OK
    rows = [_row(d, e) for d, entries in report.items() for e in entries]
    if not rows:
        print("no unsafe values recorded")
        return exit_codes.OK
    print(format_table(("DEVICE", "SETTING", "KIND", "EDGE", "RECORDED", "REASON"), rows))
    return exit_codes.OK


def _ask(question: str) -> bool:
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        raise UsageError("clearing the unsafe list needs a yes", "pass --yes to clear without asking")
    return said_yes(question)


def run_clear(args: Namespace, ctx: Context) -> int:
    device_id = pick_device(ctx.backend, args.device).id
    # as the card's writer (CardBusy while a bisect or verify holds it): they append to this list, and a line
    # appended between our read and our rewrite would be lost; the root helper refuses its own list's clear alike
    with ctx.backend.holding(device_id, "tuner unsafe clear"):
        entries = safety_files.unsafe_entries(device_id, ctx.backend)
        doomed = [e for e in entries if args.value is None or e["setting"] == args.value]
        if not doomed:
            what = "" if args.value is None else f" for {args.value:+d}"
            raise UsageError(f"no unsafe entry{what} on {device_id}", "see `tuner unsafe list`")
        # sorted as numbers, not as text ("-10 mV" sorts before "-100 mV" as text)
        values = ", ".join(format_value(setting, unit)
                           for setting, unit in sorted({(e["setting"], e.get("unit") or "") for e in doomed}))
        if not args.yes and not _ask(f"Remove {values} from {device_id}'s unsafe list? They froze, hung or reset "
                                     "the card; bisect may try them again. [y/N] "):
            raise UsageError("nothing was cleared", "answer y, or pass --yes")
        removed = safety_files.clear_unsafe(device_id, args.value, ctx.backend)
    if args.json:
        print_json({"device": device_id, "removed": removed})
    else:
        print(f"removed {values} from {device_id}'s unsafe list")
    return exit_codes.OK
