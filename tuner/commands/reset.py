"""`tuner reset`: return cards to stock and verify it took."""

from __future__ import annotations

from argparse import Namespace

from tuner.actions.context import Context
from tuner.actions.reset import reset_device, reset_targets
from tuner.commands._argtypes import Subparsers
from tuner.commands._output import format_value, print_json, warn
from tuner.core import exit_codes
from tuner.core.card_lock import describe_holder
from tuner.core.errors import TunerError


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "reset",
        help="return a card (or all) to stock settings",
        description="Return the undervolt setting to stock and read it back. With --simulate, this restores the "
        "simulated cards.",
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument("--device", metavar="ID", help="device id from `tuner list`")
    who.add_argument("--all", action="store_true", help="every device (the default when there is only one)")
    p.add_argument("--force", action="store_true",
                   help="reset even while another tuner process holds the card (a stuck holder: stopped with "
                   "Ctrl-Z, hung in the driver); the holder is named")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: Namespace, ctx: Context) -> int:
    backend = ctx.backend
    targets = reset_targets(backend, args.device, all_devices=args.all)
    if args.force:
        for dev in targets:
            holder = describe_holder(dev.id)
            if holder:
                warn([f"{dev.id} is held by {holder}; resetting it anyway (--force)"])
    results, refused = [], []
    for dev in targets:
        try:
            results.append((dev, reset_device(backend, dev.id, force=args.force)))
        except TunerError as e:  # a held card (or one that did not take stock) never keeps the others undervolted
            refused.append(e)
    if args.json:
        print_json({"reset": [{"device": d.id, "knob": k.to_dict()} for d, k in results]})
    else:
        for dev, knob in results:
            print(f"{dev.id}  {dev.label}: reset to stock ({format_value(knob.current, knob.unit)})")
    if refused:  # the first card's error is the exit code and the error line; any others are said before it
        warn(e.one_line() for e in refused[1:])
        raise refused[0]
    return exit_codes.OK
