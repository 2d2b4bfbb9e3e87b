"""`tuner screen`: compare every selected card with a portable reference and say, per card, pass, fail, retest or
incomparable (tuner.actions.screen; docs/screen.md). Exit 0 only when every card passes: a scheduler's health
check drains on anything else."""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from tuner.actions.profile_store import load_profile
from tuner.backends.base import Backend
from tuner.commands._argtypes import Subparsers
from tuner.commands._device import pick_device
from tuner.commands._output import StatusLine
from tuner.commands.reference import TIER_HELP, tier_of
from tuner.core.atomic import write_atomic
from tuner.core.durations import format_duration
from tuner.core.errors import UsageError
from tuner.profiles.schema import Profile

if TYPE_CHECKING:
    from tuner.actions.context import Context
    from tuner.actions.screen.verdict import CardVerdict, ScreenReport
    from tuner.profiles.reference_bundle import Bundle

EPILOG = """\
verdicts and exit codes (the worst card decides):
  pass          0   every step matched the reference bit for bit (the bound it supports is printed)
  fail          1   a difference that repeated (attributed: persistent at this setting -> raise voltage, or
                    persistent at stock -> drain), or a hang/reset (not re-run)
  retest        10  a difference that did not repeat, or a screen that could not compare its steps
  incomparable  11  a must-match field differs from the reference's (named); no bits were compared

at a profile's setting (--profile NAME):
  each card is checked against the profile as `tuner apply` checks it (vendor and knob, model, range, the
  unsafe list) before anything is written to any card; a refusal is one line, exit 2, every card untouched.
  The profile's setting is then applied for the screen only and every card is put back to the setting it had
  (also on a failure, Ctrl-C, SIGTERM or SIGHUP): the profile is never left applied (`tuner apply NAME` does
  that). Without --reference, the reference bundled with the profile (NAME.ref beside it) is used, and said.
  A card another tuner process holds refuses the screen (exit 6), nothing written; a card that does not take
  the setting ends the screen (exit 5, the other cards put back).

examples:
  tuner screen --reference r9700.ref --device all --tier standard --json > verdict.json
  tuner screen --profile r9700 --device all --tier standard     (the profile's setting, its bundled reference)
  tuner --simulate --sim-gpus 4 --sim-sdc-rate 0,0.01 screen --reference A.ref --device all --tier quick
  A Slurm HealthCheckProgram, a Kubernetes Job and an Ansible playbook are in examples/."""


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "screen",
        help="compare cards with a portable reference: pass, fail, retest or incomparable per card",
        description="Run the stress engine on each selected card at its current setting (or, with --profile, at "
        "the profile's setting, applied for the screen only), one engine per card at once, and compare every "
        "training step bit for bit with a reference recorded at stock on another card of the same model and "
        "software (`tuner reference record`). A difference is re-run on the same card (does it repeat?) and then "
        "at stock (does the voltage explain it?; the card is put back at its setting). A card whose must-match "
        "fields differ from the reference's is `incomparable`, and nothing is compared. Nothing on the card changes "
        "except that stock run and a --profile's setting, both put back. With --tolerance, where bits cannot match "
        "(other hardware), the held-out losses after the reference's steps are compared instead (reduced "
        "sensitivity, labelled).",
        epilog=EPILOG,
    )
    p.add_argument("--reference", metavar="FILE", help="the portable reference (.ref); with --profile, default: "
                   "the one bundled with the profile (NAME.ref beside it)")
    p.add_argument("--profile", metavar="NAME", help="screen at this profile's setting (name from `tuner profile "
                   "list`, or a path), checked as `tuner apply` checks it, applied for the screen only: every card "
                   "is put back to its own setting")
    p.add_argument("--device", metavar="ID", help="a device id, ID,ID, or all (default: the only card)")
    p.add_argument("--tier", default="quick", metavar="TIER", help=TIER_HELP)
    p.add_argument("--duration", metavar="DUR", help="load per run instead of the tier's (e.g. 10s, 5m): tier "
                   "'custom'")
    p.add_argument("--tolerance", action="store_true",
                   help="compare held-out losses (paired, 95 %% interval) instead of bits: for other hardware; "
                   "reduced sensitivity, labelled in the verdict")
    p.add_argument("--margin", type=float, default=None, metavar="NATS",
                   help="with --tolerance: pass when the interval lies within +/- NATS (default 0.02)")
    p.add_argument("--json", action="store_true", help="print one JSON document (docs/schemas/screen-verdict.v1.json)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON document to FILE (atomically)")
    p.set_defaults(run=run)


