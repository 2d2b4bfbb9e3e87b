"""`tuner reference record|show`: the portable stock reference a fleet screens its cards against (docs/screen.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.actions.parameters import PRESET
from tuner.commands._argtypes import Subparsers
from tuner.commands._device import pick_device
from tuner.commands._output import print_json
from tuner.core import exit_codes
from tuner.core.argtypes import whole_number

if TYPE_CHECKING:
    from tuner.actions.context import Context
    from tuner.actions.screen.attribution import Tier

TIER_HELP = ("quick (30 s of load, like DCGM level 1; the default), standard (2 min, level 2) or long (15 min, "
             "level 3); also 1, 2, 3")


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "reference",
        help="record or show a portable stock reference (for `tuner screen` on other machines)",
        description="A portable reference is a card's stock training trajectory (every step's loss, gradient norm "
        "and training-state checksum) with the fingerprint that says where those bits can be expected again: the "
        "must-match fields (tuner version, GPU model and PCI id, VBIOS family on AMD, driver, torch and its "
        "CUDA/ROCm build, deterministic settings and kernel environment, preset, batch, dtype, seed, data hash) "
        "and the may-differ ones (host, PCI slot, serial, board). Compressed, with a hash over content and "
        "fingerprint. `tuner screen --reference FILE` compares cards with it.",
    )
    sub = p.add_subparsers(dest="reference_command", metavar="ACTION", required=True)

    q = sub.add_parser("record", help="record this card's stock trajectory for one tier, proven, into FILE",
                       description="Record at stock for the tier's load, replay the same steps in a second engine "
                       "process bit for bit (a reference that does not repeat would fail every card compared with "
                       "it), then write the bundle. The card must be at stock; nothing on it changes.",
                       epilog="examples:\n  tuner reference record --device 0000:03:00.0 --tier standard --out "
                       "r9700.ref\n  tuner --simulate reference record --device sim0 --tier quick --out A.ref")
    q.add_argument("--device", metavar="ID", help="device id from `tuner list` (default: the only card)")
    q.add_argument("--tier", default="quick", metavar="TIER", help=TIER_HELP)
    q.add_argument("--duration", metavar="DUR", help="load to record instead of the tier's (e.g. 10s, 5m): tier "
                   "'custom'")
    q.add_argument("--out", required=True, metavar="FILE", help="the bundle to write (e.g. stock.ref)")
    q.add_argument("--overwrite", action="store_true", help="replace FILE if it exists")
    q.add_argument("--preset", choices=PRESET.choices,
                   help="model size (default: nanochat on GPUs, tiny on a simulated card)")
    q.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="compute dtype (default: the engine's)")
    q.add_argument("--seed", type=whole_number, default=0, help="model and data seed (default 0)")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(run=run_record)

    q = sub.add_parser("show", help="what a reference file holds: its fingerprint, size and recording")
    q.add_argument("file", metavar="FILE")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(run=run_show)


def tier_of(args: argparse.Namespace) -> Tier:
    """The tier asked for, or a custom one with `--duration`."""
    from dataclasses import replace

    from tuner.actions.screen.attribution import tier_named
    from tuner.core.durations import parse_duration_s
    from tuner.core.errors import UsageError
    try:
        tier = tier_named(args.tier)
    except ValueError as e:
        raise UsageError(f"--tier: {e}") from None
    if args.duration is not None:
        tier = replace(tier, name="custom", load_s=parse_duration_s(args.duration), dcgm_level=None)
    return tier


def run_record(args: argparse.Namespace, ctx: Context) -> int:
    from tuner.actions.screen.record import RecordRequest, check_destination, record_reference
    tier = tier_of(args)
    backend = ctx.backend
    device = pick_device(backend, args.device)
    out = Path(args.out)
    check_destination(out, args.overwrite)  # bad input: one line, before the announcement (the action checks again)
    if not args.json:
        print(f"{device.id}  {device.label}: recording the stock reference ({tier.name}, {tier.load_s:g} s of "
              "load), then replaying it in a second engine process", file=sys.stderr, flush=True)
    outcome = record_reference(backend, RecordRequest(device.id, tier, out, overwrite=args.overwrite,
                                                      preset=args.preset, seed=args.seed, dtype=args.dtype))
    if args.json:
        print_json(_show_doc(outcome.bundle, outcome.path, outcome.size_bytes))
    else:
        r = outcome.bundle.recording
        print(f"wrote {outcome.path} ({_size(outcome.size_bytes)}): {r.steps:,} steps of {outcome.bundle.preset}, "
              f"replayed bit for bit ({r.replayed_steps:,} steps), sha256 {outcome.bundle.sha256[:16]}")
    return exit_codes.OK


def run_show(args: argparse.Namespace, ctx: Context) -> int:
    from tuner.profiles import reference_bundle as rb
    path = Path(args.file)
    bundle = rb.read_bundle(path)
    doc = _show_doc(bundle, path, path.stat().st_size)
    if args.json:
        print_json(doc)
        return exit_codes.OK
    r = bundle.recording
    lines = [(f"{path}  ({_size(doc['size_bytes'])}, sha256 {bundle.sha256[:16]}, tuner {bundle.tuner_version}, "
             f"{bundle.created})"),
             (f"  recording   {r.steps:,} steps of {bundle.preset} ({r.tier}, {r.load_s:g} s), replayed bit for bit "
             f"({r.replayed_steps:,} steps)")]
    for title, key in (("must match", "must_match"), ("may differ", "may_differ")):
        lines += [f"  {title}", *(f"    {k:<28} {_short(v)}" for k, v in doc[key].items())]
    print("\n".join(lines))
    return exit_codes.OK


def _show_doc(bundle: Any, path: Path, size: int) -> dict[str, Any]:
    import msgspec
    return {"path": str(path), "size_bytes": size, "sha256": bundle.sha256, "format": bundle.format,
            "version": bundle.version, "tuner_version": bundle.tuner_version, "created": bundle.created,
            "preset": bundle.preset, "steps": bundle.steps, "recording": msgspec.to_builtins(bundle.recording),
            "must_match": bundle.must_match(), "may_differ": bundle.may_differ()}


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 2**20 else f"{n / 2**20:.2f} MiB"


def _short(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 90 else text[:87] + "..."
