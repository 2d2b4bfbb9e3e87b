"""One trial: one setting on one device under the stress engine, measured and classified.

Order (docs/bisect.md): start the kernel-log watcher (only later messages count); apply the setting (the backend
reads it back); tell the backend the card is loaded; start the engine on `backend.stress_target` (its reported PCI
bus id must be the target's); watch engine events, the heartbeat watchdog (inside `StressRun`), the kernel log
and 1 Hz telemetry; tell the backend the load ended; reset to stock and verify; classify.

Setup problems (out of memory, a missing library, a NaN that is the software's) are `error`, never blamed on
the voltage. Core module: no textual, no torch (the engine runs in a subprocess).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.backends.base import Backend
from tuner.core.errors import NotApplied, TunerError
from tuner.core.models import StressTarget, Verdict
from tuner.tuning import engine_client as sc
from tuner.tuning import kernel_log
from tuner.tuning import sampler as sampler_mod
from tuner.tuning.engine_client import EngineConfig, StressResult, WatchdogPolicy
from tuner.tuning.events import TrialEvent, TrialProgress, TrialResult, TrialWarning
from tuner.tuning.sampler import TelemetrySampler, TelemetrySummary

RESULT_WAIT_S = 60.0  # after the engine's output ended: how long to wait for its exit before stopping it
STOPPED = Verdict.STOPPED


@dataclass(frozen=True)
class TrialParams:
    phase: str
    duration_s: float
    preset: str | None = None  # None: the request's default for the target (tiny on the CPU, nanochat on a GPU)
    mode: str = "train"
    seed: int = 0
    dtype: str | None = None
    record_path: Path | None = None  # the baseline records the reference trajectory here
    reference_path: Path | None = None  # every other trial compares against it, looping it (--reference-loop)
    canary_every: int | None = None
    watchdog: WatchdogPolicy | None = None  # None: `WatchdogPolicy.for_config` (tighter on the CPU)
    telemetry_interval_s: float = 1.0
    baseline_tok_per_j: float | None = None  # for efficiency_vs_stock
    baseline_voltage_mv: float | None = None  # the stock baseline's core voltage under load (measured drop)
    progress_interval_s: float = 1.0
    steps: int | None = None  # bound by steps instead of duration_s (which then only feeds the ETA)
    verify_repeatable: bool = False  # the baseline's replay: record in the reference whether it repeats
    tolerance: bool = False  # the user opted in to the weaker comparison (reduced sensitivity)
    compile: bool | None = None  # torch.compile in the engine (None: its default, on for GPUs)


class StopRequested(Exception):
    pass


def default_engine_factory(config: EngineConfig, watchdog: WatchdogPolicy) -> sc.StressRun:
    return sc.StressRun(config, watchdog=watchdog)


def trial_request(target: StressTarget, params: TrialParams, setting: int | None = None,
                  **extra: object) -> EngineConfig:
    """The engine run for one trial on `target` at `setting` (None: a run at whatever the card is set to, with
    the engine's default fault seed). `extra`: further engine options (the rig trial's data-parallel rank)."""
    return sc.engine_request(
        target, duration_s=None if params.steps is not None else params.duration_s, steps=params.steps,
        preset=params.preset, setting=setting, mode=params.mode,
        seed=params.seed, dtype=params.dtype, canary_every=params.canary_every,
        record=str(params.record_path) if params.record_path else None,
        reference=str(params.reference_path) if params.reference_path else None,
        # a reference one trial long covers a run of any length: past its end the engine restarts from the
        # initial weights and keeps comparing
        reference_loop=params.reference_path is not None and not params.verify_repeatable,
        tolerance=params.tolerance, verify_repeatable=params.verify_repeatable, compile=params.compile, **extra)


def same_bus(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return True
    def norm(s: str) -> str:
        parts = s.lower().split(":")
        return ":".join(parts[-2:]) if len(parts) >= 2 else s.lower()
    return norm(a) == norm(b)


class TrialState:
    """What one trial started and saw; the cleanup fills in what it collects on the way out."""

    def __init__(self) -> None:
        self.run: sc.StressRun | None = None
        self.target: StressTarget | None = None
        self.sampler: TelemetrySampler | None = None
        self.summary: TelemetrySummary | None = None
        self.kernel_events: list[kernel_log.KernelEvent] = []
        self.engine_result: StressResult | None = None
        self.stop_reason: str | None = None
        self.pci_problem: str | None = None

    def stop_engine(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.run is not None:
            self.run.stop()


def run_trial(
    backend: Backend,
    device_id: str,
    setting: int,
    params: TrialParams,
    on_event: Callable[[TrialEvent], None] | None = None,
    stop_event: threading.Event | None = None,
    *,
    engine_factory: Callable[[EngineConfig, WatchdogPolicy], sc.StressRun] | None = None,
    kernel_watcher: kernel_log.KernelLogWatcher | None = None,
    clock: Callable[[], float] = time.time,
) -> TrialResult:
    """Run one trial and return its result. The card is back at stock (verified) when this returns or raises.

    Every undo is registered on an ExitStack as soon as the thing it undoes may have happened, so no exception,
    at any point, can skip one. On the way out, in this order: the stop-watcher thread ends, the engine is stopped, the
    sampler stops, the load ends (`note_load(False)`), the card is reset to stock and verified, the kernel-log
    watcher stops (so a message the reset itself provokes still counts against this trial).

    Raises NotApplied / DeviceLost / PermissionDenied when the setting cannot be applied or the card cannot be
    reset (the caller stops the search). A `stop_event` set from another thread ends the trial with verdict
    "stopped".
    """
    emit = on_event or (lambda ev: None)
    stop_event = stop_event or threading.Event()
    engine_factory = engine_factory or default_engine_factory
    knob = backend.knob(device_id)
    started_at = clock()
    warnings: list[str] = []
    trial = TrialState()

    def warn(message: str) -> None:
        warnings.append(message)
        emit(TrialWarning(message))

    if kernel_watcher is None:
        simulated = backend.device(device_id).simulated  # the host's kernel log says nothing about it
        kernel_watcher = kernel_log.NullWatcher() if simulated else kernel_log.KernelLogWatcher(warn=warn)
    elif not kernel_watcher.on_event:
        kernel_watcher._warn = warn
    kernel_watcher.on_event = lambda ev: trial.stop_engine("kernel")
    watcher = kernel_watcher

    with contextlib.ExitStack() as cleanup:
        # Each undo is registered just before the call it undoes: a call that raises may have half-happened
        # (a value written, a thread started), and every undo is safe on something that never started.
        # 1. the kernel log: only what is logged from now on counts
        cleanup.callback(lambda: setattr(trial, "kernel_events", watcher.stop()))
        watcher.start()
        try:
            if stop_event.is_set():
                raise StopRequested
            # 2. apply and verify (the backend validates and reads back)
            cleanup.callback(reset_and_verify, backend, device_id)
            applied = backend.apply(device_id, setting)
            if applied.current != setting:
                raise NotApplied(f"{device_id} reads back {applied.current:+d} {knob.unit} after writing "
                                 f"{setting:+d}", "the card was reset to stock; check `tuner doctor`")
            for line in applied.clamped:  # curve points the driver's range kept from the asked offset
                warn(f"clamped: {line}")
            # 3. under load
            cleanup.callback(end_load, backend, device_id)
            backend.note_load(device_id, True)
            target = backend.stress_target(device_id)
            trial.target = target
            watcher.pci_bus_id = None if target.simulated else target.pci_bus_id
            config = trial_request(target, params, setting)
            sampler = trial.sampler = TelemetrySampler(backend, device_id, interval_s=params.telemetry_interval_s)
            cleanup.callback(lambda: setattr(trial, "summary", sampler.stop()))
            sampler.start()
            watchdog = params.watchdog or WatchdogPolicy.for_config(config)
            run = trial.run = engine_factory(config, watchdog)
            cleanup.callback(run.stop)  # safe on a run that never started or already ended
            run.start()
            end_watch = threading.Event()

            def watch_stop() -> None:
                while not end_watch.is_set():
                    if stop_event.wait(0.2):
                        trial.stop_engine(STOPPED)
                        return
                    if sampler.device_lost:
                        trial.stop_engine("device-lost")
                        return

            stopper = threading.Thread(target=watch_stop, name="trial-stop", daemon=True)
            cleanup.callback(end_thread, end_watch, stopper)
            stopper.start()
            follow(run, trial, target, params, setting, started_at, emit, clock)
            trial.engine_result = bounded_result(run, watchdog)
        except StopRequested:
            trial.stop_reason = STOPPED

    pstate_problem = pstate_problem_of(backend, device_id, setting, knob.stock, trial.summary)
    return classify(
        setting=setting, unit=knob.unit, params=params, engine_result=trial.engine_result, summary=trial.summary,
        kernel_events=trial.kernel_events, stop_reason=trial.stop_reason,
        device_lost=trial.sampler.device_lost if trial.sampler else None, pci_problem=trial.pci_problem,
        pstate_problem=pstate_problem,
        injected=bool(trial.target and trial.target.simulated and (trial.target.fault_rate > 0 or trial.target.hang)),
        simulated=bool(trial.target and trial.target.simulated), warnings=warnings, started_at=started_at,
        wall_s=clock() - started_at,
    )


def pstate_problem_of(backend: Backend, device_id: str, setting: int, stock: int,
                      summary: TelemetrySummary | None) -> str | None:
    """Why the card ran in performance states its offset does not cover (NVIDIA), or None (also at stock)."""
    if summary is None or setting == stock:
        return None
    try:
        return sampler_mod.pstate_problem(summary.pstates, backend.applied_pstates(device_id))
    except TunerError:
        return None


def follow(run: sc.StressRun, trial: TrialState, target: StressTarget, params: TrialParams, setting: int,
           started_at: float, emit: Callable[[TrialEvent], None], clock: Callable[[], float], *,
           device: str = "", seen: Callable[[sc.Event], None] | None = None) -> None:
    """Read the engine's events until it ends: check it runs on the card being tuned, report progress (about
    `device`, when given). `seen` gets every event first (the rig trial keeps each rank's start and faults)."""
    last_progress = 0.0
    step: int | None = None
    tok_s: float | None = None
    for event in run.events():
        if seen is not None:
            seen(event)
        match event:
            case sc.StartEvent(pci_bus_id=reported):
                if target.pci_bus_id and reported and not same_bus(reported, target.pci_bus_id):
                    trial.pci_problem = (f"the engine runs on PCI {reported}, not on the card being tuned "
                                         f"({target.pci_bus_id}); check CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES")
                    trial.stop_engine("pci")
            case sc.StepEvent(step=step_no, tok_s=rate):
                step, tok_s = step_no, rate
            case sc.GemmEvent(step=step_no):
                step = step_no
            case _:
                pass
        now = clock()
        if now - last_progress >= params.progress_interval_s:
            last_progress = now
            latest = trial.sampler.latest() if trial.sampler else None
            elapsed = now - started_at
            emit(TrialProgress(
                setting=setting, phase=params.phase, elapsed_s=round(elapsed, 1),
                duration_s=params.duration_s, eta_s=round(max(0.0, params.duration_s - elapsed), 1),
                step=step, tok_s=tok_s, power_w=latest.power_w if latest else None,
                temp_c=(latest.temp_hotspot_c or latest.temp_edge_c) if latest else None, device=device))


def end_load(backend: Backend, device_id: str) -> None:
    try:
        backend.note_load(device_id, False)
    except TunerError:
        pass  # the load marker is advisory (the simulated card's telemetry); the reset that follows is not


def end_thread(done: threading.Event, thread: threading.Thread) -> None:
    done.set()
    if thread.is_alive():
        thread.join(timeout=5.0)


def bounded_result(run: sc.StressRun, watchdog: WatchdogPolicy) -> StressResult | None:
    """The engine's result, waited for a bounded time (its output has ended, so it should be exiting): if it does
    not exit, stop it (SIGTERM, then SIGKILL) and wait once more; None when even that does not end it."""
    try:
        return run.result(timeout=RESULT_WAIT_S)
    except TimeoutError:
        run.stop()
    try:
        return run.result(timeout=watchdog.kill_grace_s + 10.0)
    except TimeoutError:
        return None


_bounded_result = bounded_result  # the old private name (its callers and tests)


def reset_and_verify(backend: Backend, device_id: str) -> None:
    knob = backend.reset(device_id)
    if knob.current != knob.stock:
        raise NotApplied(f"{device_id} did not return to stock (reads {knob.current:+d} {knob.unit})",
                         "run `tuner reset` or reboot before tuning again")


def classify(*, setting: int, unit: str, params: TrialParams, engine_result: StressResult | None,
             summary: TelemetrySummary | None, kernel_events: list[kernel_log.KernelEvent],
             stop_reason: str | None, device_lost: str | None, pci_problem: str | None, injected: bool,
             simulated: bool, warnings: list[str], started_at: float, wall_s: float,
             pstate_problem: str | None = None) -> TrialResult:
    r = engine_result
    tok_s = r.median_tok_s if r is not None else None
    power_w = summary.mean_power_w if summary else None
    tok_per_j = tok_s / power_w if tok_s and power_w else None
    base = TrialResult(
        setting=setting, unit=unit, phase=params.phase, verdict="pass",
        steps=r.steps if r is not None else None,
        warmup_steps=r.start.warmup_steps if r is not None and r.start is not None else None,
        duration_s=round((r.duration_s if r is not None else None) or wall_s, 3),
        tok_s=tok_s, power_w=None if power_w is None else round(power_w, 2),
        max_temp_c=summary.max_temp_c if summary else None,
        max_temp_edge_c=summary.max_temp_edge_c if summary else None,
        max_temp_hotspot_c=summary.max_temp_hotspot_c if summary else None,
        max_temp_mem_c=summary.max_temp_mem_c if summary else None,
        energy_j=None if not summary or summary.energy_j is None else round(summary.energy_j, 1),
        j_per_tok=None if not tok_per_j else 1.0 / tok_per_j,
        tok_per_j=tok_per_j,
        efficiency_vs_stock=(tok_per_j / params.baseline_tok_per_j
                             if tok_per_j and params.baseline_tok_per_j else None),
        injected=injected, simulated=simulated,
        sensitivity=r.sensitivity if r is not None else None,
        kernel_log=tuple(e.line for e in kernel_events), warnings=tuple(warnings), started_at=started_at,
        median_core_clock_mhz=summary.median_core_clock_mhz if summary else None,
        pstates=summary.pstates if summary else (),
        p95_power_w=None if not summary or summary.p95_power_w is None else round(summary.p95_power_w, 2),
        power_limit_w=summary.power_limit_w if summary else None,
        throttle_reasons=summary.throttle_reasons if summary else (),
    )
    base = _with_voltage_effect(base, params, summary)
    fault_step = r.failure_step if r is not None else None
    reference_step = r.reference_step if r is not None else None
    if kernel_events:
        first = kernel_events[0]
        return replace(base, verdict="fail", kind=first.kind, reason=kernel_log.summarize(kernel_events),
                       edge=any(e.edge for e in kernel_events), fault_step=fault_step)
    if device_lost:
        return replace(base, verdict="fail", kind="device-lost", reason=f"device lost: {device_lost}", edge=True)
    if pci_problem:
        return replace(base, verdict="error", kind="wrong-device", reason=pci_problem)
    if pstate_problem:
        return replace(base, verdict="error", kind="pstate", reason=pstate_problem)
    if stop_reason == STOPPED:
        return replace(base, verdict=STOPPED, reason="stopped on request")
    if r is None:
        return replace(base, verdict="error", kind="no-result", reason="the stress engine did not report a result")
    if r.verdict == "pass":
        return base
    if r.verdict == "fail":
        return replace(base, verdict="fail", kind=r.kind, reason=r.reason or str(r.kind), fault_step=fault_step,
                       reference_step=reference_step, edge=r.kind == "hang")
    detail = r.reason or ((r.stderr_tail or "").strip().splitlines() or ["setup problem"])[-1]
    return replace(base, verdict="error", kind=r.kind or "setup", reason=detail[:300], fault_step=fault_step)


def _with_voltage_effect(result: TrialResult, params: TrialParams,
                         summary: TelemetrySummary | None) -> TrialResult:
    """The measured core voltage, its drop from the stock baseline, and "not effective" when the drop is under
    half of the asked undervolt (mV settings only; NVML reports no voltage)."""
    measured = summary.mean_voltage_mv if summary else None
    voltage_mv = None if measured is None else round(measured, 1)
    if result.unit != "mV":
        return replace(result, voltage_mv=voltage_mv)
    drop_mv, effective = sampler_mod.voltage_effect(result.setting, params.baseline_voltage_mv, measured)
    warnings = result.warnings
    if effective is False:
        message = (f"not effective: asked {result.setting:+d} mV, the card dropped only "
                   f"{drop_mv:.0f} mV under load (the measured voltage is the evidence)")
        warnings = (*warnings, message)
    return replace(result, voltage_mv=voltage_mv, voltage_drop_mv=drop_mv, effective=effective,
                   warnings=warnings)
