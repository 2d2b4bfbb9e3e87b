"""`tuner bisect --device all` (or `--device ID,ID`): every card at once, then the whole-rig confirmation.

The checks and the search are the core's (tuner.actions.bisect.prepare_rig_bisect, tuner.tuning.rig); this file
only shows them: one progress line per card (a block redrawn in place on a TTY, lines prefixed with the card
otherwise), `--json` events that carry "device", a final table per card, the rig's attempts and final settings.
"""

from __future__ import annotations

import json
import sys

from tuner.actions.bisect import consent_question, prepare_rig_bisect, rig_devices
from tuner.commands._output import format_table
from tuner.commands.bisect import (
    _Block,
    _Printer,
    _recommendation_text,
    _table,
    run_in_worker,
)
from tuner.core import exit_codes
from tuner.core.durations import format_duration, parse_duration_s
from tuner.core.errors import TunerError, UsageError
from tuner.tuning.events import RigConfirmFinished, RigConfirmStarted, RigRecommendation
from tuner.tuning.job import BisectParams


class _RigPrinter:
    """JSON lines on stdout (each event names its card); human lines on stderr through one block."""

    def __init__(self, backend, devices: tuple[str, ...], json_lines: bool):
        self.json_lines = json_lines
        self.block = _Block(devices)
        self.units = {d: backend.knob(d).unit for d in devices}
        self.cards = {d: _Printer(self.units[d], False, block=self.block, device=d) for d in devices}

    def __call__(self, event) -> None:
        if self.json_lines:
            sys.stdout.write(json.dumps(event.to_json(), default=str) + "\n")
            sys.stdout.flush()
        if isinstance(event, (RigConfirmStarted, RigConfirmFinished, RigRecommendation)):
            self._rig(event)
        elif event.device in self.cards:
            self.cards[event.device](event)
        else:
            self.block.line(f"[{event.device or 'rig'}] " + getattr(event, "message", event.event))

    def _v(self, settings: dict[str, int]) -> str:
        return ", ".join(f"{d} {v:+d} {self.units.get(d, '')}".rstrip() for d, v in settings.items())

    def _rig(self, ev) -> None:
        if isinstance(ev, RigConfirmStarted):
            if ev.phase == "rig-baseline":
                self.block.line(f"[rig] recording the data-parallel reference at stock on {', '.join(ev.settings)} "
                                f"({format_duration(ev.duration_s)})")
            else:
                self.block.line(f"[rig] confirmation attempt {ev.attempt}: {self._v(ev.settings)} together for "
                                f"{format_duration(ev.duration_s)} (mixed, data-parallel)")
            label = "rig baseline" if ev.attempt == 0 else f"rig attempt {ev.attempt}"
            for d in ev.settings:
                if d in self.cards:
                    self.cards[d]._trial_label = f"{label} "  # the rig run's progress, not the card's last trial
                self.block.status(d, f"{label} running")
        elif isinstance(ev, RigConfirmFinished):
            what = "recording at stock" if ev.phase == "rig-baseline" else f"attempt {ev.attempt}"
            if ev.passed:
                self.block.line(f"[rig] {what} PASSED")
                return
            why = "; ".join(f"{d}: {r}" for d, r in ev.reasons.items())
            blame = (f"whole-machine event ({ev.machine_event})" if ev.machine_event else
                     f"pinned on {', '.join(ev.pinned)}" if ev.pinned else "no card to blame")
            nxt = f"; next: {self._v(ev.backed_off)}" if ev.backed_off else ""
            self.block.line(f"[rig] {what} FAILED: {blame}" + (f" ({why})" if why else "") + nxt)

    def end(self) -> None:
        self.block.end()


def _attempts_table(outcome, units: dict[str, str]) -> str:
    rows = []
    for a in outcome.attempts:
        settings = ", ".join(f"{d} {v:+d} {units.get(d, '')}".rstrip() for d, v in a["settings"].items())
        result = "PASS" if a.get("passed") else "FAIL"
        blame = (a.get("machine_event") or "") if a.get("machine_event") else ", ".join(a.get("pinned") or [])
        rows.append((str(a.get("attempt")), settings, result, blame))
    return format_table(("attempt", "settings", "result", "pinned / machine event"), rows)


