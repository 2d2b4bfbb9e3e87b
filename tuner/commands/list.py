"""`tuner list`: the GPUs found, with their undervolt knob."""

from __future__ import annotations

from argparse import Namespace

from tuner.actions.context import Context
from tuner.commands._argtypes import Subparsers
from tuner.commands._device import knob_or_error
from tuner.commands._output import format_table, format_value, print_json
from tuner.core import exit_codes


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "list",
        help="list the GPUs found and their undervolt knob",
        description="List the GPUs found, with each one's current setting, stock value and range.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: Namespace, ctx: Context) -> int:
    backend = ctx.backend
    entries = [(dev, *knob_or_error(backend, dev.id)) for dev in backend.devices()]
    if args.json:
        print_json(
            {"backend": backend.name, "simulated": backend.simulated,
             "devices": [{**dev.to_dict(), "knob": knob and knob.to_dict(),
                          **({"error": error.one_line()} if error else {})}
                         for dev, knob, error in entries]}
        )
        return exit_codes.OK
    rows = [
        (dev.id, dev.label, format_value(knob.current, knob.unit),
         f"{knob.min:+d}..{knob.max:+d} {knob.unit} step {knob.step}")
        if knob else (dev.id, dev.label, "unsupported", error and error.one_line())
        for dev, knob, error in entries
    ]
    print(format_table(("DEVICE", "NAME", "SETTING", "RANGE"), rows))
    return exit_codes.OK