def select_devices(backend: Backend, text: str | None) -> list[str]:
    """`ID`, `ID,ID` or `all` (every card, in the backend's order); the only card when not given."""
    if text is None:
        return [pick_device(backend, None).id]
    text = text.strip()
    if text == "all":
        return [d.id for d in backend.devices()]
    ids = [part.strip() for part in text.split(",")]
    if any(not i for i in ids) or len(set(ids)) != len(ids):
        raise UsageError(f"--device {text!r}: expected ID, ID,ID (each once) or all")
    return [backend.device(i).id for i in ids]


class Progress:
    """One self-overwriting line on stderr (a terminal only, tuner.commands._output.StatusLine): each card's step and
    the time left."""

    def __init__(self, stream: IO[str], load_s: float, clock: Callable[[], float] = time.monotonic, *,
                 steps: int | None = None) -> None:
        self.load_s, self.clock, self.total_steps = load_s, clock, steps  # steps: each run is that many (tolerance)
        self.line = StatusLine(stream)
        self.steps: dict[str, str] = {}
        self._t0 = clock()
        self._lock = threading.Lock()

    def __call__(self, device_id: str, event: object) -> None:
        step = getattr(event, "step", None)
        if type(event).__name__ == "StepEvent" and isinstance(step, int):
            with self._lock:
                of = "" if self.total_steps is None else f"/{self.total_steps:,}"
                self.steps[device_id] = f"{device_id} step {step}{of}"
                now = self.clock()
                if self.line.due(now):
                    left = max(0.0, self.load_s - (now - self._t0))
                    tail = "" if self.total_steps is not None else f"  ~{format_duration(left)} left"
                    self.line.show("  ".join(self.steps.values()) + tail)
        elif isinstance(event, str) and not event.startswith("reference: compared with"):  # said once, above
            with self._lock:
                self.line.clear()
                print(f"screen: {device_id}: {event}", file=self.line.stream, flush=True)

    def clear(self) -> None:
        with self._lock:
            self.line.clear()


def run(args: argparse.Namespace, ctx: Context) -> int:
    from tuner.actions.screen import verdict as v
    from tuner.actions.screen.fleet import Screen
    from tuner.actions.screen.tolerance import DEFAULT_MARGIN_NATS
    tier = tier_of(args)
    if args.margin is not None and not args.tolerance:
        raise UsageError("--margin is the tolerance mode's", "add --tolerance, or drop --margin")
    margin = DEFAULT_MARGIN_NATS if args.margin is None else args.margin
    if not (margin > 0 and math.isfinite(margin)):  # an infinite margin would pass any losses, even non-finite ones
        raise UsageError(f"--margin {args.margin}: a margin is a finite positive number of nats", "e.g. --margin 0.02")
    profile = None if args.profile is None else load_profile(args.profile)  # checked before any card is touched
    bundle, path, bundled_with = _reference(args.reference, profile)  # a file that is not a usable bundle: exit 2
    if args.tolerance and len(bundle.recording.eval_losses) < 2:  # known now: never a retest after a whole run
        raise UsageError(f"reference {path} holds no held-out losses (tier {bundle.recording.tier!r}): the tolerance "
                         "mode compares them", "record one with `tuner reference record --device ID --out FILE`, or "
                         "screen bit for bit (drop --tolerance)")
    if args.out is not None:
        _check_out(Path(args.out), [path] if profile is None or profile.source is None else [path, profile.source])
    backend = ctx.backend
    device_ids = select_devices(backend, args.device)
    progress = Progress(sys.stderr, tier.load_s, steps=bundle.steps if args.tolerance else None)
    screen = Screen(backend, device_ids, bundle, path, tier, tolerance=args.tolerance, margin_nats=margin,
                    on_event=progress, profile=profile, bundled_with=bundled_with)
    tier = screen.tier  # in the tolerance mode, the reference's: each run is its steps
    if bundled_with is not None:  # said even with --json (on stderr; the document says it too)
        print(f"screen: using the reference bundled with profile {bundled_with!r}: {path} "
              f"({path.stat().st_size:,} bytes)", file=sys.stderr, flush=True)
    if not args.json:
        mode = "held-out losses (tolerance mode, reduced sensitivity)" if args.tolerance else "bit for bit"
        at = ("" if profile is None else f" at profile {profile.name!r}'s setting (applied for the screen only; "
              "each card is put back to its own)")
        runs = (f"{bundle.steps:,} reference steps per run, as recorded at tier {tier.name}: {tier.load_s:g} s of "
                "load; --tier and --duration do not apply" if args.tolerance else
                f"{bundle.steps:,} reference steps), tier {tier.name} ({tier.load_s:g} s of load per run")
        print(f"screening {len(device_ids)} card{'s' * (len(device_ids) != 1)}{at} against {path} "
              f"({bundle.preset}, {runs}), compared {mode}", file=sys.stderr, flush=True)
    try:
        report = screen.run()
    finally:
        progress.clear()
    data = v.encode(report)
    if args.json:  # printed first: a failed --out write never loses the verdict
        sys.stdout.write(data.decode() + "\n")
    else:
        print("\n".join(human_lines(report)))
    sys.stdout.flush()
    if args.out is not None:
        write_atomic(Path(args.out), data + b"\n")  # disk full: one line, exit 7 (the cards are as they were)
    return report.exit_code


