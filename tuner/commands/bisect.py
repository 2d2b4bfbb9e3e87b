"""`tuner bisect`: find the lowest stable setting of one card, or of every card at once then confirmed together;
recommend it with a margin. The checks and the search are the core's (tuner.actions.bisect, tuner.tuning.job): this
file parses, asks, shows and saves."""

from __future__ import annotations

import json
import sys
import threading
from argparse import Namespace

from tuner.actions.bisect import after_save, check_save_name, consent_question, prepare_bisect, rig_devices
from tuner.actions.context import Context
from tuner.actions.parameters import BISECT, BOUND, CONFIRM, TRIAL
from tuner.backends.base import Backend
from tuner.commands._argtypes import Subparsers, add_arguments
from tuner.commands._output import StatusLine, fit, format_table, said_yes, warn
from tuner.commands._worker import run_in_worker
from tuner.core import exit_codes
from tuner.core.durations import format_duration
from tuner.core.errors import TunerError, UsageError
from tuner.core.models import Verdict
from tuner.tuning.bound import describe as describe_bound
from tuner.tuning.events import (
    FINISHING,
    BisectEvent,
    BisectFailed,
    BisectStopped,
    Recommendation,
    RigConfirmFinished,
    RigConfirmStarted,
    RigRecommendation,
    SessionStarted,
    TrialFinished,
    TrialProgress,
    TrialRecovered,
    TrialResult,
    TrialStarted,
    TrialWarning,
    of_about,
)
from tuner.tuning.job import RIG_BASELINE, BisectOutcome, BisectParams, CardOutcome


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "bisect",
        help="find the lowest stable setting, confirm it, recommend it with a margin",
        description="Baseline at stock, coarse descent, bisection to --resolution, a long confirmation run, then "
        "a recommendation (confirmed + --margin; 15 mV when a trial hung or crashed the machine) with the "
        "efficiency gained. Every trial is journalled before it touches the card: after a crash or a reset, "
        "`--resume` counts the open trial as a failure and never tries that value again. Values are in the "
        "card's unit: mV offsets (AMD, simulated) or MHz clock offsets (NVIDIA; defaults there are clock steps).\n\n"
        "Several cards at once: `--device all` or `--device ID,ID`: one bisect per card at the same time (each its "
        "own journal, unsafe list and reference), then every card at its recommendation together for --confirm in "
        "one data-parallel run (a failure pinned on one card backs off that card one --resolution step, a "
        "whole-machine event backs off every card; a card that reaches stock stays there). Exit code: 0 only if "
        "every card got a recommendation confirmed together; otherwise 5 if any card's hardware failed, else the "
        "first failing card's code, else 1 (the rig confirmation failed); 130 when interrupted. The report names "
        "each card without a recommendation and why. --resume continues every card and the rig confirmation.",
    )
    p.add_argument("--device", metavar="ID|ID,ID|all",
                   help="device id from `tuner list` (default: the only card); a comma list or `all`: those cards "
                   "at once, then a whole-rig confirmation")
    add_arguments(p, BISECT)
    p.add_argument("--save", metavar="NAME",
                   help="save the recommendation as a profile (several cards: one rig profile, a part per card)")
    p.add_argument("--tolerance", action="store_true",
                   help="compare with tolerances instead of bit for bit, for a platform that does not repeat "
                   "(reduced sensitivity: catches far fewer faults; the profile says so)")
    p.add_argument("--from-last", action="store_true",
                   help="with --save: run nothing, save the last finished bisect's recommendation (kept in the "
                   "journal when the save at the end of a run failed)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue this card's (or rig's) unfinished session")
    again.add_argument("--restart", action="store_true",
                       help="discard this card's (or rig's) unfinished session and start again (the unsafe list is "
                       "kept)")
    p.add_argument("--yes", action="store_true", help="do not ask before changing a real card's voltage")
    p.add_argument("--json", action="store_true", help="JSON lines events on stdout")
    p.set_defaults(run=run)


