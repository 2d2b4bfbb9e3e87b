"""`tuner reset`: return cards to stock and verify it took."""

from __future__ import annotations

from tuner.core import exit_codes
from tuner.commands._output import format_value, print_json
from tuner.core.errors import UsageError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "reset",
        help="return a card (or all) to stock settings",
        description="Return the undervolt setting to stock and read it back. With --simulate, this restores the "
        "simulated cards.",
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument("--device", metavar="ID", help="device id from `tuner list`")
    who.add_argument("--all", action="store_true", help="every device (the default when there is only one)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args, ctx) -> int:
    backend = ctx.backend
    devices = backend.devices()
    if args.device:
        targets = [backend.device(args.device)]
    elif args.all or len(devices) == 1 or ctx.simulate:
        targets = devices
    else:
        raise UsageError("several GPUs found", "name one with --device ID or pass --all")
    results = [(dev, backend.reset(dev.id)) for dev in targets]
    if args.json:
        print_json({"reset": [{"device": d.id, "knob": k.to_dict()} for d, k in results]})
    else:
        for dev, knob in results:
            print(f"{dev.id}  {dev.label}: reset to stock ({format_value(knob.current, knob.unit)})")
    return exit_codes.OK
