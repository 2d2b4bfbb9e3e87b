"""`tuner stress`: run the stress engine on one card at its current setting, and say whether it held.

The rules (the engine request, the watchdog, the canary, the stock reference and the kernel log) are the stress
action's, `tuner.actions.stress`, which the Tune screen asks too. This command turns its options into a request,
shows one live progress line on stderr when that is a terminal, says on stderr what each check will do, and
prints a summary. `--json` forwards the stress run's engine events to stdout as JSON lines (docs/engine.md) and
ends with one `result` line (below, `result_document`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tuner.actions.parameters import DURATION, STRESS, STRESS_DURATION, STRESS_LENGTH
from tuner.commands._argtypes import Subparsers, add_arguments
from tuner.commands._device import pick_device
from tuner.commands._output import StatusLine
from tuner.commands._worker import run_in_worker
from tuner.core import exit_codes
from tuner.core.durations import format_duration
from tuner.core.errors import UsageError
from tuner.core.models import Verdict

if TYPE_CHECKING:
    from tuner.actions.context import Context
    from tuner.actions.stress import StressOutcome, StressRequest, StressSession
    from tuner.core.models import DeviceInfo
    from tuner.engine.events import GemmEvent, StepEvent
    from tuner.tuning.engine_client import EngineConfig


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "stress",
        help="run the training stress test on one card at its current setting",
        description="Run the stress engine on one card at its current setting: a small nanochat-style training "
        "run that checks every step for miscomputation, not only for crashes and NaNs: each step is compared bit "
        "for bit with this card's stock reference for the workload (recorded first, at stock, the first time; "
        "kept under $XDG_STATE_HOME/tuner/references/), with canary replays, a GEMM check, non-finite values, "
        "device errors, a watchdog and the kernel log besides. With no reference and the card not at stock, it "
        "does not start unless --no-reference says to run the weaker checks only. Nothing is changed on the card. "
        "A simulated card injects silent bit flips below its hidden limit and hangs far below it.",
        epilog="Exit code 1 means a fault was found (the setting is unstable); a setup problem (out of memory, "
        "no GPU visible to torch) is 2, never 1, and so is a run refused for want of a stock reference. The "
        "JSON-lines protocol of --json (the engine's events, then one `result` line saying which checks ran) is "
        "documented in docs/engine.md.",
    )
    p.add_argument("--device", metavar="ID", help="device id from `tuner list` (default: the only card)")
    add_arguments(p.add_mutually_exclusive_group(), STRESS_LENGTH)
    add_arguments(p, STRESS)
    ref = p.add_mutually_exclusive_group()
    ref.add_argument("--reference", metavar="PATH",
                     help="compare every step with this recorded stock run (default: this card's cached stock "
                     "reference for the workload, recorded first when the card is at stock)")
    ref.add_argument("--no-reference", action="store_true",
                     help="run without comparing with a stock reference (weaker: canary, GEMM, non-finite, device "
                     "errors, watchdog and kernel log only); needed when there is none and the card is not at stock")
    ref.add_argument("--record", metavar="PATH", help="save this run's per-step digests as a reference in a new "
                     "file PATH (the run then compares with none)")
    p.add_argument("--json", action="store_true", help="engine events as JSON lines on stdout, then a result")
    p.set_defaults(run=run)


def build_request(args: argparse.Namespace, device_id: str) -> StressRequest:
    """The stress action's request for `args` on `device_id` (tuner.actions.stress decides the rest)."""
    from tuner.actions.stress import StressRequest
    steps = args.steps
    duration_s = None if steps is not None else DURATION.parse(args.duration or STRESS_DURATION, where=DURATION.flag)
    record = Path(args.record) if args.record else None
    if record is not None and (record.exists() or record.is_symlink()):  # as `reference record --out`, `report`
        raise UsageError(f"--record {record}: already exists; nothing was run",
                         "choose another file name, or move that one aside first")
    if record is not None:  # found now, never after the whole run (as `reference record --out`)
        folder = next(p for p in record.absolute().parents if p.exists())  # the one the missing ones go in
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise UsageError(f"--record {record}: the directory {folder} cannot be written by this user; nothing "
                             "was run", "choose a directory you can write, or fix its permissions")
    return StressRequest(
        device_id, duration_s=duration_s, steps=steps, **{p.name: getattr(args, p.id) for p in STRESS},
        reference=Path(args.reference) if args.reference else None, record=record,
        without_reference=args.no_reference)