def _confirm_real_cards(backend: Backend, devices: tuple[str, ...], args: Namespace) -> None:
    questions = [q for q in (consent_question(backend.device(d)) for d in devices) if q]
    if not questions or args.yes:
        return
    if not sys.stdin.isatty():
        what = backend.device(devices[0]).label if len(devices) == 1 else f"{len(questions)} cards"
        raise UsageError(f"bisect changes the voltage of {what} and may crash the machine",
                         "pass --yes to run it unattended")
    for q in questions:
        if not said_yes(f"{q} [y/N] "):
            raise UsageError("bisect cancelled", "pass --yes to skip this question")


class _Printer:
    """Human output on stderr for one card or several: the lines that stay (finished trials, warnings, rig attempts;
    each prefixed with its card when there are several) and, on a TTY, one progress line per card redrawn in place
    under them (a trial past its time reads `finishing`, not `ETA 0s`). `--json`: every event on stdout too."""

    def __init__(self, backend: Backend, devices: tuple[str, ...], json_lines: bool) -> None:
        self.devices, self.json_lines = devices, json_lines
        self.units = {d: backend.knob(d).unit for d in devices}
        self.several = len(devices) > 1
        self._line_in_place = StatusLine(sys.stderr)  # one card: its progress line; several: the terminal's width
        self.tty = self._line_in_place.tty
        self._status = dict.fromkeys(devices, "waiting")
        self._labels = dict.fromkeys(devices, "")
        self._last_plain = dict.fromkeys(devices, 0.0)
        self._drawn = 0
        self._lock = threading.Lock()

    def __call__(self, event: BisectEvent) -> None:
        with self._lock:
            if self.json_lines:
                sys.stdout.write(json.dumps(event.to_json(), default=str) + "\n")
                sys.stdout.flush()
            if isinstance(event, (RigConfirmStarted, RigConfirmFinished, RigRecommendation)):
                self._rig(event)
            else:
                self._card(event.device or "rig", event)

    # --- the terminal: lines that stay, under them the progress (one card: one line; several: a block) -------
    def _clear(self) -> None:
        self._line_in_place.clear()
        if self._drawn:
            sys.stderr.write(f"\033[{self._drawn}F\033[J")  # up to the block's first line, clear to the end
            self._drawn = 0

    def _draw(self) -> None:
        if not self.several:  # one card: its line is drawn when it moves (a finished trial's 100 % is not kept)
            return
        width = max(10, self._line_in_place.columns() - 1)  # cut, never wrapped: a wrapped line breaks the count
        for d in self.devices:
            sys.stderr.write(fit(f"{d}: {self._status[d]}", width) + "\n")
        self._drawn = len(self.devices)

    def line(self, device: str, text: str) -> None:
        if self.tty:
            self._clear()
        sys.stderr.write((f"[{device}] " if self.several else "") + text + "\n")
        if self.tty:
            self._draw()
        sys.stderr.flush()

    def status(self, device: str, text: str) -> None:
        self._status[device] = text
        if not self.tty:
            return
        if not self.several:
            self._line_in_place.show(text)  # redrawn in place, cut to the terminal's width (issue 24 item 3)
            return
        self._clear()
        self._draw()
        sys.stderr.flush()

    def end(self) -> None:
        if self.tty:
            self._clear()
            sys.stderr.flush()

    # --- the words -------------------------------------------------------------------------------------------
    def _v(self, device: str, value: int | None) -> str:
        return "-" if value is None else f"{value:+d} {self.units.get(device, '')}".rstrip()

    def _card(self, d: str, ev: BisectEvent) -> None:
        if isinstance(ev, SessionStarted):
            what = "resuming session" if ev.resumed else "new session"
            unsafe = f"; unsafe (never tried): {', '.join(self._v(d, u) for u in ev.unsafe)}" if ev.unsafe else ""
            p = ev.params
            self.line(d, f"bisect {ev.device} {ev.label}: {what} {ev.session}; step {p.get('step')} res "
                      f"{p.get('resolution')} margin {p.get('margin')} {ev.unit}, trial "
                      f"{format_duration(p.get('trial_s', 0))}, confirm {_confirm_words(p)}{unsafe}")
            if ev.resumed and p.get("tolerance"):  # the session's own (a new one's was said before it started)
                from tuner.tuning.sensitivity import tolerance_note

                self.line(d, f"tuner: warning: {tolerance_note()}")
        elif isinstance(ev, TrialRecovered):
            r = ev.result
            counted = ("counted as FAIL" if r.verdict == Verdict.FAIL else f"counted as {r.verdict.upper()}")
            listed = "; added to the unsafe list" if r.verdict == Verdict.FAIL and r.edge else "; it runs again"
            self.line(d, f"recovered open trial: {self._v(d, r.setting)} {r.phase} {counted} ({r.kind}): "
                      f"{r.reason}{listed}")
        elif isinstance(ev, TrialStarted):
            of = of_about(ev.expected_trials)
            self._labels[d] = f"trial {ev.index}{of} "
            if not self.tty:
                self.line(d, f"trial {ev.index}{of}: {self._v(d, ev.setting)} {ev.phase} "
                          f"({format_duration(ev.duration_s)}) started")
            else:
                self.status(d, f"{self._labels[d]}{self._v(d, ev.setting)} {ev.phase} started")
        elif isinstance(ev, TrialProgress):
            eta_total = "" if ev.eta_total_s is None else f"  bisect ~{format_duration(ev.eta_total_s)} left"
            if self.tty:
                frac = min(1.0, ev.elapsed_s / ev.duration_s) if ev.duration_s else 0.0
                bar = "#" * int(frac * 20) + "." * (20 - int(frac * 20))
                step = "" if ev.step is None else f" step {ev.step}"
                left = FINISHING if ev.finishing else f"ETA {format_duration(ev.eta_s)}"
                self.status(d, f"{self._labels.get(d, '')}[{bar}] {frac:4.0%} {self._v(d, ev.setting)} {ev.phase}"
                            f"{step}  {left}{eta_total}")
            elif ev.elapsed_s - self._last_plain.get(d, 0.0) >= 30 or ev.elapsed_s < self._last_plain.get(d, 0.0):
                self._last_plain[d] = ev.elapsed_s
                self.line(d, f"  {self._v(d, ev.setting)} {ev.phase}: {format_duration(ev.elapsed_s)} of "
                          f"{format_duration(ev.duration_s)}{eta_total}")
        elif isinstance(ev, TrialWarning):
            self.line(d, f"tuner: warning: {ev.message}")
        elif isinstance(ev, TrialFinished):
            self._last_plain[d] = 0.0
            self.line(d, f"trial {ev.index}: " + _trial_line(ev.result)
                      + (f"; bound {ev.bound_text}" if ev.bound_text else ""))
        elif isinstance(ev, Recommendation):  # printed with the final table; a card's line stops showing 100 %
            if self.several:
                self.status(d, f"own result {self._v(d, ev.setting)}; waiting for the other cards")
        elif isinstance(ev, BisectFailed):
            self.line(d, f"bisect failed ({ev.kind}): {ev.reason}")
        elif isinstance(ev, BisectStopped):
            self.line(d, f"bisect stopped: {ev.reason}; the card is back at stock; continue with --resume")

    def _settings(self, settings: dict[str, int]) -> str:
        return ", ".join(f"{d} {self._v(d, v)}" for d, v in settings.items())

    def _rig(self, ev: BisectEvent) -> None:
        if isinstance(ev, RigConfirmStarted):
            if ev.phase == RIG_BASELINE:
                self.line("rig", f"recording the data-parallel reference at stock on {', '.join(ev.settings)} "
                          f"({format_duration(ev.duration_s)})")
            else:
                self.line("rig", f"confirmation attempt {ev.attempt}: {self._settings(ev.settings)} together for "
                          f"{format_duration(ev.duration_s)} (mixed, data-parallel)")
            label = "rig baseline" if ev.attempt == 0 else f"rig attempt {ev.attempt}"
            for d in ev.settings:
                self._labels[d] = f"{label} "  # the rig run's progress, not the card's last trial
                self.status(d, f"{label} running")
        elif isinstance(ev, RigConfirmFinished):
            what = "recording at stock" if ev.phase == RIG_BASELINE else f"attempt {ev.attempt}"
            if ev.passed:
                self.line("rig", f"{what} PASSED")
                return
            why = "; ".join(f"{d}: {r}" for d, r in ev.reasons.items())
            blame = (f"whole-machine event ({ev.machine_event})" if ev.machine_event else
                     f"pinned on {', '.join(ev.pinned)}" if ev.pinned else "no card to blame")
            nxt = f"; next: {self._settings(ev.backed_off)}" if ev.backed_off else ""
            self.line("rig", f"{what} FAILED: {blame}" + (f" ({why})" if why else "") + nxt)


