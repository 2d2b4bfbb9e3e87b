"""`tuner list`: the GPUs found, with their undervolt knob."""

from __future__ import annotations

from tuner import exit_codes
from tuner.commands._output import format_table, format_value, print_json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "list",
        help="list the GPUs found and their undervolt knob",
        description="List the GPUs found, with each one's current setting, stock value and range.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args, ctx) -> int:
    backend = ctx.backend
    entries = [(dev, backend.knob(dev.id)) for dev in backend.devices()]
    if args.json:
        print_json(
            {"backend": backend.name, "simulated": backend.simulated,
             "devices": [{**dev.to_dict(), "knob": knob.to_dict()} for dev, knob in entries]}
        )
        return exit_codes.OK
    rows = [
        (dev.id, dev.label, format_value(knob.current, knob.unit),
         f"{knob.min:+d}..{knob.max:+d} {knob.unit} step {knob.step}")
        for dev, knob in entries
    ]
    print(format_table(("DEVICE", "NAME", "SETTING", "RANGE"), rows))
    return exit_codes.OK