def _final_table(backend, outcome) -> str:
    rows = []
    for d, o in outcome.per_card.items():
        unit = backend.knob(d).unit
        own = f"{o.recommendation.setting:+d} {unit}" if o.recommendation is not None else "-"
        final = f"{outcome.settings[d]:+d} {unit}" if d in outcome.settings else "-"
        rows.append((d, own, final, outcome.reasons.get(d, "")))
    return format_table(("card", "own recommendation", "final (rig)", "why not"), rows)


def run(args, ctx) -> int:
    backend = ctx.backend
    devices = rig_devices(backend, args.device)
    if args.from_last:
        raise UsageError("--from-last saves one card's last result", "give --device ID (one card)")
    durations = {name: parse_duration_s(text) for name, text in (("trial_s", args.trial), ("confirm_s", args.confirm))
                 if text is not None}
    params = BisectParams(step=args.step, resolution=args.resolution, margin=args.margin, floor=args.floor,
                          mode=args.mode, preset=args.preset, compile=args.compile, resume=args.resume,
                          restart=args.restart, tolerance=args.tolerance, **durations)
    if args.tolerance:
        from tuner.tuning.sensitivity import tolerance_note

        print(f"tuner: warning: {tolerance_note()}", file=sys.stderr)
    printer = _RigPrinter(backend, devices, args.json)
    job = prepare_rig_bisect(backend, devices, params, printer, save=args.save)
    _confirm_real_cards(backend, devices, args)
    try:
        outcome, interrupted = run_in_worker(job)
    finally:
        printer.end()
    if interrupted or outcome.status == "stopped":
        print("bisect stopped: every card is back at stock; continue with --resume", file=sys.stderr)
        return exit_codes.INTERRUPTED
    if args.json:
        sys.stdout.write(json.dumps({"event": "rig_outcome", "device": "rig", "status": outcome.status,
                                     "exit_code": outcome.exit_code, "settings": dict(outcome.settings),
                                     "reasons": dict(outcome.reasons)}) + "\n")
    else:
        for d, o in outcome.per_card.items():
            device = backend.device(d)
            print(f"== {d} {device.label}")
            if o.trials:
                print(_table(o.trials))
            if o.recommendation is not None:
                print(_recommendation_text(o.recommendation, device.label, device.simulated))
            elif o.failure is not None:
                print(f"no recommendation: {o.failure.reason}")
        if outcome.attempts:
            print("== rig confirmation (every card at once, data-parallel)")
            print(_attempts_table(outcome, {d: backend.knob(d).unit for d in outcome.per_card}))
        print("== final settings")
        print(_final_table(backend, outcome))
        if outcome.reasons:
            print(f"no recommendation for {', '.join(outcome.reasons)} (see 'why not'); exit code "
                  f"{outcome.exit_code}")
    if args.save and outcome.settings:
        try:
            _save_rig(args, backend, outcome)
        except TunerError as e:
            e.remedy = f"{e.remedy + '; ' if e.remedy else ''}the per-card results are kept in their journals"
            raise
    elif args.save:
        print(f"tuner: not saved: no card got a recommendation confirmed together, so {args.save!r} would be empty",
              file=sys.stderr)
    return outcome.exit_code


def _confirm_real_cards(backend, devices: tuple[str, ...], args) -> None:
    questions = [q for q in (consent_question(backend.device(d)) for d in devices) if q]
    if not questions or args.yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"bisect changes the voltage of {len(questions)} cards and may crash the machine",
                         "pass --yes to run it unattended")
    for q in questions:
        if input(f"{q} [y/N] ").strip().lower() not in ("y", "yes"):
            raise UsageError("bisect cancelled", "pass --yes to skip this question")


def _save_rig(args, backend, outcome) -> None:
    """One rig profile: a part per card that got a setting confirmed together (built by the core)."""
    from tuner.actions.bisect import rig_profile_from_outcome
    from tuner.profiles import save_profile

    profile = rig_profile_from_outcome(backend, outcome, args.save)
    parts = profile.rig_parts
    path = save_profile(profile, overwrite=False)
    left_out = [d for d in outcome.per_card if d not in outcome.settings]
    if args.json:
        sys.stdout.write(json.dumps({"event": "profile_saved", "device": "rig", "name": args.save, "path": str(path),
                                     "cards": list(outcome.settings), "left_out": left_out}) + "\n")
    else:
        print(f"saved rig profile {args.save!r} ({len(parts)} cards) to {path}"
              + (f"; left out: {', '.join(left_out)}" if left_out else ""))