def _confirm_words(p: dict) -> str:
    """'30m00s', or with --bound 'up to 30m00s for a bound of 2m00s' (the plan sizes it; --confirm is the time
    allowed)."""
    confirm = format_duration(p.get("confirm_s", 0))
    if p.get("bound_s") is None:
        return confirm
    return f"up to {confirm} for a bound of {format_duration(p['bound_s'])}"


def _fmt(value: object, spec: str) -> str | None:
    return None if value is None else format(value, spec)


def _trial_line(r: TrialResult) -> str:
    figures = ", ".join(text.format(value) for value, text in (
        (r.tok_s, "{:,.0f} tok/s"), (r.power_w, "{:.0f} W"), (r.tok_per_j, "{:.2f} tok/J"),
        (r.max_temp_c, "max {:.0f} °C")) if value is not None)
    why = f" ({r.kind}: {r.reason})" if r.verdict != Verdict.PASS and r.reason else ""
    load = f"; {r.load_note}" if r.load_note else ""  # the baseline: its power against the card's limit
    return f"{r.setting:+d} {r.unit} {r.phase} {r.verdict.upper()}{why}" + (f"; {figures}" if figures else "") + load


def _table(trials: tuple[TrialResult, ...]) -> str:
    rows = [(f"{t.setting:+d} {t.unit}", t.phase, t.verdict.upper(),
             (t.kind or "") if t.verdict != Verdict.PASS else "",
             _fmt(t.tok_s, ",.0f"), _fmt(t.power_w, ".1f"), _fmt(t.tok_per_j, ".3f"), _fmt(t.max_temp_c, ".0f"))
            for t in trials]
    return format_table(("setting", "phase", "verdict", "reason", "tok/s", "W", "tok/J", "max °C"), rows)