class ProgressLine:
    """One self-overwriting line on a terminal: step, loss, tok/s, ETA. Silent when not a terminal."""

    def __init__(self, stream: IO[str], *, steps: int | None, duration_s: float | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.steps, self.duration_s, self.clock = steps, duration_s, clock
        self._status = StatusLine(stream)
        self._t_start: float | None = None
        self._dts: list[float] = []

    def eta_s(self, step: int) -> float | None:
        if self._t_start is None:
            return None
        if self.duration_s is not None:
            return max(0.0, self.duration_s - (self.clock() - self._t_start))
        if self.steps is not None and self._dts:
            recent = sorted(self._dts[-50:])
            return max(0, self.steps - step) * recent[len(recent) // 2] / 1e3
        return None

    def text(self, ev: StepEvent | GemmEvent) -> str:
        parts = [f"step {ev.step}" + (f"/{self.steps}" if self.steps else "")]
        loss, tok_s = getattr(ev, "loss", None), getattr(ev, "tok_s", None)  # a GEMM step has neither
        if loss is not None:
            parts.append(f"loss {loss:.4f}" if math.isfinite(loss) else f"loss {loss}")
        if tok_s:
            parts.append(f"{tok_s:,.0f} tok/s")
        elif getattr(ev, "tflops", None):
            parts.append(f"{ev.tflops:.2f} TFLOP/s")
        eta = self.eta_s(ev.step)
        if eta is not None:
            parts.append(f"ETA {format_duration(eta)}")
        return "  ".join(parts)

    def update(self, ev: object) -> None:
        from tuner.engine.events import GemmEvent, StartEvent, StepEvent
        if isinstance(ev, StartEvent):
            self._t_start = self.clock()
        if not isinstance(ev, (StepEvent, GemmEvent)):
            return
        self._dts.append(ev.dt_ms)  # a float in every step and round (tuner.engine.events), never None
        if self._status.due(self.clock()):
            self._status.show(self.text(ev))

    def clear(self) -> None:
        self._status.clear()  # erases only a line it showed, and it shows one only on a terminal


def summary_lines(device: DeviceInfo, config: EngineConfig, outcome: StressOutcome) -> list[str]:
    """The summary of a stress outcome (tuner.actions.stress.StressOutcome) of `config`'s run on `device`."""
    opts = config.options
    result = outcome.result
    head = (f"stress {device.id} ({device.label}) on {opts.device}, preset {opts.preset}, {opts.mode}: "
            f"{str(outcome.verdict).upper()}")
    lines = [head]
    if outcome.purpose == "reference":
        lines.append(f"  {outcome.summary()}")
    if outcome.kernel_events:
        lines.append(f"  {outcome.reason}")
    elif result is not None and result.verdict == Verdict.FAIL:
        at = f" at step {result.failure_step}" if result.failure_step is not None else ""
        lines.append(f"  {result.kind}{at}: {result.reason}")
    elif result is not None and result.verdict == Verdict.ERROR and outcome.verdict != Verdict.STOPPED:
        lines.append(f"  {result.kind or 'error'}: {result.reason}")
        tail = [ln for ln in result.stderr_tail.splitlines() if ln.strip()]
        if result.kind in ("setup", "internal", "crash") and tail:
            lines.append(f"  engine said: {tail[-1][:200]}")
    if result is not None:
        facts = [f"{result.steps} steps" + (f" in {result.duration_s:.1f} s" if result.duration_s is not None
                                            else "")]
        if result.median_tok_s:
            facts.append(f"median {result.median_tok_s:,.0f} tok/s")
        if result.bpb is not None:
            facts.append(f"held-out {result.bpb:.3f} bits/byte")
        if result.sensitivity:
            facts.append(f"sensitivity {result.sensitivity}")
        lines.append("  " + ", ".join(facts))
    lines.append(f"  reference: {'compared' if outcome.compared else 'NOT compared'} ({outcome.reference_why})")
    end = None if result is None else result.end
    if end is not None and end.reference is not None and end.reference.note:
        lines.append(f"  reference: {end.reference.note}")
    if outcome.kernel_log.startswith("OFF"):
        lines.append(f"  kernel log: {outcome.kernel_log}")
    if result is not None and result.engine_stopped_s:  # as checks_off says it in --json
        lines.append(f"  not under load for the whole run: the stress engine was stopped from outside for "
                     f"{result.engine_stopped_s:.0f} s (SIGSTOP or a debugger)")
    if end is not None and end.setup_problems:
        lines.append("  setup problems: " + "; ".join(end.setup_problems))
    return lines


def result_document(device: DeviceInfo, config: EngineConfig, outcome: StressOutcome) -> dict[str, Any]:
    """The `result` line of `--json`: the engine's result of the stress run, and the action's own findings (the
    reference comparison, the kernel log, every check that did not run at full strength)."""
    r = outcome.result
    return {
        "event": "result", "device": device.id, "simulated": device.simulated, "engine_device": config.options.device,
        "verdict": str(outcome.verdict), "kind": outcome.kind, "reason": outcome.reason,
        "failure_step": None if r is None else r.failure_step, "steps": 0 if r is None else r.steps,
        "duration_s": None if r is None else r.duration_s, "median_tok_s": None if r is None else r.median_tok_s,
        "bpb": None if r is None else r.bpb, "sensitivity": None if r is None else r.sensitivity,
        "engine_exit_code": None if r is None else r.exit_code, "run": outcome.purpose,
        "reference": outcome.reference_doc(), "kernel_log": outcome.kernel_log,
        "kernel_events": [e.to_dict() for e in outcome.kernel_events], "checks_off": outcome.checks_off(),
        "exit_code": exit_code_for(outcome),
    }


def exit_code_for(outcome: StressOutcome) -> int:
    """A stress outcome's exit code."""
    verdict, kind = outcome.verdict, outcome.kind
    if verdict == Verdict.PASS:
        return exit_codes.OK
    if verdict == Verdict.FAIL:
        return exit_codes.TEST_FAILED
    if verdict == Verdict.STOPPED or kind in ("stopped", "interrupted"):
        return exit_codes.INTERRUPTED
    return exit_codes.USAGE


class _Reporter:
    """Everything the stress action reports, as this command shows it: lines and detector states on stderr (the
    progress line cleared first), the stress run's engine events on stdout with --json (the stock recording's
    are not forwarded: a script reads one run, `start` to `end`). One lock: the kernel-log fault arrives from
    the watcher's thread."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.progress: ProgressLine | None = None
        self.config: EngineConfig | None = None
        self._forwarding = False
        self._said: dict[str, str] = {}  # each detector's state as last said
        self._lock = threading.Lock()

    def __call__(self, event: object) -> None:
        from tuner.actions.stress import DetectorState, RunStarted
        from tuner.engine.events import Event, LogEvent
        with self._lock:
            if isinstance(event, RunStarted):
                self._forwarding = event.purpose == "stress"
                self.config = event.config
                options = event.config.options
                self.progress = ProgressLine(sys.stderr, steps=options.steps, duration_s=options.duration_s)
            elif isinstance(event, DetectorState):
                said = self._said.get(event.name)
                self._said[event.name] = event.value
                if event.value not in ("ok", "recording", said):  # each state once; the action's line says why
                    self._say(f"{event.name}: {event.value}")
            elif isinstance(event, str):
                self._say(event)
            elif isinstance(event, Event):
                if self.as_json and self._forwarding:
                    doc = {"event": "log", "line": event.line} if isinstance(event, LogEvent) else event.raw
                    _write_json(doc)
                if self.progress is not None:
                    self.progress.update(event)

    def _say(self, line: str) -> None:
        self.clear()
        print(f"stress: {line}", file=sys.stderr, flush=True)

    def clear(self) -> None:
        if self.progress is not None:
            self.progress.clear()


def _write_json(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def run(args: argparse.Namespace, ctx: Context) -> int:
    from tuner.actions.stress import StressSession, engine_config
    backend = ctx.backend
    device = pick_device(backend, args.device)
    request = build_request(args, device.id)
    report = _Reporter(args.json)
    session = StressSession(backend, request, on_event=report)
    try:
        # a signal stops the session (the engine's `end`, then the result, `stopped`); Ctrl-Z ends it before tuner
        # stops (tuner.commands._worker); NoStockReference: a usage error, nothing started
        outcome, _interrupted = run_in_worker(_StressJob(session, report), "stress")
    finally:
        report.clear()
    config = report.config or engine_config(request, backend.stress_target(device.id),
                                            duration_s=request.duration_s, steps=request.steps)
    if args.json:
        _write_json(result_document(device, config, outcome))
    else:
        print("\n".join(summary_lines(device, config, outcome)))
    return exit_code_for(outcome)  # as the result says: a signal stopped it (130), or it failed before (1)


class _StressJob:
    """A stress session as a worker's job (tuner.commands._worker): a fatal signal stops it; Ctrl-Z ends its engine
    before tuner stops (a stopped tuner would leave it loading the card with no watchdog and no kernel-log watcher),
    and the session, stopped, ends when tuner goes on (SIGCONT): a run cut short is not run again from its start."""

    def __init__(self, session: StressSession, report: Callable[[object], None]) -> None:
        self.session, self.report = session, report
        self._lock = threading.Lock()
        self._pausing = False
        self._engine_gone = threading.Event()  # the session is over: its engine ended, its load and watcher too
        self._resumed = threading.Event()

    def run(self) -> StressOutcome:
        try:
            return self.session.run()
        finally:
            self._engine_gone.set()
            with self._lock:
                pausing = self._pausing
            if pausing:  # the outcome waits for SIGCONT, so this process can stop first
                self._resumed.wait()

    def stop(self) -> None:
        self.session.stop()
        self._resumed.set()

    def pause(self) -> None:
        with self._lock:
            self._pausing = True
        self.report("Ctrl-Z: the stress run is stopped before tuner stops (its engine would go on loading the card "
                    "unwatched); it ends as stopped when tuner goes on")
        self.session.stop()

    def paused_safely(self) -> bool:
        return self._engine_gone.is_set()

    def resume(self) -> None:
        self._resumed.set()
