"""The whole-rig trial (issue 16): every card at its setting at once, as one data-parallel training job.

One engine per card (`python -m tuner.engine --world-size N --rank R --rendezvous file://...`, gloo on the CPU and
the simulated cards, nccl/rccl on GPUs): gradients are all-reduced every step, so the traffic between the cards is
part of the load. Every rank keeps its own detectors and its own reference (recorded at stock with `record_paths`,
compared with `reference_paths`).

The single-card trial's pieces are shared (tuner/tuning/trial.py): the apply-and-verify, the engine request, the
event follower, the telemetry, the classification and the cleanup. What is the rig's own:

- one kernel-log watcher for the trial: a line naming a card's PCI address counts against that card, a line naming
  no card is a whole-machine event;
- blame: the engine reports which figure failed. A fault this rank's own computation decides (its loss, its own
  gradients before the all-reduce (norm and exact bit checksum), its canary, its GEMM check, a hang, a crash) pins
  the card; a rank whose only difference is the training state after the all-reduce, while another rank's own
  figures differ, got that fault through the reduction and is inconclusive; a rank alone with a differing state
  computed its own update wrongly (pinned). A rank whose peer died or stalled (its engine ends with kind `peer`) or
  that the trial stopped because another card failed is inconclusive. `pinned` = the cards with their own fault at
  the earliest step;
- whole-machine events: a kernel line naming no card, every rank's state corrupted at the same step (the reduction
  itself), the collective stalled on every rank, every rank hung;
- every card is reset to stock and verified on the way out, whatever happened (ExitStack).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.backends.base import Backend
from tuner.core.errors import NotApplied
from tuner.core.models import Knob, StressTarget, Verdict
from tuner.tuning import engine_client as sc
from tuner.tuning import kernel_log
from tuner.tuning.engine_client import EngineConfig, WatchdogPolicy
from tuner.tuning.events import TrialEvent, TrialResult, TrialWarning
from tuner.tuning.sampler import TelemetrySampler
from tuner.tuning.trial import (
    STOPPED,
    TrialParams,
    TrialState,
    bounded_result,
    classify,
    default_engine_factory,
    end_load,
    end_thread,
    follow,
    pstate_problem_of,
    reset_and_verify,
    trial_request,
)

CPU_COLLECTIVE_TIMEOUT_S = 30.0  # simulated cards and CPUs: steps of milliseconds, no compile
GPU_COLLECTIVE_TIMEOUT_S = 300.0  # GPUs: ranks may reach the first collective minutes apart (compile, batch fit)
PEER_GRACE_S = 5.0  # after one rank failed: how long the others get to report their own fault before being stopped
POLL_S = 0.1
SHARED_FIGURE = "state"  # the training state after the all-reduce: every rank's, whoever corrupted it
PEER, STOPPED_BY_PEER = "peer", "peer-failed"


@dataclass(frozen=True)
class RigTrialParams:
    duration_s: float
    mode: str = "mixed"
    preset: str | None = None
    seed: int = 0
    dtype: str | None = None
    compile: bool | None = None
    watchdog: WatchdogPolicy | None = None
    record_paths: Mapping[str, Path] | None = None
    reference_paths: Mapping[str, Path] | None = None
    steps: int | None = None
    tolerance: bool = False
    phase: str = "rig-confirm"
    collective_timeout_s: float | None = None  # None: CPU_/GPU_COLLECTIVE_TIMEOUT_S by the cards
    peer_grace_s: float = PEER_GRACE_S
    telemetry_interval_s: float = 1.0
    progress_interval_s: float = 1.0


@dataclass(frozen=True)
class RigTrialResult:
    results: Mapping[str, TrialResult]
    pinned: tuple[str, ...]
    machine_event: str | None
    stopped: bool = False
    collective: str | None = None  # the collective library the ranks used (gloo, nccl, rccl); None: never formed


class _Rank:
    """One card's rank: its trial state (shared type with the single-card trial) and what its engine said."""

    def __init__(self, device_id: str, rank: int, setting: int):
        self.device_id, self.rank, self.setting = device_id, rank, setting
        self.state = TrialState()
        self.watchdog: WatchdogPolicy | None = None
        self.follower: threading.Thread | None = None
        self.done = threading.Event()
        self.figure: str | None = None  # the figure its own failing check compared
        self.library: str | None = None
        self.warnings: list[str] = []
        self.error: BaseException | None = None  # raised in its follower (a broken event consumer): re-raised

    def seen(self, event: sc.Event) -> None:
        if isinstance(event, sc.StartEvent):
            dp = event.raw.get("data_parallel")
            if isinstance(dp, dict) and isinstance(dp.get("library"), str):
                self.library = dp["library"]
        elif isinstance(event, (sc.FaultEvent, sc.EndEvent)) and isinstance(event.raw.get("figure"), str):
            self.figure = event.raw["figure"]