def _recommendation_text(rec: Recommendation, label: str, simulated: bool = False) -> str:
    if rec.confirmed is None:
        head = f"recommendation for {label}: stay at stock ({rec.setting:+d} {rec.unit}): no undervolt step passed"
    else:
        head = (f"recommendation for {label}: {rec.setting:+d} {rec.unit} (confirmed {rec.confirmed:+d} + "
                f"{rec.margin} {rec.unit} margin{', edge margin: a trial hung or crashed' if rec.edge else ''}; "
                f"first failure {'-' if rec.first_failure is None else f'{rec.first_failure:+d}'})")
    if rec.sensitivity == "reduced":  # before the bound: its steps were compared with tolerances, not bit for bit
        from tuner.tuning.sensitivity import tolerance_note

        head += f"\nsensitivity: {tolerance_note()}"
    bound = describe_bound(rec.bound, rec.confirmed_bound, rec.setting, rec.confirmed, rec.unit, rec.bound_s)
    if bound:
        head += f"\nbound: {bound}"
    if rec.efficiency_gain_pct is not None:
        head += (f"\nefficiency: {rec.tuned_tok_per_j:.3f} tok/J vs {rec.baseline_tok_per_j:.3f} at stock: "
                 f"{rec.efficiency_gain_pct:+.1f}% (measured at {rec.measured_at:+d} {rec.unit}; power "
                 f"{rec.baseline_power_w:.0f} -> {rec.tuned_power_w:.0f} W)")
        if simulated:
            head += ("\nnote: SIMULATED card: power and the work rate (tok/J = its work rate / power) are the "
                     "simulator's model; the tok/s shown is the CPU engine's, which swings with the host's load")
    return head


