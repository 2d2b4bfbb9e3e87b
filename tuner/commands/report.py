"""`tuner report FILE`: the latest bisect session's trials as CSV or JSON (by the file's suffix)."""

from __future__ import annotations

from argparse import Namespace

from tuner.actions.context import Context
from tuner.actions.exports import report_export_path
from tuner.actions.report import last_session, write_report
from tuner.commands._argtypes import Subparsers
from tuner.commands._device import pick_device
from tuner.core import exit_codes


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="export the latest bisect's trials as CSV or JSON",
        description="Write the latest bisect session's trials (finished or not) for a device to FILE: CSV when it "
        "ends in .csv (one row per trial), JSON when it ends in .json (the session, its trials and the "
        "recommendation). The UI's Bisect screen exports the same (key e).",
    )
    p.add_argument("file", metavar="FILE", nargs="?",
                   help="where to write: NAME.csv or NAME.json (default: bisect-DEVICE-SESSION.csv in the current "
                   "directory)")
    p.add_argument("--device", metavar="ID", help="device id from `tuner list` (default: the only one)")
    p.add_argument("--overwrite", action="store_true", help="replace FILE if it exists")
    p.set_defaults(run=run)


def run(args: Namespace, ctx: Context) -> int:
    device = pick_device(ctx.backend, args.device)
    doc = last_session(device.id)
    trials = doc.get("trials") or []
    target = args.file if args.file is not None else report_export_path(device.id, doc.get("session"))
    path = write_report(target, trials, device_id=device.id, session=doc.get("session"),
                        simulated=device.simulated, recommendation=doc.get("recommendation"),
                        overwrite=args.overwrite)
    print(f"wrote {len(trials)} trials of session {doc.get('session')} on {device.id} to {path}")
    return exit_codes.OK