def _trial_params(params: RigTrialParams, device_id: str) -> TrialParams:
    record = (params.record_paths or {}).get(device_id)
    reference = (params.reference_paths or {}).get(device_id)
    return TrialParams(phase=params.phase, duration_s=params.duration_s, preset=params.preset, mode=params.mode,
                       seed=params.seed, dtype=params.dtype, record_path=record, reference_path=reference,
                       watchdog=params.watchdog, telemetry_interval_s=params.telemetry_interval_s,
                       progress_interval_s=params.progress_interval_s, steps=params.steps,
                       tolerance=params.tolerance, compile=params.compile)


def _collective_timeout_s(params: RigTrialParams, targets: Mapping[str, StressTarget]) -> float:
    if params.collective_timeout_s is not None:
        return params.collective_timeout_s
    on_cpu = all(t.torch_device == "cpu" for t in targets.values())
    return CPU_COLLECTIVE_TIMEOUT_S if on_cpu else GPU_COLLECTIVE_TIMEOUT_S


def run_rig_trial(backend: Backend, settings: Mapping[str, int], params: RigTrialParams,
                  on_event: Callable[[TrialEvent], None] | None, stop: threading.Event, *,
                  engine_factory: Callable[[EngineConfig, WatchdogPolicy], sc.StressRun] | None = None,
                  kernel_watcher_factory: Callable[[str], kernel_log.KernelLogWatcher] | None = None,
                  clock: Callable[[], float] = time.time) -> RigTrialResult:
    """Run every card in `settings` at its setting together; return one TrialResult per card. Every card is back at
    stock (verified) when this returns or raises. Raises NotApplied / DeviceLost / PermissionDenied when a setting
    cannot be applied or a card cannot be reset (the caller stops). `stop` set from another thread ends the trial
    promptly (`stopped`)."""
    emit = on_event or (lambda ev: None)
    engine_factory = engine_factory or default_engine_factory
    devices = list(settings)
    knobs = {d: backend.knob(d) for d in devices}
    started_at = clock()
    ranks = {d: _Rank(d, i, int(settings[d])) for i, d in enumerate(devices)}
    machine_lines: list[kernel_log.KernelEvent] = []
    halt = threading.Event()  # a reason to stop every rank (stop, a machine event, a lost card)
    halt_reason: list[str] = []

    def stop_all(reason: str) -> None:
        if not halt_reason:
            halt_reason.append(reason)
        halt.set()
        for r in ranks.values():
            r.state.stop_engine(reason)

    if params.reference_paths is not None:  # before any card is touched: every rank needs its reference
        missing = [d for d in devices if not (p := params.reference_paths.get(d)) or not Path(p).exists()]
        if missing:
            return _not_run(ranks, knobs, params, started_at, missing)

    watcher = _watcher(backend, devices, kernel_watcher_factory, emit)
    targets: dict[str, StressTarget] = {}

    def on_kernel(event: kernel_log.KernelEvent) -> None:
        owner = _owner(event, targets)
        if owner is None:
            machine_lines.append(event)
            stop_all("kernel")
        elif owner in ranks:
            ranks[owner].state.kernel_events.append(event)
            stop_all("kernel")

    watcher.on_event = on_kernel
    with contextlib.ExitStack() as cleanup:
        # as in run_trial: each undo registered just before the call it undoes; they run in reverse order, so the
        # cards are reset (and verified) before the kernel-log watcher stops, and every card is reset even when
        # another card's reset raises
        cleanup.callback(watcher.stop)
        watcher.start()
        rendezvous_dir = Path(tempfile.mkdtemp(prefix="tuner-rig-"))
        cleanup.callback(shutil.rmtree, rendezvous_dir, True)
        if stop.is_set():
            return RigTrialResult({}, (), None, stopped=True)
        for d in devices:
            cleanup.callback(reset_and_verify, backend, d)
            applied = backend.apply(d, ranks[d].setting)
            if applied.current != ranks[d].setting:
                raise NotApplied(f"{d} reads back {applied.current:+d} {knobs[d].unit} after writing "
                                 f"{ranks[d].setting:+d}", "every card was reset to stock; check `tuner doctor`")
            for line in applied.clamped:
                ranks[d].warnings.append(f"clamped: {line}")
                emit(TrialWarning(f"clamped: {line}", device=d))
        for d in devices:
            cleanup.callback(end_load, backend, d)
            backend.note_load(d, True)
            targets[d] = ranks[d].state.target = backend.stress_target(d)
        timeout_s = _collective_timeout_s(params, targets)
        rendezvous = f"file://{rendezvous_dir / 'rendezvous'}"
        for d, r in ranks.items():
            sampler = r.state.sampler = TelemetrySampler(backend, d, interval_s=params.telemetry_interval_s)
            cleanup.callback(_keep_summary, r, sampler)
            sampler.start()
        # joined after every engine was stopped (undos run in reverse): a follower ends when its engine's output does
        cleanup.callback(_join_followers, ranks)
        for d, r in ranks.items():
            extra = {} if len(devices) < 2 else {"world_size": len(devices), "rank": r.rank, "rendezvous": rendezvous,
                                                 "collective_timeout_s": timeout_s}
            config = trial_request(targets[d], _trial_params(params, d), r.setting, **extra)
            r.watchdog = params.watchdog or WatchdogPolicy.for_config(config)
            run = r.state.run = engine_factory(config, r.watchdog)
            cleanup.callback(run.stop)  # safe on a run that never started or already ended
            run.start()  # from this thread, which outlives the trial (the engines' parent-death signal)
        for d, r in ranks.items():
            r.follower = threading.Thread(target=_follow_rank, name=f"rig-follow-{d}", daemon=True,
                                          args=(r, targets[d], _trial_params(params, d), started_at, emit, clock))
            r.follower.start()
        _supervise(ranks, params, stop, stop_all, halt)
        error = next((r.error for r in ranks.values() if r.error is not None), None)
        if error is not None:
            raise error
        for r in ranks.values():
            assert r.state.run is not None and r.watchdog is not None
            r.state.engine_result = bounded_result(r.state.run, r.watchdog)
    if stop.is_set() or (halt_reason and halt_reason[0] == STOPPED):
        return RigTrialResult({}, (), None, stopped=True)
    results = {d: _classify(backend, r, knobs[d], params, started_at, clock) for d, r in ranks.items()}
    library = next((r.library for r in ranks.values() if r.library), None)
    return _judge(results, ranks, machine_lines, library)