def run(args: Namespace, ctx: Context) -> int:
    backend = ctx.backend
    devices = rig_devices(backend, args.device)
    if args.from_last:
        if len(devices) > 1:
            raise UsageError("--from-last saves one card's last result", "give --device ID (one card)")
        _refuse_run_flags(args)
        check_save_name(args.save)
        return _save_from_last(args, backend, devices[0])
    given = {p.name: getattr(args, p.id) for p in BISECT if not p.later}  # argparse converted these
    given |= {p.name: p.parse(text, where=p.flag) for p in (TRIAL, CONFIRM)
              if (text := getattr(args, p.id)) is not None}  # a duration left out: the core's default
    given["bound_s"] = None if args.bound is None else BOUND.parse(args.bound)
    params = BisectParams(**given, resume=args.resume, restart=args.restart, tolerance=args.tolerance)
    if args.tolerance and not args.resume:  # a resumed session runs with its own, said as it starts (_Printer)
        from tuner.tuning.sensitivity import tolerance_note

        warn([tolerance_note()])
    printer = _Printer(backend, devices, args.json)
    job = prepare_bisect(backend, devices, params, printer, save=args.save)
    _confirm_real_cards(backend, devices, args)
    try:
        outcome, interrupted = run_in_worker(job, "bisect")
    finally:
        printer.end()
    several = len(devices) > 1
    if interrupted or outcome.status == "stopped":
        if several:
            print("bisect stopped: every card is back at stock; continue with --resume", file=sys.stderr)
        elif not args.json and outcome.card.trials:
            print(_table(outcome.card.trials), file=sys.stderr)
        # a signal: 130; otherwise the job's own reason (BUSY: a card was changed outside this bisect)
        return exit_codes.INTERRUPTED if interrupted else outcome.exit_code
    if several and args.json:
        sys.stdout.write(json.dumps({"event": "rig_outcome", "device": "rig", "status": outcome.status,
                                     "exit_code": outcome.exit_code, "settings": dict(outcome.settings),
                                     "reasons": dict(outcome.reasons)}) + "\n")
    elif not args.json:
        _report(backend, outcome)
    if args.save and outcome.settings:
        try:
            _save(args, backend, outcome)
        except TunerError as e:  # the name was taken meanwhile, the disk is full...: the journals keep the result
            kept = (f"the result is kept: save it with `tuner bisect --device {devices[0]} --save NAME --from-last`"
                    if not several else "the per-card results are kept in their journals")
            e.remedy = f"{e.remedy + '; ' if e.remedy else ''}{kept}"
            raise
    elif args.save and several:
        print(f"tuner: not saved: no card got a recommendation confirmed together, so {args.save!r} would be empty",
              file=sys.stderr)
    return outcome.exit_code


def _report(backend: Backend, outcome: BisectOutcome) -> None:
    """Each card's trials and recommendation; with several cards, the rig's attempts and the final settings."""
    several = len(outcome.per_card) > 1
    for d, o in outcome.per_card.items():
        device = backend.device(d)
        if several:
            print(f"== {d} {device.label}")
        if o.trials:
            print(_table(o.trials))
        if o.recommendation is not None:
            print(_recommendation_text(o.recommendation, device.label, device.simulated))
        elif several and o.failure is not None:
            print(f"no recommendation: {o.failure.reason}")
    if not several:
        return
    units = {d: backend.knob(d).unit for d in outcome.per_card}
    if outcome.attempts:
        print("== rig confirmation (every card at once, data-parallel)")
        rows = []
        for a in outcome.attempts:
            settings = ", ".join(f"{d} {v:+d} {units.get(d, '')}".rstrip() for d, v in a["settings"].items())
            blame = (a.get("machine_event") or "") if a.get("machine_event") else ", ".join(a.get("pinned") or [])
            rows.append((str(a.get("attempt")), settings, "PASS" if a.get("passed") else "FAIL", blame))
        print(format_table(("attempt", "settings", "result", "pinned / machine event"), rows))
    print("== final settings")
    rows = []
    for d, o in outcome.per_card.items():
        own = f"{o.recommendation.setting:+d} {units[d]}" if o.recommendation is not None else "-"
        final = f"{outcome.settings[d]:+d} {units[d]}" if d in outcome.settings else "-"
        rows.append((d, own, final, outcome.reasons.get(d, "")))
    print(format_table(("card", "own recommendation", "final (rig)", "why not"), rows))
    if outcome.reasons:
        print(f"no recommendation for {', '.join(outcome.reasons)} (see 'why not'); exit code {outcome.exit_code}")


