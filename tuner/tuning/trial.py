"""One trial: one setting on one device under the stress engine, measured and classified.

Order (docs/bisect.md): start the kernel-log watcher (only later messages count); apply the setting (the backend
reads it back); tell the backend the card is loaded; start the engine on `backend.stress_target` (its reported PCI
bus id must be the target's); watch engine events, the heartbeat watchdog (inside `StressRun`), the kernel log
and 1 Hz telemetry; tell the backend the load ended; reset to stock and verify; classify.

Setup problems (out of memory, a missing library, a NaN that is the software's) are `error`, never blamed on
the voltage. Core module: no textual, no torch (the engine runs in a subprocess).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.tuning import kernel_log
from tuner.backends.base import Backend
from tuner.tuning.events import TrialEvent, TrialProgress, TrialResult, TrialWarning
from tuner.core.errors import NotApplied, TunerError
from tuner.tuning import sampler as sampler_mod
from tuner.tuning.sampler import TelemetrySampler

SIM_HANG_STEP = 3  # a simulated card that "hangs" stops the engine at this step
STOPPED = "stopped"


@dataclass(frozen=True)
class WatchdogSettings:
    """Heartbeat watchdog: silence longer than max(min_silence_s, factor x median step) after warm-up is a hang;
    the first step may take `first_step_s` (cold compile). SIGTERM, then SIGKILL after `kill_after_s`."""

    first_step_s: float = 600.0
    min_silence_s: float = 60.0
    step_factor: float = 20.0
    kill_after_s: float = 30.0


@dataclass(frozen=True)
class TrialParams:
    phase: str
    duration_s: float
    preset: str = "small"
    mode: str = "train"
    seed: int = 0
    dtype: str | None = None
    record_path: Path | None = None  # the baseline records the reference trajectory here
    reference_path: Path | None = None  # every other trial compares against it, looping it (--reference-loop)
    canary_every: int | None = None
    watchdog: WatchdogSettings = WatchdogSettings()
    telemetry_interval_s: float = 1.0
    baseline_tok_per_j: float | None = None  # for efficiency_vs_stock
    baseline_voltage_mv: float | None = None  # the stock baseline's core voltage under load (measured drop)
    progress_interval_s: float = 1.0


class StopRequested(Exception):
    pass


def _engine_api():
    """The stress client (imported lazily: torch-free, but only needed when a trial runs)."""
    from tuner.tuning import engine_client as stress_client
    return stress_client


def default_engine_factory(request: dict, watchdog: WatchdogSettings):
    """A `StressRun` for `request` (the `EngineConfig` fields, see `engine_request`)."""
    sc = _engine_api()
    config = sc.EngineConfig(**request)
    policy = sc.WatchdogPolicy(first_step_timeout_s=watchdog.first_step_s, min_silence_s=watchdog.min_silence_s,
                               silence_factor=watchdog.step_factor, kill_grace_s=watchdog.kill_after_s)
    return sc.StressRun(config, watchdog=policy)


def fault_seed_for(seed: int, setting: int) -> int:
    """The engine's `--fault-seed` for a trial at `setting`: stable, and different for every setting, so a
    simulated card's injected faults do not land on the same step at every setting (the data and weights, and so
    the reference trajectory, stay seeded by `seed`)."""
    return seed * 1_000_003 + setting


def engine_request(target, params: TrialParams, setting: int | None = None) -> dict:
    """The engine configuration (`EngineConfig` fields) for one trial on `target` (a `StressTarget`) at
    `setting` (None: a run at whatever the card is set to, with the engine's default fault seed)."""
    injections = (f"hang@{SIM_HANG_STEP}",) if target.hang else ()
    kwargs = dict(
        device=target.torch_device,
        preset=params.preset,
        mode=params.mode,
        duration_s=params.duration_s,
        seed=params.seed,
        record=str(params.record_path) if params.record_path else None,
        reference=str(params.reference_path) if params.reference_path else None,
        # a reference one trial long covers a run of any length: past its end the engine restarts from the
        # initial weights and keeps comparing
        reference_loop=params.reference_path is not None,
        fault_rate=target.fault_rate,
        injections=injections,
        env=dict(target.env),
    )
    if setting is not None:
        kwargs["fault_seed"] = fault_seed_for(params.seed, setting)
    if params.dtype:
        kwargs["dtype"] = params.dtype
    if params.canary_every is not None:
        kwargs["canary_every"] = params.canary_every
    if target.pci_bus_id:
        kwargs["expect_pci_bus_id"] = target.pci_bus_id
    return kwargs


def _same_bus(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return True
    def norm(s: str) -> str:
        parts = s.lower().split(":")
        return ":".join(parts[-2:]) if len(parts) >= 2 else s.lower()
    return norm(a) == norm(b)


def run_trial(
    backend: Backend,
    device_id: str,
    setting: int,
    params: TrialParams,
    on_event: Callable[[TrialEvent], None] | None = None,
    stop_event: threading.Event | None = None,
    *,
    engine_factory: Callable | None = None,
    kernel_watcher: kernel_log.KernelLogWatcher | None = None,
    clock: Callable[[], float] = time.time,
) -> TrialResult:
    """Run one trial and return its result. The card is back at stock (verified) when this returns or raises.

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

    def warn(message: str) -> None:
        warnings.append(message)
        emit(TrialWarning(message))

    run = None
    stopper: threading.Thread | None = None
    stop_reason: list[str] = []
    sampler: TelemetrySampler | None = None
    loaded = False
    target = None
    engine_result = None
    pci_problem: str | None = None
    end_watch = threading.Event()

    def stop_engine(reason: str) -> None:
        if not stop_reason:
            stop_reason.append(reason)
        if run is not None:
            run.stop()

    # 1. the kernel log: only what is logged from now on counts
    if kernel_watcher is None:
        simulated = backend.device(device_id).simulated  # the host's kernel log says nothing about it
        kernel_watcher = kernel_log.NullWatcher() if simulated else kernel_log.KernelLogWatcher(warn=warn)
    elif not kernel_watcher._on_event:
        kernel_watcher._warn = warn
    kernel_watcher._on_event = lambda ev: stop_engine("kernel")
    kernel_watcher.start()
    try:
        # 2. apply and verify (the backend validates and reads back)
        if stop_event.is_set():
            raise StopRequested
        applied = backend.apply(device_id, setting)
        if applied.current != setting:
            raise NotApplied(f"{device_id} reads back {applied.current:+d} {knob.unit} after writing "
                             f"{setting:+d}", "the card was reset to stock; check `tuner doctor`")
        for line in applied.clamped:  # curve points the driver's range kept from the asked offset
            warn(f"clamped: {line}")
        backend.note_load(device_id, True)
        loaded = True
        target = backend.stress_target(device_id)
        if target.simulated:
            kernel_watcher.pci_bus_id = None
        else:
            kernel_watcher.pci_bus_id = target.pci_bus_id
        config = engine_request(target, params, setting)
        sampler = TelemetrySampler(backend, device_id, interval_s=params.telemetry_interval_s).start()
        run = engine_factory(config, params.watchdog)
        run.start()

        def watch_stop() -> None:
            while not end_watch.is_set():
                if stop_event.wait(0.2):
                    stop_engine(STOPPED)
                    return
                if sampler is not None and sampler.device_lost:
                    stop_engine("device-lost")
                    return

        stopper = threading.Thread(target=watch_stop, name="trial-stop", daemon=True)
        stopper.start()
        last_progress = 0.0
        for event in run.events():
            kind = getattr(event, "event", type(event).__name__)
            if kind in ("start", "StartEvent") or type(event).__name__ == "StartEvent":
                reported = getattr(event, "pci_bus_id", None)
                if target.pci_bus_id and reported and not _same_bus(reported, target.pci_bus_id):
                    pci_problem = (f"the engine runs on PCI {reported}, not on the card being tuned "
                                   f"({target.pci_bus_id}); check CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES")
                    stop_engine("pci")
            now = clock()
            if now - last_progress >= params.progress_interval_s:
                last_progress = now
                latest = sampler.latest() if sampler else None
                elapsed = now - started_at
                emit(TrialProgress(
                    setting=setting, phase=params.phase, elapsed_s=round(elapsed, 1),
                    duration_s=params.duration_s, eta_s=round(max(0.0, params.duration_s - elapsed), 1),
                    step=getattr(event, "step", None), tok_s=getattr(event, "tok_s", None),
                    power_w=latest.power_w if latest else None,
                    temp_c=(latest.temp_hotspot_c or latest.temp_edge_c) if latest else None))
        engine_result = run.result()
    except StopRequested:
        stop_reason.append(STOPPED)
    finally:
        end_watch.set()
        if run is not None and engine_result is None:
            run.stop()
        summary = sampler.stop() if sampler is not None else None
        if loaded:
            try:
                backend.note_load(device_id, False)
            except TunerError:
                pass
        kernel_events = kernel_watcher.stop()
        _reset_and_verify(backend, device_id)

    pstate_problem = None
    if summary is not None and setting != knob.stock:
        try:
            pstate_problem = sampler_mod.pstate_problem(summary.pstates, backend.applied_pstates(device_id))
        except TunerError:
            pstate_problem = None
    return classify(
        setting=setting, unit=knob.unit, params=params, engine_result=engine_result, summary=summary,
        kernel_events=kernel_events, stop_reason=stop_reason[0] if stop_reason else None,
        device_lost=sampler.device_lost if sampler else None, pci_problem=pci_problem,
        pstate_problem=pstate_problem,
        injected=bool(target and target.simulated and (target.fault_rate > 0 or target.hang)),
        simulated=bool(target and target.simulated), warnings=warnings, started_at=started_at,
        wall_s=clock() - started_at,
    )


def _reset_and_verify(backend: Backend, device_id: str) -> None:
    knob = backend.reset(device_id)
    if knob.current != knob.stock:
        raise NotApplied(f"{device_id} did not return to stock (reads {knob.current:+d} {knob.unit})",
                         "run `tuner reset` or reboot before tuning again")


def classify(*, setting: int, unit: str, params: TrialParams, engine_result, summary, kernel_events,
             stop_reason: str | None, device_lost: str | None, pci_problem: str | None, injected: bool,
             simulated: bool, warnings: list[str], started_at: float, wall_s: float,
             pstate_problem: str | None = None) -> TrialResult:
    r = engine_result
    tok_s = getattr(r, "median_tok_s", None) if r is not None else None
    power_w = summary.mean_power_w if summary else None
    tok_per_j = tok_s / power_w if tok_s and power_w else None
    base = TrialResult(
        setting=setting, unit=unit, phase=params.phase, verdict="pass",
        steps=getattr(r, "steps", None), warmup_steps=getattr(getattr(r, "start", None), "warmup_steps", None),
        duration_s=round(getattr(r, "duration_s", None) or wall_s, 3),
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
        sensitivity=getattr(r, "sensitivity", None) if r is not None else None,
        kernel_log=tuple(e.line for e in kernel_events), warnings=tuple(warnings), started_at=started_at,
        median_core_clock_mhz=summary.median_core_clock_mhz if summary else None,
        pstates=summary.pstates if summary else (),
    )
    base = _with_voltage_effect(base, params, summary)
    fault_step = getattr(r, "failure_step", None) if r is not None else None
    reference_step = getattr(r, "reference_step", None) if r is not None else None
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
    verdict, kind = r.verdict, getattr(r, "kind", None)
    reason = getattr(r, "reason", "") or ""
    if verdict == "pass":
        return base
    if verdict == "fail":
        return replace(base, verdict="fail", kind=kind, reason=reason or str(kind), fault_step=fault_step,
                       reference_step=reference_step, edge=kind == "hang")
    tail = getattr(r, "stderr_tail", "") or ""
    detail = reason or (tail.strip().splitlines() or ["setup problem"])[-1]
    return replace(base, verdict="error", kind=kind or "setup", reason=detail[:300], fault_step=fault_step)


def _with_voltage_effect(result: TrialResult, params: TrialParams, summary) -> TrialResult:
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