def _keep_summary(r: _Rank, sampler: TelemetrySampler) -> None:
    r.state.summary = sampler.stop()


def _watcher(backend: Backend, devices: list[str],
             factory: Callable[[str], kernel_log.KernelLogWatcher] | None,
             emit: Callable[[TrialEvent], None]) -> kernel_log.KernelLogWatcher:
    """One watcher for the whole trial, reading every GPU line (attributed by PCI address in `on_kernel`)."""
    if factory is not None:
        watcher = factory("rig")
    elif all(backend.device(d).simulated for d in devices):  # the host's kernel log says nothing about them
        watcher = kernel_log.NullWatcher()
    else:
        watcher = kernel_log.KernelLogWatcher(warn=lambda msg: emit(TrialWarning(msg, device="rig")))
    watcher.pci_bus_id = None  # every line; the rig attributes them
    return watcher


def _owner(event: kernel_log.KernelEvent, targets: Mapping[str, StressTarget]) -> str | None:
    """The card a kernel line names ("" for a card outside the rig), or None when it names none (the machine)."""
    named = kernel_log.named_buses(event.line)
    if not named:
        return None
    for d, t in targets.items():
        if t.pci_bus_id and kernel_log.bus_of(t.pci_bus_id) in named:  # the same matching as a single-card trial
            return d
    return ""


