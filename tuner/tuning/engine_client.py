"""Run the stress engine (`python -m tuner.engine`) in a subprocess and read what it says. Plain Python: no torch.

- `engine_request(target, ...)` is the one builder of an `EngineConfig`: the engine's own options
  (`tuner.engine.options`, torch-free) rendered to its command line by `.argv()`.
- each line is read with `tuner.engine.events.decode_line`: one line to the typed, frozen event, never raising
  (an unknown name is an `UnknownEvent`, a broken event an `InvalidEvent` the run reports, anything else a `LogEvent`).
- `StressRun` starts the engine in its own session, yields events as they arrive (iterate from a worker
  thread), watches for hangs (`WatchdogPolicy`), stops it on request (SIGTERM to the group, SIGKILL after a
  grace period), and sums it up in a `StressResult`.

The protocol is documented field by field in docs/engine.md.
"""

from __future__ import annotations

import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Self

import psutil

from tuner.core.errors import UsageError
from tuner.core.models import StressTarget
from tuner.core.privileges import EngineIdentity, EngineRefused, engine_identity
from tuner.engine.events import (
    CanaryEvent,
    EndEvent,
    Event,
    FaultEvent,
    GemmEvent,
    HeartbeatEvent,
    InvalidEvent,
    PhaseEvent,
    SegmentEvent,
    StartEvent,
    StepEvent,
    decode_line,
)
from tuner.engine.options import GPU_DEFAULT_PRESET, EngineOptions, Injection, UsageProblem, to_argv
from tuner.engine.patterns import match_device_error
from tuner.tuning import engine_spawn

# --- the request ------------------------------------------------------------------------------------------

DEFAULT_DURATION_S = 300.0  # a run with no bound given (UI "stress" button): 5 minutes
SIM_HANG_STEP = 3  # a simulated card that hangs stops the engine at this step


@dataclass(frozen=True)
class EngineConfig:
    """One engine run: the engine's own options (`tuner.engine.options.EngineOptions`, validated here, rendered
    to its command line by `tuner.engine.options.to_argv`) and how to launch it. Build it with `engine_request`."""

    options: EngineOptions
    env: Mapping[str, str] = field(default_factory=dict)  # added to the engine's environment
    python: str = sys.executable
    # who runs it (tuner.core.privileges: never root); None: the process that starts it
    identity: EngineIdentity | EngineRefused | None = None

    def __post_init__(self) -> None:
        options = replace(self.options, injections=list(self.options.injections))  # our own copy
        try:
            options.validate()
        except UsageProblem as e:  # the engine would refuse it: say so before starting anything
            raise UsageError(f"the stress engine would refuse this run: {e}") from None
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "env", dict(self.env))

    def argv(self) -> list[str]:
        options = self.options
        if options.parent_pid is None:  # the engine ends when we do, even after a kill -9
            options = replace(options, parent_pid=os.getpid())
        return [self.python, "-u", "-m", "tuner.engine", *to_argv(options)]

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {**(os.environ if base is None else base), **self.env, "PYTHONUNBUFFERED": "1"}
        root = str(Path(__file__).resolve().parents[2])  # so `-m tuner.engine` works from any directory
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env


def fault_seed_for(seed: int, setting: int) -> int:
    """The engine's `--fault-seed` for a trial at `setting`: stable, and different for every setting, so a
    simulated card's injected faults do not land on the same step at every setting (the data and weights, and so
    the reference trajectory, stay seeded by `seed`)."""
    return seed * 1_000_003 + setting


def default_preset(target: StressTarget) -> str:
    """The model shape a run on `target` uses unless told: `tiny` on the CPU (simulated cards), `nanochat` (the
    load that matters) on a GPU."""
    return "tiny" if target.torch_device == "cpu" or target.simulated else GPU_DEFAULT_PRESET


