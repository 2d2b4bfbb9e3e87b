"""`tuner stress`: run the stress engine on one card at its current setting, and say whether it held.

The engine (`python -m tuner.engine`, docs/engine.md) runs in its own process; this command picks the device
string and, for a simulated card, the faults it injects below its hidden limit, shows one live progress line
on stderr when that is a terminal, and prints a summary. `--json` forwards the engine's events to stdout as
JSON lines and ends with one `result` line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from tuner.commands._argtypes import positive_int
from tuner.commands._device import pick_device
from tuner.commands._output import StatusLine
from tuner.core import exit_codes
from tuner.core.durations import format_duration, parse_duration_s
from tuner.core.models import Mode, Verdict

DEFAULT_DURATION = "5m"
SIM_CANARY_EVERY = 10  # simulated cards: canaries often, so short runs meet the injected faults
PROGRESS_INTERVAL_S = 0.25


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "stress",
        help="run the training stress test on one card at its current setting",
        description="Run the stress engine on one card at its current setting: a small nanochat-style training "
        "run that checks every step for miscomputation (canary replay, GEMM check, non-finite values; a reference "
        "trajectory with --reference), not only for crashes and NaNs. Nothing is changed on the card. A simulated "
        "card injects silent bit flips below its hidden limit and hangs far below it.",
        epilog="Exit code 1 means a fault was found (the setting is unstable); a setup problem (out of memory, "
        "no GPU visible to torch) is 2, never 1. The JSON-lines protocol of --json is documented in docs/engine.md.",
    )
    p.add_argument("--device", metavar="ID", help="device id from `tuner list` (default: the only card)")
    bound = p.add_mutually_exclusive_group()
    bound.add_argument("--duration", metavar="DUR", help=f"how long (default {DEFAULT_DURATION}; 90s, 5m, 1h)")
    bound.add_argument("--steps", type=positive_int, metavar="N", help="how many training steps instead")
    p.add_argument("--mode", choices=tuple(Mode), default=Mode.TRAIN,
                   help="train (default), gemm (GEMM burn only) or mixed (partial load and idle gaps)")
    p.add_argument("--preset", choices=("nanochat", "tiny", "small", "large"),
                   help="model size (default: nanochat on GPUs, tiny on the CPU / simulated card)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the engine's model and optimizer (default: on for GPUs)")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp16", "fp32"),
                   help="compute dtype (default auto: bf16 where supported, else fp32; or $TUNER_DTYPE)")
    p.add_argument("--seed", type=int, default=0, help="model, data and fault seed (default 0)")
    p.add_argument("--canary-every", type=positive_int, metavar="K",
                   help=f"canary replay every K steps (default 100; {SIM_CANARY_EVERY} on a simulated card)")
    p.add_argument("--record", metavar="PATH", help="save this run's per-step digests as a reference")
    p.add_argument("--reference", metavar="PATH", help="compare every step with a recorded stock run")
    p.add_argument("--json", action="store_true", help="engine events as JSON lines on stdout, then a result")
    p.set_defaults(run=run)


def build_config(args, target):
    """The engine configuration for `args` on `target` (a StressTarget), and the watchdog to use."""
    from tuner.tuning import engine_client as sc
    steps = args.steps
    duration_s = None if steps is not None else parse_duration_s(args.duration or DEFAULT_DURATION)
    canary_every = args.canary_every or (SIM_CANARY_EVERY if target.simulated else None)
    overrides = {"mode": args.mode, "seed": args.seed, "record": args.record, "reference": args.reference}
    if args.compile is not None:
        overrides["compile"] = args.compile
    if args.dtype and args.dtype != "auto":
        overrides["dtype"] = args.dtype
    if canary_every is not None:
        overrides["canary_every"] = canary_every
    config = sc.engine_request(target, preset=args.preset, duration_s=duration_s, steps=steps, **overrides)
    if target.simulated:  # the CPU engine steps every few ms: a silent second or five is already a hang
        policy = sc.WatchdogPolicy(min_silence_s=5.0, first_step_timeout_s=120.0, kill_grace_s=2.0)
    else:
        policy = sc.WatchdogPolicy.for_config(config)
    return config, policy


class ProgressLine:
    """One self-overwriting line on a terminal: step, loss, tok/s, ETA. Silent when not a terminal."""

    def __init__(self, stream, *, steps: int | None, duration_s: float | None, clock=time.monotonic):
        self.stream, self.steps, self.duration_s, self.clock = stream, steps, duration_s, clock
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        self._status = StatusLine(stream)
        self._t_start: float | None = None
        self._last_draw = 0.0
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

    def text(self, ev) -> str:
        parts = [f"step {ev.step}" + (f"/{self.steps}" if self.steps else "")]
        if getattr(ev, "loss", None) is not None:
            parts.append(f"loss {ev.loss:.4f}" if math.isfinite(ev.loss) else f"loss {ev.loss}")
        if getattr(ev, "tok_s", None):
            parts.append(f"{ev.tok_s:,.0f} tok/s")
        elif getattr(ev, "tflops", None):
            parts.append(f"{ev.tflops:.2f} TFLOP/s")
        eta = self.eta_s(ev.step)
        if eta is not None:
            parts.append(f"ETA {format_duration(eta)}")
        return "  ".join(parts)

    def update(self, ev) -> None:
        from tuner.tuning import engine_client as sc
        if isinstance(ev, sc.StartEvent):
            self._t_start = self.clock()
        if not isinstance(ev, (sc.StepEvent, sc.GemmEvent)):
            return
        if ev.dt_ms is not None:
            self._dts.append(ev.dt_ms)
        now = self.clock()
        if not self.enabled or now - self._last_draw < PROGRESS_INTERVAL_S:
            return
        self._last_draw = now
        self._status.show(self.text(ev))

    def clear(self) -> None:
        if self.enabled:
            self._status.clear()


def summary_lines(device, config, result) -> list[str]:
    opts = config.options
    head = (f"stress {device.id} ({device.label}) on {opts.device}, preset {opts.preset}, {opts.mode}: "
            f"{result.verdict.upper()}")
    lines = [head]
    if result.verdict == Verdict.FAIL:
        at = f" at step {result.failure_step}" if result.failure_step is not None else ""
        lines.append(f"  {result.kind}{at}: {result.reason}")
    elif result.verdict == Verdict.ERROR:
        lines.append(f"  {result.kind or 'error'}: {result.reason}")
        tail = [ln for ln in result.stderr_tail.splitlines() if ln.strip()]
        if result.kind in ("setup", "internal", "crash") and tail:
            lines.append(f"  engine said: {tail[-1][:200]}")
    facts = [f"{result.steps} steps" + (f" in {result.duration_s:.1f} s" if result.duration_s is not None else "")]
    if result.median_tok_s:
        facts.append(f"median {result.median_tok_s:,.0f} tok/s")
    if result.bpb is not None:
        facts.append(f"held-out {result.bpb:.3f} bits/byte")
    if result.sensitivity:
        facts.append(f"sensitivity {result.sensitivity}")
    lines.append("  " + ", ".join(facts))
    end = result.end
    if end is not None and end.reference and end.reference.get("note"):
        lines.append(f"  reference: {end.reference['note']}")
    if end is not None and end.setup_problems:
        lines.append("  setup problems: " + "; ".join(end.setup_problems))
    return lines


def result_document(device, config, result) -> dict:
    return {
        "event": "result", "device": device.id, "engine_device": config.options.device, "verdict": result.verdict,
        "kind": result.kind, "reason": result.reason, "failure_step": result.failure_step, "steps": result.steps,
        "duration_s": result.duration_s, "median_tok_s": result.median_tok_s, "bpb": result.bpb,
        "sensitivity": result.sensitivity, "engine_exit_code": result.exit_code,
        "exit_code": exit_code_for(result),
    }


def exit_code_for(result) -> int:
    if result.verdict == Verdict.PASS:
        return exit_codes.OK
    if result.verdict == Verdict.FAIL:
        return exit_codes.TEST_FAILED
    if result.kind in ("stopped", "interrupted"):
        return exit_codes.INTERRUPTED
    return exit_codes.USAGE


def _forward(ev) -> None:
    from tuner.tuning import engine_client as sc
    doc = ev.raw if not isinstance(ev, sc.LogEvent) else {"event": "log", "line": ev.line}
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def run(args, ctx) -> int:
    from tuner.tuning import engine_client as sc
    backend = ctx.backend
    device = pick_device(backend, args.device)
    target = backend.stress_target(device.id)
    config, policy = build_config(args, target)
    progress = ProgressLine(sys.stderr, steps=config.options.steps, duration_s=config.options.duration_s)
    stress = sc.StressRun(config, watchdog=policy)
    backend.note_load(device.id, True)
    try:
        stress.start()
        for ev in stress.events():
            if args.json:
                _forward(ev)
            progress.update(ev)
        result = stress.result()
    finally:
        progress.clear()
        if stress.proc is not None and stress.proc.poll() is None:  # Ctrl-C, SIGTERM, an error here
            stress.stop()
            try:
                stress.result(timeout=policy.kill_grace_s + 5)
            except TimeoutError:
                pass
        backend.note_load(device.id, False)
    if args.json:
        _forward(sc.UnknownEvent(t=0.0, raw=result_document(device, config, result)))
    else:
        print("\n".join(summary_lines(device, config, result)))
    return exit_code_for(result)