def _save(args: Namespace, backend: Backend, outcome: BisectOutcome) -> None:
    """One card: its profile, its stock baseline bundled beside it; several: one rig profile, a part per card that
    got a setting confirmed together (each built by the core; a rig profile bundles no baseline)."""
    from tuner.actions.bisect import rig_profile_from_outcome

    check_save_name(args.save)  # taken meanwhile: said with this command's remedy (the store's names --overwrite)
    if len(outcome.per_card) == 1:
        [device_id] = outcome.per_card
        _save_card(args, backend, device_id, outcome.card)
        return
    from tuner.actions.profile_store import save_profile

    profile = rig_profile_from_outcome(backend, outcome, args.save)
    path = save_profile(profile, overwrite=False)
    left_out = [d for d in outcome.per_card if d not in outcome.settings]
    if args.json:
        sys.stdout.write(json.dumps({"event": "profile_saved", "name": args.save, "path": str(path), "device": "rig",
                                     "cards": list(outcome.settings), "left_out": left_out}) + "\n")
    else:
        print(f"saved rig profile {args.save!r} ({len(profile.rig_parts)} cards) to {path}"
              + (f"; left out: {', '.join(left_out)}" if left_out else ""))
        print(after_save(args.save))


def _save_card(args: Namespace, backend: Backend, device_id: str, card: CardOutcome) -> None:
    """One card's profile (`card`: its CardOutcome), with the session's stock baseline beside it (NAME.ref, for
    `tuner screen` and `apply --verify` elsewhere; tuner.actions.screen.record, as the UI's save)."""
    from tuner.actions.bisect import profile_from_outcome
    from tuner.actions.profile_store import save_profile
    from tuner.actions.screen.record import bundle_beside_profile

    path = save_profile(profile_from_outcome(backend, device_id, card, args.save), overwrite=False)
    reference = bundle_beside_profile(backend, device_id, card, path)
    if args.json:
        sys.stdout.write(json.dumps({"event": "profile_saved", "name": args.save, "path": str(path),
                                     "reference": reference.to_dict()}) + "\n")
    else:
        print(f"saved profile {args.save!r} to {path}{reference.text()}")
        print(after_save(args.save))


def _refuse_run_flags(args: Namespace) -> None:
    """--from-last runs nothing and saves the journal's result as it was found: a flag that shapes a run (--resume,
    --restart, --tolerance, a search parameter such as --margin) would be silently ignored, and a user who passed
    --margin 20 would get a profile with the journal's margin. Refused, nothing saved."""
    given = [p.flag for p in BISECT if getattr(args, p.id) != p.default]
    given += [flag for flag, on in (("--resume", args.resume), ("--restart", args.restart),
                                    ("--tolerance", args.tolerance)) if on]
    if given:
        raise UsageError(f"--from-last runs nothing, so {', '.join(given)} would do nothing",
                         f"drop {'it' if len(given) == 1 else 'them'}, or run a bisect without --from-last")


def _save_from_last(args: Namespace, backend: Backend, device_id: str) -> int:
    from tuner.tuning.job import last_outcome

    if not args.save:
        raise UsageError("--from-last saves the last result and needs --save NAME", "add --save NAME")
    outcome = last_outcome(device_id, backend.knob(device_id), backend.device(device_id).serial)
    _save_card(args, backend, device_id, outcome)
    return exit_codes.OK