def engine_request(target: StressTarget, *, duration_s: float | None = None, steps: int | None = None,
                   preset: str | None = None, setting: int | None = None, **options: Any) -> EngineConfig:
    """The one way to ask for an engine run on a backend's `StressTarget` (bisect trials, `tuner stress`, the
    TUI's stress and verify runs).

    From the target: its device string, the PCI bus id the engine must find, its environment and, for a
    simulated card, its faults (fault rate; `hang@SIM_HANG_STEP` when it hangs). Without a bound the run lasts
    DEFAULT_DURATION_S; without a preset, simulated and CPU targets use `tiny`, GPUs `nanochat`. `setting` (a trial
    at that setting) picks the fault seed. `options` are further EngineOptions fields; None means the engine's
    default. Raises UsageError for a run the engine would refuse."""
    if duration_s is None and steps is None:
        duration_s = DEFAULT_DURATION_S
    chosen = {**dict(target.engine_options), **{name: value for name, value in options.items() if value is not None}}
    seed = int(chosen.get("seed", 0))
    if setting is not None:
        chosen["fault_seed"] = fault_seed_for(seed, setting)
    injections = [Injection.parse(str(i)) for i in chosen.pop("injections", ())]
    if target.hang:
        injections.append(Injection("hang", SIM_HANG_STEP))
    try:
        opts = EngineOptions(device=target.torch_device, preset=preset or default_preset(target), steps=steps,
                             duration_s=duration_s, fault_rate=float(target.fault_rate or 0.0),
                             injections=injections, expect_pci_bus_id=target.pci_bus_id or None,
                             **chosen)
    except TypeError as e:  # a misspelt option is a programming error, but say which
        raise ValueError(f"engine_request: {e}") from None
    return EngineConfig(opts, env=dict(target.env or {}), identity=engine_identity(simulated=target.simulated))


# --- result -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StressResult:
    verdict: str  # "pass", "fail" or "error"
    kind: str | None  # the engine's (FAULT_KINDS, ERROR_KINDS of tuner.engine.events) or ours: hang, crash, stopped
    reason: str
    failure_step: int | None
    steps: int
    duration_s: float | None
    median_tok_s: float | None
    bpb: float | None
    exit_code: int | None
    stderr_tail: str = ""
    sensitivity: str | None = None
    # the reference step the failing step was compared with (with --reference-loop: its step within the pass);
    # None without a reference or when the engine could not say (hang, crash)
    reference_step: int | None = None
    # how long the engine was seen stopped by a signal from outside (state T in /proc/PID/stat: SIGSTOP, a
    # debugger); 0 when never. Such a run did not load the card for its whole length (see `WatchdogPolicy`)
    engine_stopped_s: float = 0.0
    start: StartEvent | None = field(default=None, repr=False)
    end: EndEvent | None = field(default=None, repr=False)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


# --- the watchdog -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WatchdogPolicy:
    """When a run counts as hung (the one watchdog type: `tuner stress`, bisect trials and the TUI use it).

    Before the first step: nothing for `first_step_timeout_s` since launch is a hang (compiles, big batches).
    After it: no event at all, or no progress while heartbeats go on (the main thread stuck in a GPU call), for
    max(`min_silence_s`, `silence_factor` x median step time) is a hang. The median leaves out the engine's
    warm-up steps once there are steady ones. A hang ends with SIGTERM, then SIGKILL after `kill_grace_s`.

    Whose clock (issue 28): "no progress while heartbeats go on" is measured on the engine's own clock (every
    event's `t`), so a backlog read after the tuner itself was stopped shows the engine working, not silent. Time
    nobody could watch never counts as silence: a gap between two of the watchdog's own polls (this process was
    stopped: SIGSTOP, a suspended laptop) and time the engine spent stopped from outside (state T in
    /proc/PID/stat) are left out of both measures. A stopped engine is not a hang; its run reports
    `engine_stopped_s` and the trial decides (docs/bisect.md, "Stopped processes").
    """

    min_silence_s: float = 60.0
    silence_factor: float = 20.0
    first_step_timeout_s: float = 600.0
    kill_grace_s: float = 30.0
    poll_s: float = 0.2

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"WatchdogPolicy.{f.name} must be a positive number, got {value!r}")
            object.__setattr__(self, f.name, float(value))

    @classmethod
    def for_config(cls, config: EngineConfig) -> WatchdogPolicy:
        """The defaults for a GPU; tighter on the CPU (simulated cards, tests), where steps are regular and a
        hang can only be an injected one."""
        if config.options.device == "cpu":
            return cls(min_silence_s=10.0, first_step_timeout_s=120.0, kill_grace_s=5.0)
        return cls()

    def limit_s(self, median_step_s: float | None) -> float:
        return max(self.min_silence_s, self.silence_factor * (median_step_s or 0.0))


