"""One stress run at a card's current setting, with the rules every front end shares: `tuner stress` and the Tune
screen both ask this module. Nothing here changes the card.

The policy, decided here and nowhere else:
- **the request**: the engine's options from the front end's choices (`engine_client.engine_request`); on a
  simulated card a canary every SIM_CANARY_EVERY steps unless asked otherwise (its faults are bit flips that
  only a comparison can see, and a short run must meet them);
- **the watchdog**: `WatchdogPolicy.for_config`, the bisect trials' own;
- **the stock reference**, the check that catches silent miscomputation on the step it happens: an explicit file
  (`--reference`), else the one cached for this card and workload (`tuner.tuning.reference_cache`), compared in a
  loop so every step of a run of any length is compared. None cached and the card at stock: it is recorded first
  (REFERENCE_RECORD_S at stock, said, kept for later runs). None and the card *not* at stock: the run does not
  start (`NoStockReference`) unless the user chose to go on without it (`without_reference`: the Tune screen
  asks, the CLI takes `--no-reference`). Recording it then would mean moving the user's kept setting to stock and
  back behind their back (a write, its read-back, a keep-or-revert and a window where a crash leaves the card
  at a setting they did not choose): asking is simpler and honest. A GEMM burn has no trajectory to compare (n/a).
- **the kernel log**: watched for this card (a simulated card's host log says nothing: n/a); a failure line stops
  the run at once and fails it; a log that cannot be read is said, and the engine's detectors still run (as in
  a bisect trial);
- **the load marker** (`Backend.note_load`) brackets every engine run.

No silent downgrade: every detector that cannot run at full strength is reported as it is decided, and again in
the outcome's summary (`StressOutcome.checks_off`). Reports go to `on_event` as they happen: `DetectorState`,
`RunStarted` (the recording, then the stress run itself), str (a line for people) and the engine's own events
(`tuner.engine.events`), from the thread that called `run()` (the kernel-log fault from the watcher's thread).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.backends.base import Backend
from tuner.core.durations import format_duration
from tuner.core.errors import UsageError
from tuner.core.models import DeviceInfo, Mode, StressTarget, Verdict
from tuner.tuning import kernel_log
from tuner.tuning.engine_client import EngineConfig, StressResult, StressRun, WatchdogPolicy, engine_request
from tuner.tuning.kernel_log import KernelEvent
from tuner.tuning.reference_cache import CachedReference, manual_reference
from tuner.tuning.trial import EngineFactory, default_engine_factory, default_watcher

REFERENCE_RECORD_S = 60.0  # a stock reference recorded first: one minute, looped when compared
SIM_CANARY_EVERY = 10  # simulated cards: canaries often, so short runs meet the injected faults
RESULT_WAIT_S = 5.0  # after a stop, beyond the watchdog's kill grace, for the engine to be gone

Emit = Callable[[object], None]


@dataclass(frozen=True)
class StressRequest:
    """What a front end asks for. None: the engine's (or the card's) default."""

    device_id: str
    duration_s: float | None = None
    steps: int | None = None
    preset: str | None = None
    mode: str = Mode.TRAIN
    seed: int | None = None
    dtype: str | None = None  # None or "auto": the engine's choice
    compile: bool | None = None
    canary_every: int | None = None
    reference: Path | None = None  # compare with this file instead of the cached stock reference
    record: Path | None = None  # record this run as a reference (it then compares with none)
    without_reference: bool = False  # the user chose to run without a stock reference (asked, or --no-reference)
    batch_size: int | None = None  # pin the batch (tuner screen's tolerance mode runs the reference's batches)
    fault_seed: int | None = None  # a simulated card's fault draws (tuner screen: one per card and run)


@dataclass(frozen=True)
class DetectorState:
    """A detector's state as the action decided it (reference, kernel log), before and while the engine runs."""

    name: str
    value: str


@dataclass(frozen=True)
class RunStarted:
    """An engine run begins: `purpose` "reference" (recording this card's stock reference first) or "stress"."""

    purpose: str
    config: EngineConfig


