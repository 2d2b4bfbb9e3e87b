"""`tuner doctor`: environment checks, each with a one-line remedy."""

from __future__ import annotations

from argparse import Namespace

from tuner.actions.context import Context
from tuner.actions.doctor import FAIL, run_checks
from tuner.commands._argtypes import Subparsers
from tuner.commands._output import print_json
from tuner.core import exit_codes

_MARK = {"ok": "[ ok ]", "warn": "[warn]", "fail": "[FAIL]", "info": "[info]"}


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="check drivers, kernel settings, permissions and the torch build",
        description="Check that this machine is ready to tune: Python and packages, the torch build and the GPUs "
        "it sees, the NVIDIA driver and persistence mode, the amdgpu overdrive bit (with the exact "
        "ppfeaturemask to add), pp_od_clk_voltage per card, root, the kernel log, and variables that hide GPUs. "
        "Exits 0 when nothing failed, 4 when a check failed (no supported GPU found is a failed check).",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: Namespace, ctx: Context) -> int:
    checks = run_checks(simulate=ctx.simulate)
    failed = any(c.status == FAIL for c in checks)
    if args.json:
        print_json({"ok": not failed, "checks": [c.to_dict() for c in checks]})
    else:
        for c in checks:
            print(f"{_MARK[c.status]} {c.name}: {c.detail}")
            if c.remedy and c.status != "ok":
                print(f"       -> {c.remedy}")
    if failed and not args.json:
        print(f"{sum(c.status == FAIL for c in checks)} check(s) failed: not ready to tune (exit "
              f"{exit_codes.UNSUPPORTED})")
    return exit_codes.UNSUPPORTED if failed else exit_codes.OK