def _reference(given: str | None, profile: Profile | None) -> tuple[Bundle, Path, str | None]:
    """The reference to screen against: --reference FILE; else the one bundled with --profile (NAME.ref beside
    it); else a one-line usage error. Returns the bundle, its path, and the profile it came with (None: given)."""
    from tuner.profiles import reference_bundle as rb

    if given is not None:
        path = Path(given)
        return rb.read_bundle(path), path, None
    if profile is None:
        raise UsageError("which reference? --reference FILE is required",
                         "record one with `tuner reference record --device ID --out FILE` on a known-good card")
    beside = None if profile.source is None else rb.reference_beside(profile.source)
    if beside is None:
        raise UsageError(f"profile {profile.name!r} has no bundled reference (no {profile.name}.ref beside it): "
                         "--reference FILE is required", "record one with `tuner reference record --device ID "
                         "--out FILE` on a known-good card at stock, or save the profile with `tuner bisect --save`")
    bundle, path, _size = beside
    return bundle, path, profile.name


def _check_out(out: Path, inputs: list[Path]) -> None:
    """A file the verdict may replace: not a directory, in a directory this user may write (os.access: the real
    uid), and never one of the screen's inputs (the reference, the profile): the verdict would replace them."""
    from tuner.actions.screen.record import check_destination

    check_destination(out, overwrite=True, example="verdict.json")  # found now, never after the whole screen
    for given in inputs:
        if out.exists() and given.exists() and out.samefile(given):
            raise UsageError(f"--out {out} is {given}, an input of this screen: the verdict would replace it",
                             "give another file name, e.g. --out verdict.json")


def human_lines(report: ScreenReport) -> list[str]:
    lines = []
    for c in report.verdicts:
        lines += card_lines(c)
    lines.append(f"{report.summary} (exit {report.exit_code})")
    return lines


def card_lines(c: CardVerdict) -> list[str]:
    from tuner.actions.screen.card import OVERDRIVE_OFF_SOURCE
    label = c.card.model + (" [SIMULATED]" if c.card.simulated else "")
    source = "" if c.setting.source == "current" else f" ({c.setting.source})"
    if c.setting.source == OVERDRIVE_OFF_SOURCE:
        source = " (its own setting: stock, Overdrive is off, so the driver allows no offset)"
    head = (f"{c.card.id}  {label} at {c.setting.value:+d} {c.setting.unit}{source}: {c.verdict.upper()} "
            f"(action: {c.action})" + (f", {c.attribution}" if c.attribution else ""))
    lines = [head, f"  {c.reason}"]
    if c.setting.left_at != c.setting.value:
        lines.append(f"  left at {c.setting.left_at:+d} {c.setting.unit} (read back)")
    if c.incomparable:
        lines.append("  differs: " + "; ".join(f"{d.field} reference {d.reference!r}, here {d.here!r}"
                                               for d in c.incomparable))
    if c.bound is not None:
        lines.append(f"  bound: {c.bound.text}")
    for off in c.evidence.checks_off:
        lines.append(f"  not at full strength: {off}")
    return lines