def _join_followers(ranks: Mapping[str, _Rank]) -> None:
    for r in ranks.values():
        if r.follower is not None:
            end_thread(r.done, r.follower)


def _follow_rank(r: _Rank, target: StressTarget, params: TrialParams, started_at: float,
                 emit: Callable[[TrialEvent], None], clock: Callable[[], float]) -> None:
    try:
        assert r.state.run is not None
        follow(r.state.run, r.state, target, params, r.setting, started_at, emit, clock, device=r.device_id,
               seen=r.seen)
    except BaseException as e:  # noqa: BLE001 - re-raised in the trial's thread, after every engine is stopped
        r.error = e
    finally:
        r.done.set()


def _supervise(ranks: Mapping[str, _Rank], params: RigTrialParams, stop: threading.Event,
               stop_all: Callable[[str], None], halt: threading.Event) -> None:
    """Wait for every rank to end. Stop all on request or when a card is lost; once a rank ended with a fault or
    an error of its own, the others get `peer_grace_s` to report theirs (the same step), then are stopped."""
    grace_until: float | None = None
    while not all(r.done.is_set() for r in ranks.values()):
        if stop.wait(POLL_S):
            stop_all(STOPPED)
        if any(r.error is not None for r in ranks.values()):
            stop_all("error")
        lost = next((r for r in ranks.values() if r.state.sampler and r.state.sampler.device_lost), None)
        if lost is not None and not halt.is_set():
            stop_all("device-lost")
        now = time.monotonic()
        if grace_until is None and any(_own_end(r) for r in ranks.values()):
            grace_until = now + params.peer_grace_s
        if grace_until is not None and now >= grace_until:
            for r in ranks.values():
                if not r.done.is_set():
                    r.state.stop_engine(STOPPED_BY_PEER)


def _own_end(r: _Rank) -> bool:
    """The rank ended with something other than a pass or a lost peer (its engine has exited)."""
    run = r.state.run
    if not r.done.is_set() or run is None:
        return False
    try:
        result = run.result(timeout=0.5)
    except TimeoutError:
        return False
    return not result.passed and result.kind != PEER


def _classify(backend: Backend, r: _Rank, knob: Knob, params: RigTrialParams, started_at: float,
              clock: Callable[[], float]) -> TrialResult:
    s = r.state
    target = s.target
    result = classify(
        pstate_problem=pstate_problem_of(backend, r.device_id, r.setting, knob.stock, s.summary),
        setting=r.setting, unit=knob.unit, params=_trial_params(params, r.device_id), engine_result=s.engine_result,
        summary=s.summary, kernel_events=s.kernel_events,
        stop_reason=s.stop_reason if s.stop_reason == STOPPED else None,
        device_lost=s.sampler.device_lost if s.sampler else None, pci_problem=s.pci_problem,
        injected=bool(target and target.simulated and (target.fault_rate > 0 or target.hang)),
        simulated=bool(target and target.simulated), warnings=r.warnings, started_at=started_at,
        wall_s=clock() - started_at)
    if result.verdict == Verdict.FAIL:
        return result
    if s.engine_result is not None and s.engine_result.kind == PEER:
        return replace(result, verdict=Verdict.INCONCLUSIVE, kind=PEER, reason=s.engine_result.reason)
    if s.stop_reason in (STOPPED_BY_PEER, "kernel", "device-lost") and not result.passed:
        why = {STOPPED_BY_PEER: "stopped after another card failed", "kernel": "stopped by a kernel-log event",
               "device-lost": "stopped: another card was lost"}[s.stop_reason]
        return replace(result, verdict=Verdict.INCONCLUSIVE, kind=PEER, reason=why)
    return result


