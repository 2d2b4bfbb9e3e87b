"""`tuner bisect`: find the lowest stable setting of one card, confirm it, recommend it with a margin."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading

from tuner.actions.bisect import check_save_name, consent_question, duration_text, prepare_bisect
from tuner.commands._argtypes import whole_number
from tuner.commands._device import pick_device
from tuner.commands._output import StatusLine, format_table
from tuner.core import exit_codes, signals
from tuner.core.durations import format_duration, parse_duration_s
from tuner.core.errors import TunerError, UsageError
from tuner.core.models import Mode, Verdict
from tuner.tuning.events import (
    FINISHING,
    BisectFailed,
    BisectStopped,
    Recommendation,
    SessionStarted,
    TrialFinished,
    TrialProgress,
    TrialRecovered,
    TrialResult,
    TrialStarted,
    TrialWarning,
)
from tuner.tuning.job import BisectParams


def add_parser(subparsers) -> None:
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
    p.add_argument("--step", type=whole_number, metavar="N", help="coarse step (default 10 mV; NVIDIA: 2 clock steps)")
    p.add_argument("--resolution", type=whole_number, metavar="N",
                   help="refine down to this (default 5 mV; NVIDIA: 1 step)")
    p.add_argument("--margin", type=whole_number, metavar="N",
                   help="added back to the confirmed value (default 10 mV; NVIDIA: 2 steps)")
    p.add_argument("--trial", metavar="DUR",
                   help=f"length of each trial (default {duration_text(BisectParams.trial_s)}; 90s, 5m, 1h)")
    p.add_argument("--confirm", metavar="DUR",
                   help=f"length of the confirmation run (default {duration_text(BisectParams.confirm_s)})")
    p.add_argument("--floor", type=whole_number, metavar="VALUE", help="never test beyond this setting")
    p.add_argument("--mode", choices=tuple(Mode), default=Mode.TRAIN,
                   help="stress workload of the trials (default train; the confirmation runs mixed)")
    p.add_argument("--preset", choices=("nanochat", "tiny", "small", "large"),
                   help="engine model size (default: nanochat on GPUs, tiny on the simulated card's CPU engine)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the engine's model and optimizer (default: on for GPUs)")
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


def _confirm_real_card(device, args) -> None:
    question = consent_question(device)
    if question is None or args.yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"bisect changes the voltage of {device.label} and may crash the machine",
                         "pass --yes to run it unattended")
    answer = input(f"{question} [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("bisect cancelled", "pass --yes to skip this question")


class _Printer:
    """Human output on stderr: a progress bar on a TTY, plain lines otherwise; one line per finished trial."""

    def __init__(self, unit: str, json_lines: bool, *, block: _Block | None = None, device: str = ""):
        self.unit, self.json_lines = unit, json_lines
        self.block, self.device = block, device  # several cards: lines go through the block, prefixed
        self.tty = block.tty if block is not None else sys.stderr.isatty()
        self._status = StatusLine(sys.stderr)
        self._lock = threading.Lock()
        self._last_plain = 0.0
        self._trial_label = ""

    def __call__(self, event) -> None:
        with self._lock:
            if self.json_lines:
                sys.stdout.write(json.dumps(event.to_json(), default=str) + "\n")
                sys.stdout.flush()
            self._human(event)

    def _line(self, text: str) -> None:
        if self.block is not None:
            self.block.line(f"[{self.device}] {text}")
            return
        self._status.clear()
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def _v(self, value: int | None) -> str:
        return "-" if value is None else f"{value:+d} {self.unit}"

    def _human(self, ev) -> None:
        if isinstance(ev, SessionStarted):
            what = "resuming session" if ev.resumed else "new session"
            unsafe = f"; unsafe (never tried): {', '.join(self._v(u) for u in ev.unsafe)}" if ev.unsafe else ""
            p = ev.params
            self._line(f"bisect {ev.device} {ev.label}: {what} {ev.session}; step {p.get('step')} res "
                       f"{p.get('resolution')} margin {p.get('margin')} {ev.unit}, trial "
                       f"{format_duration(p.get('trial_s', 0))}, confirm {format_duration(p.get('confirm_s', 0))}"
                       f"{unsafe}")
        elif isinstance(ev, TrialRecovered):
            self._line(f"recovered open trial: {self._v(ev.result.setting)} {ev.result.phase} counted as FAIL "
                       f"({ev.result.kind}): {ev.result.reason}; added to the unsafe list")
        elif isinstance(ev, TrialStarted):
            # the plan's count is an upper bound (a descent to the range end), as the TUI says it: "of <=N"
            of = f" of ≤{ev.expected_trials}" if ev.expected_trials else ""
            self._trial_label = f"trial {ev.index}{of} "
            if not self.tty:
                self._line(f"trial {ev.index}{of}: {self._v(ev.setting)} {ev.phase} "
                           f"({format_duration(ev.duration_s)}) started")
            elif self.block is not None:
                self.block.status(self.device, f"{self._trial_label}{self._v(ev.setting)} {ev.phase} started")
        elif isinstance(ev, TrialProgress):
            eta_total = "" if ev.eta_total_s is None else f"  bisect ~{format_duration(ev.eta_total_s)} left"
            if self.tty:
                frac = min(1.0, ev.elapsed_s / ev.duration_s) if ev.duration_s else 0.0
                bar = "#" * int(frac * 20) + "." * (20 - int(frac * 20))
                step = "" if ev.step is None else f" step {ev.step}"
                left = FINISHING if ev.finishing else f"ETA {format_duration(ev.eta_s)}"
                text = (f"{self._trial_label}[{bar}] {frac:4.0%} {self._v(ev.setting)} {ev.phase}{step}  "
                        f"{left}{eta_total}")
                if self.block is not None:
                    self.block.status(self.device, text)
                    return
                self._status.show(text)
            elif ev.elapsed_s - self._last_plain >= 30 or ev.elapsed_s < self._last_plain:
                self._last_plain = ev.elapsed_s
                self._line(f"  {self._v(ev.setting)} {ev.phase}: {format_duration(ev.elapsed_s)} of "
                           f"{format_duration(ev.duration_s)}{eta_total}")
        elif isinstance(ev, TrialWarning):
            self._line(f"tuner: warning: {ev.message}")
        elif isinstance(ev, TrialFinished):
            self._last_plain = 0.0
            self._line(f"trial {ev.index}: " + _trial_line(ev.result))
        elif isinstance(ev, Recommendation):  # printed with the final table; a card's line stops showing 100 %
            if self.block is not None:
                self.block.status(self.device, f"own result {self._v(ev.setting)}; waiting for the other cards")
        elif isinstance(ev, BisectFailed):
            self._line(f"bisect failed ({ev.kind}): {ev.reason}")
        elif isinstance(ev, BisectStopped):
            self._line(f"bisect stopped: {ev.reason}; the card is back at stock; continue with --resume")


def _fmt(value, spec: str) -> str | None:
    return None if value is None else format(value, spec)


def _trial_line(r: TrialResult) -> str:
    figures = ", ".join(x for x in (
        _fmt(r.tok_s, ",.0f") and f"{r.tok_s:,.0f} tok/s", _fmt(r.power_w, ".0f") and f"{r.power_w:.0f} W",
        _fmt(r.tok_per_j, ".2f") and f"{r.tok_per_j:.2f} tok/J",
        _fmt(r.max_temp_c, ".0f") and f"max {r.max_temp_c:.0f} °C") if x)
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
    if rec.efficiency_gain_pct is not None:
        head += (f"\nefficiency: {rec.tuned_tok_per_j:.3f} tok/J vs {rec.baseline_tok_per_j:.3f} at stock: "
                 f"{rec.efficiency_gain_pct:+.1f}% (measured at {rec.measured_at:+d} {rec.unit}; power "
                 f"{rec.baseline_power_w:.0f} -> {rec.tuned_power_w:.0f} W)")
        if simulated:
            head += ("\nnote: SIMULATED card: power is the simulator's; tok/s is the CPU engine's and swings with "
                     "the host's load, so the gain is not meaningful here")
    return head


def run(args, ctx) -> int:
    backend = ctx.backend
    if args.device is not None and (args.device.strip() == "all" or "," in args.device):
        from tuner.commands import _bisect_rig  # several cards at once

        return _bisect_rig.run(args, ctx)
    device = pick_device(backend, args.device)
    knob = backend.knob(device.id)
    if args.from_last:
        check_save_name(args.save)
        return _save_from_last(args, backend, device, knob)
    durations = {name: parse_duration_s(text) for name, text in (("trial_s", args.trial), ("confirm_s", args.confirm))
                 if text is not None}  # left out: the core's default
    params = BisectParams(step=args.step, resolution=args.resolution, margin=args.margin, floor=args.floor,
                          mode=args.mode, preset=args.preset, compile=args.compile, resume=args.resume,
                          restart=args.restart, tolerance=args.tolerance, **durations)
    if args.tolerance:
        from tuner.tuning.sensitivity import tolerance_note

        print(f"tuner: warning: {tolerance_note()}", file=sys.stderr)
    printer = _Printer(knob.unit, args.json)
    job = prepare_bisect(backend, device.id, params, printer, save=args.save)
    _confirm_real_card(device, args)
    outcome, interrupted = run_in_worker(job)
    if interrupted or outcome.status == "stopped":
        if not args.json and outcome.trials:
            print(_table(outcome.trials), file=sys.stderr)
        return exit_codes.INTERRUPTED
    if not args.json:
        if outcome.trials:
            print(_table(outcome.trials))
        if outcome.recommendation is not None:
            print(_recommendation_text(outcome.recommendation, device.label, device.simulated))
    if outcome.recommendation is not None and args.save:
        try:
            _save(args, backend, device, outcome)
        except TunerError as e:  # the name was taken meanwhile, the disk is full...: the journal keeps the result
            e.remedy = (f"{e.remedy + '; ' if e.remedy else ''}the result is kept: save it with `tuner bisect "
                        f"--device {device.id} --save NAME --from-last`")
            raise
    return outcome.exit_code


def run_in_worker(job):
    """Run `job` (a BisectJob or a RigBisectJob) and return (its outcome, whether a signal interrupted it).

    The job runs in a worker so that a signal in the main thread only asks it to stop (an exception inside
    Thread.join can leave the thread looking finished; an Event does not). Fatal signals are only recorded
    (signals.Inbox): this loop decides, asks the job to stop once, and a second or third signal (a terminal
    drop sends SIGHUP, then SIGCONT/SIGTERM) changes nothing while the worker makes the cards safe."""
    box: dict = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["outcome"] = job.run()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            box["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=work, name="bisect", daemon=True)
    with signals.Inbox() as inbox:
        worker.start()
        stopping = False
        while not done.wait(0.2):
            if inbox.first is not None and not stopping:
                stopping = True
                job.stop()  # the worker stops the engines, resets the cards, closes the journals (resumable)
    if "error" in box:
        raise box["error"]
    return box["outcome"], inbox.first is not None


class _Block:
    """Several cards' progress on stderr: on a TTY a block of one line per card, redrawn in place under the
    lines that stay (finished trials, warnings); otherwise only the lines that stay, each prefixed with its card."""

    def __init__(self, devices: tuple[str, ...]):
        self.devices = devices
        self.tty = sys.stderr.isatty()
        self._status = dict.fromkeys(devices, "waiting")
        self._drawn = 0

    def _clear(self) -> None:
        if self._drawn:
            sys.stderr.write(f"\033[{self._drawn}F\033[J")  # up to the block's first line, clear to the end
            self._drawn = 0

    def _draw(self) -> None:
        width = max(20, shutil.get_terminal_size().columns - 1)  # a wrapped line would break the count
        for d in self.devices:
            sys.stderr.write(f"{d}: {self._status[d]}"[:width] + "\n")
        self._drawn = len(self.devices)

    def line(self, text: str) -> None:
        if self.tty:
            self._clear()
            sys.stderr.write(text + "\n")
            self._draw()
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def status(self, device: str, text: str) -> None:
        self._status[device] = text
        if self.tty:
            self._clear()
            self._draw()
            sys.stderr.flush()

    def end(self) -> None:
        if self.tty:
            self._clear()
            sys.stderr.flush()


def _save(args, backend, device, outcome) -> None:
    from tuner.actions.bisect import profile_from_outcome
    from tuner.actions.screen.record import bundle_beside_profile
    from tuner.profiles import save_profile

    path = save_profile(profile_from_outcome(backend, device.id, outcome, args.save), overwrite=False)
    reference = bundle_beside_profile(backend, device.id, outcome, path)
    if args.json:
        sys.stdout.write(json.dumps({"event": "profile_saved", "name": args.save, "path": str(path),
                                     "reference": reference.to_dict()}) + "\n")
    else:
        print(f"saved profile {args.save!r} to {path}{reference.text()}")


def _save_from_last(args, backend, device, knob) -> int:
    from tuner.tuning.job import last_outcome

    if not args.save:
        raise UsageError("--from-last saves the last result and needs --save NAME", "add --save NAME")
    _save(args, backend, device, last_outcome(device.id, knob))
    return exit_codes.OK


__all__ = ["add_parser", "run", "run_in_worker"]