@dataclass(frozen=True)
class ReferencePlan:
    """How this stress run compares with stock.

    `state`: "cached" (this card's, recorded earlier), "given" (`--reference`), "record-first" (none yet: recorded
    at stock before the run), "recording" (this run records one, `--record`, so compares with none), "n/a" (a
    GEMM burn has no trajectory), "off" (the user chose to run without one)."""

    state: str
    path: Path | None
    why: str  # one line: what will be compared, or why nothing is

    @property
    def compared(self) -> bool:
        return self.state in ("cached", "given", "record-first")

    def to_dict(self) -> dict[str, object]:
        return {"compared": self.compared, "state": self.state, "path": None if self.path is None else str(self.path),
                "why": self.why}


class NoStockReference(UsageError):
    """The run would not compare its steps with stock, and nobody said to go on without it. Nothing was started."""

    def __init__(self, device_id: str, workload: str, setting: int, unit: str, why: str):
        self.device_id, self.workload, self.setting, self.unit, self.why = device_id, workload, setting, unit, why
        super().__init__(
            f"{device_id} has no stock reference for {workload} ({why}) and is not at stock ({setting:+d} {unit}), "
            "so this stress run could not compare its steps with stock, the check that catches silent "
            "miscomputation",
            f"to record one: `tuner reset --device {device_id}`, then `tuner stress --device {device_id}` (at stock "
            "it records the reference first), then set your value again; or pass --no-reference to run only the "
            "weaker checks (canary, GEMM, non-finite, device errors, watchdog, kernel log)")


@dataclass(frozen=True)
class StressOutcome:
    """How a stress run ended. `result` is the engine's (None: stopped before the engine started); `purpose` says
    which run it is of ("reference" when recording the stock reference did not pass, so no stress ran)."""

    result: StressResult | None
    reference: ReferencePlan
    kernel_log: str  # "ok", "n/a (simulated)" or "OFF: why"
    kernel_events: tuple[KernelEvent, ...] = ()
    stopped: bool = False  # the user asked
    purpose: str = "stress"

    @property
    def verdict(self) -> str:
        """pass, fail, error or stopped. A stock recording that passed but kept no reference is an error: no
        stress ran."""
        r = self.result
        if self.kernel_events:
            return Verdict.FAIL
        if r is None or (self.stopped and r.verdict != Verdict.FAIL):
            return Verdict.STOPPED
        if self.purpose == "reference" and r.verdict == Verdict.PASS:
            return Verdict.ERROR
        return r.verdict

    @property
    def kind(self) -> str | None:
        if self.kernel_events:
            return self.kernel_events[0].kind
        if self.result is None:
            return None
        if self.purpose == "reference" and self.result.verdict == Verdict.PASS:
            return "reference"
        return self.result.kind

    @property
    def reason(self) -> str:
        if self.kernel_events:
            return kernel_log.summarize(self.kernel_events)
        if self.result is None:
            return "stopped before it started"
        if self.purpose == "reference":
            return f"at stock, recording the stock reference: {self.result.reason or self.result.verdict}" + (
                " (the run passed but wrote no reference)" if self.result.verdict == Verdict.PASS else "")
        return self.result.reason

    @property
    def compared(self) -> bool:
        """The stock-reference comparison ran, not only was planned: the engine's end says so (null: none ran, e.g.
        a reference it could not read ends the run at its setup); with no end (a hang, a crash), its start does."""
        r = self.result
        if not self.reference.compared or r is None:
            return False
        said = r.end if r.end is not None else r.start
        return said is not None and said.reference is not None

    @property
    def reference_why(self) -> str:
        """What was compared, or why nothing was."""
        if self.compared or not self.reference.compared:
            return self.reference.why
        return f"the run ended before it compared a step ({self.reason})"

    def reference_doc(self) -> dict[str, object]:
        """The reference plan (`ReferencePlan.to_dict`) as it turned out."""
        return {**self.reference.to_dict(), "compared": self.compared, "why": self.reference_why}

    def checks_off(self) -> list[str]:
        """Every check that did not run at full strength, with why (empty: all of them ran)."""
        off = [] if self.compared else [f"the stock-reference comparison did not run: {self.reference_why}"]
        if self.kernel_log.startswith("OFF"):
            off.append(f"the kernel log was not watched: {self.kernel_log.removeprefix('OFF: ')}")
        if self.result is not None and self.result.engine_stopped_s:
            # nothing loaded the card meanwhile and the watchdog did not count it (a bisect trial calls such a
            # pass inconclusive, tuner.tuning.trial)
            off.append(f"the card was not under load for the whole run: the stress engine was stopped from outside "
                       f"for {self.result.engine_stopped_s:.0f} s (SIGSTOP or a debugger)")
        return off

    def summary(self) -> str:
        """One line for people: the verdict, why, and whether the reference comparison ran."""
        r = self.result
        if self.kernel_events:
            head = f"FAIL (kernel log: {self.kernel_events[0].line})"
        elif self.purpose == "reference":
            if r is None or self.stopped:
                return "stopped by you while the stock reference was recorded (none kept)"
            return f"{self.verdict.upper()} ({self.reason}); no stress run followed and no reference was kept"
        elif r is None:
            return "stopped before it started"
        elif self.stopped:
            head = (f"FAIL ({r.reason}) before you stopped it" if r.verdict == Verdict.FAIL
                    else f"stopped by you after {r.steps} steps (no fault seen)")
        else:
            head = r.verdict.upper() + (f" ({r.reason})" if r.reason else "")
        said = ["compared with the stock reference" if self.compared
                else "the stock-reference comparison did not run"]
        if self.kernel_log.startswith("OFF"):
            said.append("the kernel log was not watched")
        if r is not None and r.engine_stopped_s:
            said.append(f"the engine was stopped from outside for {r.engine_stopped_s:.0f} s")
        return f"{head}; {', '.join(said)}"