def _judge(results: dict[str, TrialResult], ranks: Mapping[str, _Rank],
           machine_lines: list[kernel_log.KernelEvent], library: str | None) -> RigTrialResult:
    failed = {d: r for d, r in results.items() if r.verdict == Verdict.FAIL}
    shared = {d for d, r in failed.items() if r.kind == "mismatch" and ranks[d].figure == SHARED_FIGURE}
    own = {d: r for d, r in failed.items() if d not in shared}
    machine = None
    if machine_lines:
        machine = kernel_log.summarize(machine_lines)
    elif len(results) > 1 and failed and all(r.kind == "hang" for r in failed.values()) and len(failed) == len(
            results):
        machine = "every rank hung at once (a freeze of the machine or of the collective)"
    elif len(results) > 1 and all(r.kind == PEER for r in results.values()):
        machine = "the collective stalled on every rank (no rank failed its own checks)"
    elif not own and shared:
        steps = {failed[d].fault_step for d in shared}
        if len(shared) == len(results) and len(steps) == 1:
            machine = (f"every rank's training state differs after the all-reduce at step {steps.pop()} (the "
                       "reduction itself, not one card's computation)")
        else:  # only some ranks' state: each computed its own optimizer update wrongly
            own = {d: failed[d] for d in shared}
            shared = set()
    if machine is not None:
        results = {d: replace(r, verdict=Verdict.FAIL, kind="machine", reason=machine, edge=True)
                   for d, r in results.items()}
        return RigTrialResult(results, (), machine, collective=library)
    fault_steps = {d: r.fault_step for d, r in own.items()}
    first = min((s for s in fault_steps.values() if s is not None), default=None)
    pinned = tuple(d for d, s in fault_steps.items() if s == first or s is None or first is None)
    for d in shared:  # a peer's fault reached this rank through the all-reduce: not evidence against its voltage
        results[d] = replace(results[d], verdict=Verdict.INCONCLUSIVE, kind=PEER,
                             reason=f"the training state after the all-reduce differs ({', '.join(pinned)} failed its "
                                    f"own checks): {results[d].reason}")
    for d in own:
        if d not in pinned:
            results[d] = replace(results[d], verdict=Verdict.INCONCLUSIVE,
                                 reason=f"failed after {', '.join(pinned)} (step {first}): {results[d].reason}")
    return RigTrialResult(results, pinned, None, collective=library)


def _not_run(ranks: Mapping[str, _Rank], knobs: Mapping, params: RigTrialParams, started_at: float,
             missing: list[str]) -> RigTrialResult:
    """A rank without its reference cannot compare, and the group cannot run without it: nothing was touched."""
    results = {}
    for d, r in ranks.items():
        common = {"setting": r.setting, "unit": knobs[d].unit, "phase": params.phase, "started_at": started_at}
        if d in missing:
            results[d] = TrialResult(verdict=Verdict.ERROR, kind="setup", reason=f"no reference for {d} (record the "
                                     "data-parallel reference at stock first)", **common)
        else:
            results[d] = TrialResult(verdict=Verdict.INCONCLUSIVE, kind="setup", reason=f"not run: "
                                     f"{', '.join(missing)} has no reference", **common)
    return RigTrialResult(results, (), None)