# events that are the engine's progress; heartbeats count by their progress field; warnings, unknown events and
# stray lines show only that it is alive
_WORK_EVENTS = (StartEvent, StepEvent, GemmEvent, CanaryEvent, PhaseEvent, SegmentEvent, FaultEvent, EndEvent)
_IDLE_STATES = {"idle", "partial-idle", "eval", "done"}  # heartbeats in these states are not a stall
# A data-parallel rank waiting for its peers ("collective") is not stalled either, for as long as its own collective
# timeout allows (plus this margin): past that the engine should have ended the wait itself, so silence is a hang.
COLLECTIVE_MARGIN_S = 10.0
# A watchdog poll later than this past its due time means this process did not run meanwhile (it was stopped):
# the time beyond it is nobody's silence. Generous, so a busy machine's late poll still counts in full.
OWN_STOP_SLACK_S = 2.0


# --- the run ----------------------------------------------------------------------------------------------


class StressRun:
    """One engine subprocess. `start()`, then iterate `events()` (one consumer, a worker thread) or not, then
    `result()`. `stop()` may be called from any thread, any number of times.

    The engine ends when this process dies (it watches its parent): call `start()` from the thread that waits
    for the result, since on Linux the kernel's parent-death signal follows the thread that started it."""

    STDERR_TAIL_LINES = 60
    _spawn: engine_spawn.Spawn | None = None  # the account and staged files it runs with (tuning/engine_spawn.py)

    def __init__(self, config: EngineConfig, *, watchdog: WatchdogPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config, self._clock = config, clock
        self.watchdog = watchdog or WatchdogPolicy.for_config(config)
        self.proc: subprocess.Popen | None = None
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stderr: deque[str] = deque(maxlen=self.STDERR_TAIL_LINES)
        self._device_error: str | None = None
        self._stop_requested = False
        self._kill_started = False
        self._hang: str | None = None
        self._start_event: StartEvent | None = None
        self._end_event: EndEvent | None = None
        self._ended_twice = False
        self._protocol_problem: str | None = None  # the first line that broke the schema (InvalidEvent)
        self._last_step = 0
        self._steps_seen = 0
        self._step_times: list[float] = []
        self._tok_s: list[float] = []
        self._last_progress_count: int | None = None
        self._t_launch = 0.0
        self._collective_since: float | None = None
        opts = config.options
        self._collective_limit_s = opts.collective_timeout_s + COLLECTIVE_MARGIN_S if opts.world_size > 1 else 0.0
        self._t_last_event = 0.0
        # the engine's own clock (its events' `t`): at its latest heartbeat, and at its last progress
        self._engine_t = self._engine_t_progress = 0.0
        self._engine_stopped_s = 0.0  # seen stopped from outside (state T), all of the run
        # time nobody could watch (the engine stopped, or this process: a full stdout pipe blocks the engine too)
        self._paused_s = self._paused_at_progress_s = 0.0  # in all, and before the engine's last progress
        self._t_last_poll = 0.0  # set at the launch
        self._result: StressResult | None = None

    # -- lifecycle

    def start(self) -> Self:
        with self._lock:
            if self.proc is not None:
                raise RuntimeError("StressRun already started")
            spawn = self._spawn = engine_spawn.prepare(self.config)
            try:
                self.proc = subprocess.Popen(
                    spawn.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env=spawn.env, start_new_session=True, bufsize=1, text=True, encoding="utf-8",
                    errors="replace", **spawn.popen_kwargs,  # type: ignore[call-overload]  # Popen's own keywords (user, group...)
                )
            except BaseException as e:
                spawn.finish()
                if isinstance(e, PermissionError):  # the engine's account may not run the interpreter
                    raise spawn.failed(e) from None
                raise
            now = self._clock()
            # the launch is the first poll's starting point: a stop of this process before it (a suspend just
            # after the launch) is measured like any other, not read as the engine's silence
            self._t_launch = self._t_last_event = self._t_last_poll = now
        for target, name in ((self._read_stdout, "stdout"), (self._read_stderr, "stderr"),
                             (self._watch, "watchdog")):
            t = threading.Thread(target=target, name=f"stress-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def events(self) -> Iterator[Event]:
        """Events as they arrive, until the engine's stdout closes. One consumer only."""
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.put(None)  # later calls end at once
                return
            yield item

    def stop(self) -> None:
        """Ask the engine to stop: SIGTERM to its process group, SIGKILL after the grace period."""
        with self._lock:
            self._stop_requested = True
        self._terminate()

    def result(self, timeout: float | None = None) -> StressResult:
        """Wait for the engine to end (and its pipes to drain), then sum up. Raises TimeoutError."""
        if self.proc is None:
            raise RuntimeError("StressRun not started")
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError("the engine is still running") from None
        if self._spawn is not None:
            self._spawn.finish()  # files the engine wrote as its own account go into place
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=None if timeout is None else max(0.1, timeout))
        with self._lock:
            if self._result is None:
                self._result = self._summarise()
            return self._result

    # -- signals

    def _signal_group(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _terminate(self) -> None:
        with self._lock:
            if self._kill_started or self.proc is None:
                return
            self._kill_started = True
        self._signal_group(signal.SIGTERM)
        proc = self.proc

        def escalate() -> None:
            try:
                proc.wait(timeout=self.watchdog.kill_grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)

        t = threading.Thread(target=escalate, name="stress-kill", daemon=True)
        t.start()

    # -- reader threads

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                if not line.strip():
                    continue
                ev = decode_line(line)
                self._note(ev)
                self._queue.put(ev)
        finally:
            self.proc.wait()
            self._done.set()
            self._queue.put(None)

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            with self._lock:
                self._stderr.append(line)
                if self._device_error is None:  # a device error the engine could not report itself
                    self._device_error = match_device_error(line)

    def _progressed(self, ev: Event) -> None:
        """The engine made progress, on its own clock (`ev.t`). Lock held."""
        self._engine_t_progress = max(self._engine_t_progress, ev.t)
        self._paused_at_progress_s = self._paused_s

    def _note(self, ev: Event) -> None:
        now = self._clock()
        with self._lock:
            self._t_last_event = now
            if isinstance(ev, _WORK_EVENTS):
                self._progressed(ev)
            match ev:
                case HeartbeatEvent(state=state, progress=progress):
                    self._engine_t = max(self._engine_t, ev.t)  # its clock while it says it is alive
                    waiting = state == "collective"
                    if not waiting:
                        self._collective_since = None
                    elif self._collective_since is None:
                        self._collective_since = now
                    if (state in _IDLE_STATES or progress != self._last_progress_count
                            or (waiting and now - (self._collective_since or now) <= self._collective_limit_s)):
                        self._progressed(ev)
                    self._last_progress_count = progress
                case StepEvent() | GemmEvent():
                    self._steps_seen += 1
                    self._last_step = max(self._last_step, ev.step)
                    if math.isfinite(ev.dt_ms):
                        self._step_times.append(ev.dt_ms / 1e3)
                    if isinstance(ev, StepEvent) and ev.tok_s is not None and math.isfinite(ev.tok_s):
                        self._tok_s.append(ev.tok_s)
                case StartEvent():
                    self._start_event = ev
                case EndEvent() if self._end_event is None and not self._ended_twice:
                    self._end_event = ev
                case EndEvent():  # the engine writes one end: a second could turn its fail into a pass, so neither
                    self._end_event, self._ended_twice = None, True  # counts
                    self._broke_protocol("a second `end` event (the engine writes one)")
                case InvalidEvent(problem=problem):  # life, not progress; a bug the result must not hide
                    self._broke_protocol(problem)

    def _broke_protocol(self, problem: str) -> None:
        self._protocol_problem = self._protocol_problem or problem
        self._stderr.append(f"tuner: the engine broke its protocol (docs/engine.md): {problem}")

    # -- watchdog

    def _median_step_s(self) -> float | None:
        warm = self._start_event.warmup_steps if self._start_event else 0
        times = self._step_times[warm:] if len(self._step_times) > warm else self._step_times
        return statistics.median(times) if times else None

    def _engine_is_stopped(self) -> bool:
        """The engine is stopped by a signal (state T or t in /proc/PID/stat): SIGSTOP from outside, a debugger."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            return psutil.Process(self.proc.pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
        except (psutil.Error, OSError):
            return False

    def _unwatched_s(self, now: float, engine_stopped: bool) -> float:
        """Time since the last poll that must not count as silence: all of it when the engine is stopped; past
        a late poll's due time when this process was not running (stopped itself). Lock held."""
        last, self._t_last_poll = self._t_last_poll, now
        elapsed = now - last
        if engine_stopped:
            self._engine_stopped_s += elapsed
            unwatched = elapsed
        else:
            unwatched = max(0.0, elapsed - OWN_STOP_SLACK_S)
        self._paused_s += unwatched
        return unwatched

    def _watch(self) -> None:
        while not self._done.wait(self.watchdog.poll_s):
            stopped = self._engine_is_stopped()
            now = self._clock()
            with self._lock:
                unwatched = self._unwatched_s(now, stopped)
                # nobody could watch that time (or the engine was not running): it is not silence
                self._t_launch = min(now, self._t_launch + unwatched)
                self._t_last_event = min(now, self._t_last_event + unwatched)
                # an `end` does not stop the watch: the events end only when the process exits, so an engine
                # stuck after its end (a wedged GPU's teardown) is silence like any other
                if self._kill_started or stopped:
                    continue
                if self._steps_seen == 0:
                    waited = now - self._t_launch
                    limit = self.watchdog.first_step_timeout_s
                    detail = f"no first step within {limit:g} s of launch"
                    hung = waited > limit
                else:
                    limit = self.watchdog.limit_s(self._median_step_s())
                    silent = now - self._t_last_event
                    # on the engine's own clock, less the time nobody could watch since its last progress
                    stalled = (self._engine_t - self._engine_t_progress
                               - (self._paused_s - self._paused_at_progress_s))
                    hung = silent > limit or stalled > limit
                    detail = (f"no output for {silent:.1f} s (limit {limit:g} s)" if silent > limit else
                              f"no progress for {stalled:.1f} s while heartbeats continued (limit {limit:g} s)")
                if hung:
                    self._hang = f"hang after step {self._last_step}: {detail}"
            if self._hang is not None:
                self._terminate()

    # -- summary

    def _summarise(self) -> StressResult:
        proc = self.proc
        assert proc is not None
        code = proc.returncode
        end, start = self._end_event, self._start_event
        common: dict[str, Any] = {
            "steps": end.steps if end is not None else self._last_step, "exit_code": code, "start": start,
            "end": end, "stderr_tail": "\n".join(self._stderr),
            "sensitivity": end.sensitivity if end is not None else (start.sensitivity if start else None),
            "duration_s": end.duration_s if end is not None else None,
            # from the step events when the run ended without an `end` event
            "median_tok_s": end.median_tok_s if end is not None else
            (statistics.median(self._tok_s) if self._tok_s else None),
            "bpb": end.bpb if end is not None else None, "engine_stopped_s": round(self._engine_stopped_s, 1),
        }
        if self._hang is not None:
            return StressResult("fail", "hang", self._hang, self._last_step + 1, **common)
        if end is None and self._protocol_problem is not None:  # it said something, not in words we can trust
            return StressResult("error", "internal", f"the engine's output broke its protocol: "
                                                     f"{self._protocol_problem}", None, **common)
        if end is not None and end.verdict == "pass" and not self._stop_requested:
            # a pass the process did not live up to: it died after its `end` (a device fault HIP reports at the
            # teardown's synchronize, a crash freeing a faulted context); that death is the run's result
            if self._device_error is not None:
                return StressResult("fail", "device-error", f"{self._device_error} (from the engine's stderr, "
                                    "after its end)", self._last_step + 1, **common)
            if code is not None and code < 0:
                return StressResult("fail", "crash", f"the engine died of {_signal_name(-code)} after its passing "
                                    f"end (step {self._last_step})", self._last_step + 1, **common)
        if end is not None:
            kind, reason = end.kind, end.reason or end.verdict
            if end.verdict == "error" and kind == "interrupted" and self._stop_requested:
                kind = "stopped"
            step = end.step if end.verdict == "fail" else None
            ref_step = end.reference_step if end.verdict == "fail" else None
            return StressResult(end.verdict, kind, reason, step, reference_step=ref_step, **common)
        if self._stop_requested:
            return StressResult("error", "stopped", "stopped before the engine finished", None, **common)
        if self._device_error is not None:
            return StressResult("fail", "device-error", f"{self._device_error} (from the engine's stderr)",
                                self._last_step + 1, **common)
        if code is not None and code < 0:
            return StressResult("fail", "crash", f"the engine died of {_signal_name(-code)} after step "
                                f"{self._last_step}",
                                self._last_step + 1, **common)
        if start is None:
            return StressResult("error", "setup", f"the engine exited with code {code} before starting", None,
                                **common)
        return StressResult("fail", "crash", f"the engine exited with code {code} without an end event after "
                                             f"step {self._last_step}", self._last_step + 1, **common)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