def engine_config(request: StressRequest, target: StressTarget, *, duration_s: float | None, steps: int | None,
                  reference: Path | None = None, record: Path | None = None) -> EngineConfig:
    """The engine request for a run of `request` on `target` (the stress run, or its stock recording)."""
    canary_every = request.canary_every or (SIM_CANARY_EVERY if target.simulated else None)
    return engine_request(
        target, preset=request.preset, duration_s=duration_s, steps=steps, mode=request.mode, seed=request.seed,
        dtype=None if request.dtype in (None, "auto") else request.dtype, compile=request.compile,
        canary_every=canary_every, reference=None if reference is None else str(reference),
        reference_loop=True if reference else None, record=None if record is None else str(record),
        batch_size=request.batch_size, fault_seed=request.fault_seed)


def cached_reference(device: DeviceInfo, target: StressTarget, request: StressRequest) -> CachedReference:
    """Where this card's stock reference for `request`'s workload is cached: keyed by what will really run (every
    trajectory option of the request, rendered as the engine gets it; tuner.tuning.reference_cache)."""
    return manual_reference(device, engine_config(request, target, duration_s=REFERENCE_RECORD_S, steps=None).options)


class StressSession:
    """One stress run: `run()` blocks (the CLI's main thread, or the App's worker) and returns a StressOutcome;
    `stop()` is thread-safe, may come first, and stops whichever engine runs. Raises NoStockReference before
    starting anything when the run could not compare with stock and the request did not accept that."""

    def __init__(self, backend: Backend, request: StressRequest, *, on_event: Emit | None = None,
                 engine_factory: EngineFactory | None = None,
                 kernel_watcher_factory: Callable[[], kernel_log.KernelLogWatcher] | None = None,
                 reference_record_s: float | None = None):
        self.backend, self.request = backend, request
        self._emit = on_event or (lambda event: None)
        self._engine_factory = engine_factory or default_engine_factory
        self._watcher_factory = kernel_watcher_factory
        self.reference_record_s = REFERENCE_RECORD_S if reference_record_s is None else reference_record_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._run: StressRun | None = None
        self._kernel_events: list[kernel_log.KernelEvent] = []
        self._kernel_log = "ok"

    # --- the decisions ------------------------------------------------------------------------------------------

    def reference_plan(self, device: DeviceInfo, target: StressTarget) -> ReferencePlan:
        """How this run will compare with stock; raises NoStockReference when it could not and nobody said to go
        on without it. Reads the card's setting and the reference cache; changes nothing."""
        req = self.request
        if req.record is not None:
            return ReferencePlan("recording", None, f"this run records a reference ({req.record}), so it compares "
                                                    "with none")
        if req.mode == Mode.GEMM and req.reference is not None:  # as the engine refuses --record with gemm
            raise UsageError(f"--reference {req.reference}: a GEMM burn has no training trajectory to compare; "
                             "nothing was run", "use --mode train or mixed to compare with it, or leave it out")
        if req.mode == Mode.GEMM:
            return ReferencePlan("n/a", None, "n/a: a GEMM burn has no training trajectory to compare")
        if req.reference is not None:
            return ReferencePlan("given", req.reference, f"compared with {req.reference}")
        if req.without_reference:
            return ReferencePlan("off", None, "you chose to run without a stock reference")
        cached = cached_reference(device, target, req)
        if cached.path is not None and cached.path.exists():
            return ReferencePlan("cached", cached.path, "compared with this card's stock reference")
        knob = self.backend.knob(req.device_id)
        if cached.path is not None and knob.current == knob.stock:
            return ReferencePlan("record-first", cached.path, "none yet for this card and workload: recording it "
                                 f"first, at stock ({format_duration(self.reference_record_s)}, kept for later runs)")
        why = cached.why_none or "none recorded yet"
        preset = engine_config(req, target, duration_s=self.reference_record_s, steps=None).options.preset
        workload = f"{preset}/{req.mode}"
        raise NoStockReference(req.device_id, workload, knob.current, knob.unit, why)

    # --- the run ------------------------------------------------------------------------------------------------

    def run(self) -> StressOutcome:
        req = self.request
        device = self.backend.device(req.device_id)
        target = self.backend.stress_target(req.device_id)
        plan = self.reference_plan(device, target)
        self._say_reference(plan)
        if plan.state == "record-first" and plan.path is not None:
            recording = self._record_first(target, plan.path)
            if recording is not None:
                return recording
            plan = replace(plan, why="compared with this card's stock reference, recorded first at stock")
        if self._stop.is_set():
            return self._outcome(None, plan)
        compare = plan.path if plan.compared else None
        result = self._engine(target, "stress", duration_s=req.duration_s, steps=req.steps, reference=compare,
                              record=req.record)
        return self._outcome(result, plan)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            run = self._run
        if run is not None:
            run.stop()

    def _outcome(self, result: StressResult | None, plan: ReferencePlan, purpose: str = "stress") -> StressOutcome:
        return StressOutcome(result, plan, self._kernel_log, tuple(self._kernel_events), self._stop.is_set(), purpose)

    def _say_reference(self, plan: ReferencePlan) -> None:
        value = {"cached": "ok", "given": "ok", "record-first": "recording", "recording": "recording",
                 "n/a": "n/a (GEMM)", "off": "OFF"}[plan.state]
        self._emit(DetectorState("reference", value))
        if plan.state == "off":
            self._emit(f"reference comparison OFF: {plan.why}; the run checks only the canary, GEMM, non-finite "
                       "values, device errors, the watchdog and the kernel log")
        elif plan.state != "cached":
            self._emit(f"reference: {plan.why}")

    def _record_first(self, target: StressTarget, path: Path) -> StressOutcome | None:
        """Record the stock reference at `path`; an outcome when that ended the session (failed or stopped)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        result = self._engine(target, "reference", duration_s=self.reference_record_s, steps=None, record=path)
        kept = (result is not None and result.verdict == Verdict.PASS and path.exists() and not self._kernel_events
                and not self._stop.is_set())
        if not kept:
            path.unlink(missing_ok=True)
            self._emit(DetectorState("reference", "NONE"))
            plan = ReferencePlan("off", None, "the stock reference was not recorded")
            return self._outcome(result, plan, purpose="reference")
        self._emit(DetectorState("reference", "ok"))
        self._emit("stock reference recorded; now the stress run, compared with it")
        return None

    def _watcher(self, target: StressTarget) -> kernel_log.KernelLogWatcher:
        if self._watcher_factory is not None:
            watcher = self._watcher_factory()
        else:  # a trial's: the root helper's stream where the user cannot read /dev/kmsg; n/a on a simulated card
            watcher = default_watcher(self.backend, [self.request.device_id], self._emit, simulated=target.simulated)
        watcher.pci_bus_id = None if target.simulated else target.pci_bus_id
        return watcher

    def _start_watching(self, watcher: kernel_log.KernelLogWatcher, target: StressTarget) -> None:
        watcher.start()
        if isinstance(watcher, kernel_log.NullWatcher) and target.simulated:
            self._kernel_log = "n/a (simulated)"
        elif not watcher.available:  # said by the watcher's warning; kept for the summary
            self._kernel_log = "OFF: it cannot be read (run as root, or join the systemd-journal group)"
        else:
            self._kernel_log = "ok"
        self._emit(DetectorState("kernel log", self._kernel_log.split(":")[0]))

    def _stop_watching(self, watcher: kernel_log.KernelLogWatcher) -> None:
        """The watcher's events kept; a kernel log that stopped being readable during the run is that check off
        (said by the watcher's warning; kept for the summary), never "ok"."""
        self._kernel_events.extend(watcher.stop())
        if watcher.lost is not None:
            self._kernel_log = f"OFF: it stopped being readable during the run ({watcher.lost})"
            self._emit(DetectorState("kernel log", "OFF"))

    def _engine(self, target: StressTarget, purpose: str, *, duration_s: float | None, steps: int | None,
                reference: Path | None = None, record: Path | None = None) -> StressResult | None:
        """One engine run on `target`, the card marked as loaded and its kernel log watched; None when stopped
        before it started."""
        config = engine_config(self.request, target, duration_s=duration_s, steps=steps, reference=reference,
                               record=record)
        policy = WatchdogPolicy.for_config(config)
        run = self._engine_factory(config, policy)
        with self._lock:
            self._run = run
        if self._stop.is_set():
            return None
        watcher = self._watcher(target)

        def on_kernel_event(event: kernel_log.KernelEvent) -> None:
            self._emit(DetectorState("kernel log", "FAULT"))
            self._emit(f"FAULT kernel log: {event.line}")
            run.stop()

        watcher.on_event = on_kernel_event
        device_id = self.request.device_id
        with contextlib.ExitStack() as cleanup:
            # each undo registered as soon as what it undoes happened; they run in reverse: the engine is stopped,
            # the load ends, then the watcher stops (a message the stop provokes still counts)
            cleanup.callback(self._stop_watching, watcher)
            self._start_watching(watcher, target)
            self._emit(RunStarted(purpose, config))
            self.backend.note_load(device_id, True)
            cleanup.callback(self.backend.note_load, device_id, False)
            cleanup.callback(_ended, run, policy)
            run.start()
            if self._stop.is_set():
                run.stop()
            for event in run.events():
                self._emit(event)
            return run.result()


def _ended(run: StressRun, policy: WatchdogPolicy) -> None:
    """The engine is gone: stopped if it still runs (an error, Ctrl-C, SIGTERM here), waited for a bounded time.
    (After a normal end the stop is a no-op and the result was already summed up.)"""
    run.stop()
    # still running after SIGKILL; or it never started (the error says why)
    with contextlib.suppress(TimeoutError, RuntimeError):
        run.result(timeout=policy.kill_grace_s + RESULT_WAIT_S)
