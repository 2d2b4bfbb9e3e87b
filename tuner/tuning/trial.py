"""One trial: every card of `settings` at its setting under the stress engine at once, measured and classified.
A single card is a trial of one card (the bisect's search); several are one data-parallel training job (the
whole-rig confirmation, issue 16: one engine per card, `--world-size N --rank R --rendezvous file://...`, gloo on the
CPU and the simulated cards, nccl/rccl on GPUs, gradients all-reduced every step). Every card keeps its own
detectors, watchdog, telemetry and reference (recorded at stock with `record_paths`, compared with
`reference_paths`).

Order (docs/bisect.md, "One trial"): start the kernel-log watcher (only later messages count); apply every setting
(the backend reads it back); mark the cards loaded; start the engines on `backend.stress_target` (each reported PCI
bus id must be its target's); watch engine events, the heartbeat watchdog (inside `StressRun`), the kernel log and
1 Hz telemetry; end the load; reset every card to stock and verify; classify each card, then judge who is to blame
(docs/bisect.md, "The rig trial": a card's own fault pins it, a fault that reached it through the all-reduce or a
peer's end does not; a kernel line naming no card, or every card failing at once, is a whole-machine event). Every
undo sits on one ExitStack, so every card is back at stock (verified) whatever happens.

Setup problems (out of memory, a missing library, a NaN that is the software's) are `error`, never blamed on the
voltage. Core module: no textual, no torch (the engines run in subprocesses).
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
from tuner.core.errors import NotApplied, TunerError
from tuner.core.models import Knob, StressTarget, Verdict, same_bus_id
from tuner.engine.events import EndEvent, FaultEvent, GemmEvent, StartEvent, StepEvent
from tuner.tuning import engine_client as sc
from tuner.tuning import kernel_log
from tuner.tuning import sampler as sampler_mod
from tuner.tuning.engine_client import EngineConfig, StressResult, WatchdogPolicy
from tuner.tuning.events import TrialEvent, TrialProgress, TrialResult, TrialWarning
from tuner.tuning.sampler import TelemetrySampler, TelemetrySummary

RESULT_WAIT_S = 60.0  # after the engine's output ended: how long to wait for its exit before stopping it
CPU_COLLECTIVE_TIMEOUT_S = 30.0  # simulated cards and CPUs: steps of milliseconds, no compile
GPU_COLLECTIVE_TIMEOUT_S = 300.0  # GPUs: ranks may reach the first collective minutes apart (compile, batch fit)
PEER_GRACE_S = 5.0  # after one card failed: how long the others get to report their own fault before being stopped
POLL_S = 0.1
SHARED_FIGURE = "state"  # the training state after the all-reduce: every rank's, whoever corrupted it
PEER, STOPPED_BY_PEER = "peer", "peer-failed"
STOPPED = Verdict.STOPPED
# inconclusive kinds: something outside the tuner (issue 28) -- the setting changed under the trial (another
# `tuner reset --force`, another tool), or the engine stopped by a signal (SIGSTOP, a debugger)
CHANGED_OUTSIDE, ENGINE_STOPPED = "changed-outside", "engine-stopped"
# the sampler's figures a result carries as they are (without a summary: the result's defaults)
AS_SAMPLED = ("max_temp_c", "max_temp_edge_c", "max_temp_hotspot_c", "max_temp_mem_c", "median_core_clock_mhz",
              "pstates", "power_limit_w", "throttle_reasons")

EngineFactory = Callable[[EngineConfig, WatchdogPolicy], sc.StressRun]
WatcherFactory = Callable[[str], "kernel_log.KernelLogWatcher | None"]


@dataclass(frozen=True)
class TrialParams:
    phase: str
    duration_s: float
    preset: str | None = None  # None: the request's default for the target (tiny on the CPU, nanochat on a GPU)
    mode: str = "train"
    seed: int = 0
    dtype: str | None = None
    record_paths: Mapping[str, Path] | None = None  # at stock: each card records its reference trajectory here
    reference_paths: Mapping[str, Path] | None = None  # each card compares against its own, looping it
    baselines: Mapping[str, TrialResult] | None = None  # each card's stock baseline: efficiency, voltage drop
    canary_every: int | None = None
    watchdog: WatchdogPolicy | None = None  # None: `WatchdogPolicy.for_config` (tighter on the CPU)
    telemetry_interval_s: float = 1.0
    progress_interval_s: float = 1.0
    steps: int | None = None  # bound by steps instead of duration_s (which then only feeds the ETA)
    verify_repeatable: bool = False  # the baseline's replay: record in the reference whether it repeats
    tolerance: bool = False  # the user opted in to the weaker comparison (reduced sensitivity)
    compile: bool | None = None  # torch.compile in the engine (None: its default, on for GPUs)
    collective_timeout_s: float | None = None  # several cards; None: CPU_/GPU_COLLECTIVE_TIMEOUT_S by the cards
    peer_grace_s: float = PEER_GRACE_S


@dataclass(frozen=True)
class TrialOutcome:
    results: Mapping[str, TrialResult]  # one per card
    pinned: tuple[str, ...] = ()  # the cards to blame (their own fault, at the earliest step)
    machine_event: str | None = None  # a whole-machine event: nobody's own fault (every card backs off)
    stopped: bool = False  # stopped on request: not a result
    collective: str | None = None  # the collective library the ranks used (gloo, nccl, rccl); None: never formed

    @property
    def result(self) -> TrialResult:
        """The result of a trial of one card."""
        [result] = self.results.values()
        return result


def default_engine_factory(config: EngineConfig, watchdog: WatchdogPolicy) -> sc.StressRun:
    return sc.StressRun(config, watchdog=watchdog)


def trial_request(target: StressTarget, params: TrialParams, device_id: str, setting: int,
                  **extra: object) -> EngineConfig:
    """The engine run for one card of a trial at `setting`; `extra`: further engine options (a data-parallel rank)."""
    record = (params.record_paths or {}).get(device_id)
    reference = (params.reference_paths or {}).get(device_id)
    return sc.engine_request(
        target, duration_s=None if params.steps is not None else params.duration_s, steps=params.steps,
        preset=params.preset, setting=setting, mode=params.mode,
        seed=params.seed, dtype=params.dtype, canary_every=params.canary_every,
        record=str(record) if record else None, reference=str(reference) if reference else None,
        # a reference one trial long covers a run of any length: past its end the engine restarts from the
        # initial weights and keeps comparing
        reference_loop=reference is not None and not params.verify_repeatable,
        tolerance=params.tolerance, verify_repeatable=params.verify_repeatable, compile=params.compile, **extra)


class _Card:
    """One card of the trial: what it started and saw; the cleanup fills in what it collects on the way out."""

    def __init__(self, device_id: str, rank: int, setting: int):
        self.device_id, self.rank, self.setting = device_id, rank, setting
        self.run: sc.StressRun | None = None
        self.target: StressTarget | None = None
        self.watchdog: WatchdogPolicy | None = None
        self.sampler: TelemetrySampler | None = None
        self.summary: TelemetrySummary | None = None
        self.kernel_events: list[kernel_log.KernelEvent] = []
        self.engine_result: StressResult | None = None
        self.stop_reason: str | None = None
        self.pci_problem: str | None = None
        self.figure: str | None = None  # the figure its own failing check compared
        self.library: str | None = None  # the collective library its engine reported
        self.warnings: list[str] = []
        # a simulated card: its own work rate under load (its tok/J is this over its power; the engine runs on the
        # CPU, whose tok/s swings with the host's load: SimulatedBackend.work_rate_tok_s)
        self.work_rate_tok_s: float | None = None
        self.follower: threading.Thread | None = None
        self.done = threading.Event()
        self.error: BaseException | None = None  # raised in its follower (a broken event consumer): re-raised

    def stop_engine(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.run is not None:
            self.run.stop()

    def keep_summary(self) -> None:
        if self.sampler is not None:
            self.summary = self.sampler.stop()
            self.sampler.check_setting()  # a change in the last second of the load counts too
            if self.sampler.read_back_problem:
                self.warnings.append(self.sampler.read_back_problem)


def run_trial(backend: Backend, settings: Mapping[str, int], params: TrialParams,
              on_event: Callable[[TrialEvent], None] | None = None, stop: threading.Event | None = None, *,
              engine_factory: EngineFactory | None = None,
              kernel_watcher_factory: WatcherFactory | None = None) -> TrialOutcome:
    """Run every card in `settings` at its setting together; return one TrialResult per card and the blame. Every
    card is back at stock (verified) when this returns or raises.

    Every undo is registered on an ExitStack just before the call it undoes (a call that raises may have
    half-happened; every undo is safe on something that never started). On the way out, in this order: the
    followers end, the engines are stopped, the samplers stop, the loads end (`note_load(False)`), every card is
    reset to stock and verified (each, even when another's reset raises), the kernel-log watcher stops (so a
    message the reset itself provokes still counts against this trial).

    Raises NotApplied / DeviceLost / PermissionDenied when a setting cannot be applied or a card cannot be reset
    (the caller stops). `stop` set from another thread ends the trial promptly (`stopped`). `kernel_watcher_factory`
    is asked for the trial's one watcher by the card's id (one card) or "rig"; None from it: the default."""
    emit = on_event or (lambda ev: None)
    stop = stop or threading.Event()
    engine_factory = engine_factory or default_engine_factory
    devices = list(settings)
    knobs = {d: backend.knob(d) for d in devices}
    started_at = time.time()
    cards = {d: _Card(d, i, int(settings[d])) for i, d in enumerate(devices)}
    where = devices[0] if len(devices) == 1 else "rig"  # what the trial's own warnings are about
    machine_lines: list[kernel_log.KernelEvent] = []
    halt: list[str] = []  # why every card was stopped (a stop, a machine event, a lost card), first reason first

    def stop_all(reason: str) -> None:
        halt.append(reason)
        for c in cards.values():
            c.stop_engine(reason)

    def warn(message: str, device: str = where) -> None:
        for c in cards.values() if device == where else [cards[device]]:
            c.warnings.append(message)
        emit(TrialWarning(message, device=device))

    if params.reference_paths is not None:  # before any card is touched: every card needs its reference
        missing = [d for d in devices if not (p := params.reference_paths.get(d)) or not Path(p).exists()]
        if missing:
            return _not_run(cards, knobs, params, started_at, missing)

    def on_kernel(event: kernel_log.KernelEvent) -> None:
        owner = _owner(event, cards)
        if owner is None and len(cards) > 1:
            machine_lines.append(event)
        elif owner in cards or owner is None:
            cards[owner or where].kernel_events.append(event)  # one card: a line naming no card is about it
        else:
            return  # another card's line
        stop_all("kernel")

    watcher = _watcher(backend, devices, where, kernel_watcher_factory, warn)
    watcher.on_event = on_kernel
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(watcher.stop)
        watcher.start()
        if stop.is_set():
            stop_all(STOPPED)
        else:
            _start(backend, cards, params, engine_factory, cleanup, warn)
            for c in cards.values():
                c.follower = threading.Thread(target=_follow, name=f"trial-follow-{c.device_id}", daemon=True,
                                              args=(c, params, started_at, emit))
                c.follower.start()
            _supervise(cards, params, stop, stop_all)
            error = next((c.error for c in cards.values() if c.error is not None), None)
            if error is not None:
                raise error
            for c in cards.values():
                assert c.run is not None and c.watchdog is not None
                c.engine_result = bounded_result(c.run, c.watchdog)
    if halt and halt[0] == STOPPED:
        for c in cards.values():
            c.stop_reason = STOPPED  # a stop on request ends every card, whatever else stopped it too
    results = {d: _classify(backend, c, knobs[d], params, started_at) for d, c in cards.items()}
    library = next((c.library for c in cards.values() if c.library), None)
    if any(r.verdict == STOPPED for r in results.values()):
        return TrialOutcome(results, stopped=True, collective=library)
    return _judge(results, cards, machine_lines, library)


def _start(backend: Backend, cards: Mapping[str, _Card], params: TrialParams, engine_factory: EngineFactory,
           cleanup: contextlib.ExitStack, warn: Callable[..., None]) -> None:
    """Apply every setting and read it back, mark the cards loaded, start the samplers and the engines."""
    for d, c in cards.items():
        cleanup.callback(reset_and_verify, backend, d)
        applied = backend.apply(d, c.setting)
        if applied.current != c.setting:
            raise NotApplied(f"{d} reads back {applied.current:+d} {applied.unit} after writing {c.setting:+d}",
                             "every card was reset to stock; check `tuner doctor`")
        for line in applied.clamped:  # curve points the driver's range kept from the asked offset
            warn(f"clamped: {line}", d)
    for d, c in cards.items():
        cleanup.callback(end_load, backend, d)
        backend.note_load(d, True)
        c.target = backend.stress_target(d)
        work_rate = getattr(backend, "work_rate_tok_s", None) if c.target.simulated else None
        c.work_rate_tok_s = work_rate(d) if work_rate is not None else None
    extra: dict[str, object] = {}
    if len(cards) > 1:  # one data-parallel group; the rendezvous is a file in a directory of its own
        rendezvous_dir = Path(tempfile.mkdtemp(prefix="tuner-rig-"))
        cleanup.callback(shutil.rmtree, rendezvous_dir, True)
        on_cpu = all(c.target is not None and c.target.torch_device == "cpu" for c in cards.values())
        extra = {"world_size": len(cards), "rendezvous": f"file://{rendezvous_dir / 'rendezvous'}",
                 "collective_timeout_s": params.collective_timeout_s if params.collective_timeout_s is not None
                 else CPU_COLLECTIVE_TIMEOUT_S if on_cpu else GPU_COLLECTIVE_TIMEOUT_S}
    for d, c in cards.items():
        c.sampler = TelemetrySampler(backend, d, interval_s=params.telemetry_interval_s, expected_setting=c.setting)
        cleanup.callback(c.keep_summary)
        c.sampler.start()
    # joined after every engine was stopped (undos run in reverse): a follower ends when its engine's output does
    cleanup.callback(_join_followers, cards)
    for d, c in cards.items():
        assert c.target is not None
        config = trial_request(c.target, params, d, c.setting, **({**extra, "rank": c.rank} if extra else {}))
        c.watchdog = params.watchdog or WatchdogPolicy.for_config(config)
        run = c.run = engine_factory(config, c.watchdog)
        cleanup.callback(run.stop)  # safe on a run that never started or already ended
        run.start()  # from this thread, which outlives the trial (the engines' parent-death signal)


def _watcher(backend: Backend, devices: list[str], where: str, factory: WatcherFactory | None,
             warn: Callable[[str], None]) -> kernel_log.KernelLogWatcher:
    """One watcher for the whole trial, reading every GPU line (attributed by PCI address in `on_kernel`). It
    starts before any card is touched, so before the cards' stress targets (read once their settings are applied)
    exist: whether they are simulated is asked of the cards themselves."""
    watcher = factory(where) if factory is not None else None
    if watcher is None:
        simulated = all(backend.device(d).simulated for d in devices)
        watcher = default_watcher(backend, devices, warn, simulated=simulated)
    watcher.pci_bus_id = None  # every line; the trial attributes them
    return watcher


def default_watcher(backend: Backend, devices: list[str], warn: Callable[[str], None], *,
                    simulated: bool) -> kernel_log.KernelLogWatcher:
    """The kernel-log watcher of a run on `devices` (a trial's, `tuner stress`'s) when its caller was given none:
    none for simulated cards (the host's kernel log says nothing about them), else one reading
    `kernel_log_source`."""
    if simulated:
        return kernel_log.NullWatcher()
    return kernel_log.KernelLogWatcher(warn=warn, source=lambda: kernel_log_source(backend, devices))


def kernel_log_source(backend: Backend, devices: list[str]) -> kernel_log.LiveSource | None:
    """The backend's kernel log (the root helper's stream of these cards' lines: a user's tuner cannot read
    `/dev/kmsg` where `dmesg_restrict=1`), else the tuner's own reading of it (in-process, or a helper that
    cannot read it either: then the watcher says the kernel log is off)."""
    return backend.kernel_log_source(list(devices)) or kernel_log.open_live_source()


def _owner(event: kernel_log.KernelEvent, cards: Mapping[str, _Card]) -> str | None:
    """The card a kernel line names ("" for a card outside the trial), or None when it names none, or when a card
    whose bus is not known (yet) could be the one it names (fail closed)."""
    named = kernel_log.named_buses(event.line)
    if not named:
        return None
    buses = {d: c.target.pci_bus_id if c.target else None for d, c in cards.items()}
    for d, bus in buses.items():
        if bus and kernel_log.bus_of(bus) in named:  # the same matching as the watcher's own (`classify_line`)
            return d
    return "" if all(buses.values()) else None


def _join_followers(cards: Mapping[str, _Card]) -> None:
    for c in cards.values():
        if c.follower is not None:
            c.done.set()
            if c.follower.is_alive():
                c.follower.join(timeout=5.0)


def _follow(c: _Card, params: TrialParams, started_at: float, emit: Callable[[TrialEvent], None]) -> None:
    """Read one card's engine events until it ends: check it runs on the card being tuned, keep what it reports
    about the data-parallel group and the figure of its fault, report progress."""
    try:
        assert c.run is not None and c.target is not None
        last_progress, step, tok_s = 0.0, None, None
        for event in c.run.events():
            match event:
                case StartEvent(pci_bus_id=reported, data_parallel=dp):
                    if dp is not None:
                        c.library = dp.library
                    if c.target.pci_bus_id and reported and not same_bus_id(reported, c.target.pci_bus_id):
                        c.pci_problem = (f"the engine runs on PCI {reported}, not on the card being tuned "
                                         f"({c.target.pci_bus_id}); check CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES")
                        c.stop_engine("pci")
                case StepEvent(step=step_no, tok_s=rate):
                    step, tok_s = step_no, rate
                case GemmEvent(step=step_no):
                    step = step_no
                case FaultEvent(figure=str() as figure) | EndEvent(figure=str() as figure):
                    c.figure = figure
            now = time.time()
            if now - last_progress >= params.progress_interval_s:
                last_progress = now
                latest = c.sampler.latest() if c.sampler else None
                elapsed = now - started_at
                emit(TrialProgress(
                    setting=c.setting, phase=params.phase, elapsed_s=round(elapsed, 1),
                    duration_s=params.duration_s, eta_s=round(max(0.0, params.duration_s - elapsed), 1),
                    step=step, tok_s=tok_s, power_w=latest.power_w if latest else None,
                    temp_c=(latest.temp_hotspot_c or latest.temp_edge_c) if latest else None, device=c.device_id))
    except BaseException as e:  # noqa: BLE001 - re-raised in the trial's thread, after every engine is stopped
        c.error = e
    finally:
        c.done.set()


def _supervise(cards: Mapping[str, _Card], params: TrialParams, stop: threading.Event,
               stop_all: Callable[[str], None]) -> None:
    """Wait for every card's engine to end. Stop all on request or when a card is lost; once a card ended with a
    fault or an error of its own, the others get `peer_grace_s` to report theirs (the same step), then are stopped."""
    grace_until: float | None = None
    stopped = lost = changed = False
    while not all(c.done.is_set() for c in cards.values()):
        if stop.wait(POLL_S) and not stopped:
            stopped = True
            stop_all(STOPPED)
        if any(c.error is not None for c in cards.values()):
            stop_all("error")
        if not lost and any(c.sampler and c.sampler.device_lost for c in cards.values()):
            lost = True
            stop_all("device-lost")
        if not changed and any(c.sampler and c.sampler.setting_changed for c in cards.values()):
            changed = True  # what the card runs at is no longer the trial's: nothing more to learn from it
            stop_all(CHANGED_OUTSIDE)
        now = time.monotonic()
        if grace_until is None and any(_own_end(c) for c in cards.values()):
            grace_until = now + params.peer_grace_s
        if grace_until is not None and now >= grace_until:
            for c in cards.values():
                if not c.done.is_set():
                    c.stop_engine(STOPPED_BY_PEER)


def _own_end(c: _Card) -> bool:
    """The card's engine exited with something other than a pass or a lost peer. A card whose follower raised is
    not asked (its engine may have no result; the trial ends as that error, every engine stopped)."""
    if not c.done.is_set() or c.run is None or c.error is not None:
        return False
    try:
        result = c.run.result(timeout=0.5)
    except TimeoutError:
        return False
    return not result.passed and result.kind != PEER


def end_load(backend: Backend, device_id: str) -> None:
    """The load marker is advisory (the simulated card's telemetry); the reset that follows is not."""
    with contextlib.suppress(TunerError):
        backend.note_load(device_id, False)


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


def reset_and_verify(backend: Backend, device_id: str) -> None:
    knob = backend.reset(device_id)
    if knob.current != knob.stock:
        raise NotApplied(f"{device_id} did not return to stock (reads {knob.current:+d} {knob.unit})",
                         "run `tuner reset` or reboot before tuning again")


def _classify(backend: Backend, c: _Card, knob: Knob, params: TrialParams, started_at: float) -> TrialResult:
    """One card's result: what it measured, its verdict (the first cause that applies, in order), and a stop that
    was not its own doing (another card's fault, a kernel line, a lost card) inconclusive."""
    r, summary, target = c.engine_result, c.summary, c.target
    tok_s = r.median_tok_s if r is not None else None
    power_w = summary.mean_power_w if summary else None
    work_s = c.work_rate_tok_s or tok_s  # a simulated card: the card's work rate, not the CPU engine's tok/s
    tok_per_j = work_s / power_w if work_s and tok_s and power_w else None
    baseline = (params.baselines or {}).get(c.device_id)
    base_tok_per_j = baseline.tok_per_j if baseline is not None else None
    base = TrialResult(
        setting=c.setting, unit=knob.unit, phase=params.phase, verdict="pass",
        steps=r.steps if r is not None else None,
        warmup_steps=r.start.warmup_steps if r is not None and r.start is not None else None,
        # the wall clock may step back during a trial: a negative length is one the journal refuses on resume
        duration_s=round((r.duration_s if r is not None else None) or max(0.0, time.time() - started_at), 3),
        tok_s=tok_s, power_w=None if power_w is None else round(power_w, 2),
        **{name: getattr(summary, name) for name in AS_SAMPLED if summary},
        energy_j=None if not summary or summary.energy_j is None else round(summary.energy_j, 1),
        j_per_tok=None if not tok_per_j else 1.0 / tok_per_j,
        tok_per_j=tok_per_j,
        efficiency_vs_stock=tok_per_j / base_tok_per_j if tok_per_j and base_tok_per_j else None,
        injected=bool(target and target.simulated and (target.fault_rate > 0 or target.hang)),
        simulated=bool(target and target.simulated), sensitivity=r.sensitivity if r is not None else None,
        kernel_log=tuple(e.line for e in c.kernel_events), warnings=tuple(c.warnings), started_at=started_at,
        p95_power_w=None if not summary or summary.p95_power_w is None else round(summary.p95_power_w, 2),
        median_step_ms=r.end.median_step_ms if r is not None and r.end is not None else None,
    )
    pstate_problem = None  # the card ran in performance states its offset does not cover (NVIDIA; not at stock)
    if summary is not None and c.setting != knob.stock:
        with contextlib.suppress(TunerError):
            pstate_problem = sampler_mod.pstate_problem(summary.pstates, backend.applied_pstates(c.device_id))
    result = _verdict(c, _with_voltage_effect(base, baseline.voltage_mv if baseline is not None else None, summary),
                      pstate_problem)
    if result.verdict in (Verdict.FAIL, STOPPED, Verdict.INCONCLUSIVE):  # inconclusive: its own reason, said
        return result
    if r is not None and r.kind == PEER:
        return replace(result, verdict=Verdict.INCONCLUSIVE, kind=PEER, reason=r.reason)
    if c.stop_reason in (STOPPED_BY_PEER, "kernel", "device-lost", CHANGED_OUTSIDE) and not result.passed:
        why = {STOPPED_BY_PEER: "stopped after another card failed", "kernel": "stopped by a kernel-log event",
               "device-lost": "stopped: another card was lost",
               CHANGED_OUTSIDE: "stopped: another card's setting was changed outside this bisect"}[c.stop_reason]
        return replace(result, verdict=Verdict.INCONCLUSIVE, kind=PEER, reason=why)
    return result


def _verdict(c: _Card, base: TrialResult, pstate_problem: str | None) -> TrialResult:
    r = c.engine_result
    fault_step = r.failure_step if r is not None else None
    device_lost = c.sampler.device_lost if c.sampler else None
    if c.kernel_events:
        return replace(base, verdict="fail", kind=c.kernel_events[0].kind, reason=kernel_log.summarize(c.kernel_events),
                       edge=any(e.edge for e in c.kernel_events), fault_step=fault_step)
    if device_lost:
        return replace(base, verdict="fail", kind="device-lost", reason=f"device lost: {device_lost}", edge=True)
    # below: what the kernel and the device said comes first (a hard failure stays one, whoever changed what)
    changed = c.sampler.setting_changed if c.sampler else None
    if changed:  # neither a pass nor a fail of the trial's setting
        return replace(base, verdict=Verdict.INCONCLUSIVE, kind=CHANGED_OUTSIDE, reason=changed)
    if c.pci_problem:
        return replace(base, verdict="error", kind="wrong-device", reason=c.pci_problem)
    if pstate_problem:
        return replace(base, verdict="error", kind="pstate", reason=pstate_problem)
    if c.stop_reason == STOPPED:
        return replace(base, verdict=STOPPED, reason="stopped on request")
    if r is None:
        return replace(base, verdict="error", kind="no-result", reason="the stress engine did not report a result")
    if r.engine_stopped_s and (r.verdict == "pass" or r.kind == "hang"):
        # stopped from outside: the card was not loaded for the whole trial, and its silence was no hang; a fault
        # the engine found itself (a mismatch) is still evidence
        return replace(base, verdict=Verdict.INCONCLUSIVE, kind=ENGINE_STOPPED, reason=(
            f"the stress engine was stopped from outside for {r.engine_stopped_s:.0f} s (SIGSTOP or a debugger: "
            "state T) with no kernel-log or device error: not evidence about the voltage; it runs again"))
    if r.verdict == "pass":
        return base
    if r.verdict == "fail":
        return replace(base, verdict="fail", kind=r.kind, reason=r.reason or str(r.kind), fault_step=fault_step,
                       reference_step=r.reference_step, edge=r.kind == "hang")
    detail = r.reason or ((r.stderr_tail or "").strip().splitlines() or ["setup problem"])[-1]
    return replace(base, verdict="error", kind=r.kind or "setup", reason=detail[:300], fault_step=fault_step)


def _with_voltage_effect(result: TrialResult, baseline_voltage_mv: float | None,
                         summary: TelemetrySummary | None) -> TrialResult:
    """The measured core voltage, its drop from the stock baseline, and "not effective" when the drop is under
    half of the asked undervolt (mV settings only; NVML reports no voltage)."""
    measured = summary.mean_voltage_mv if summary else None
    voltage_mv = None if measured is None else round(measured, 1)
    if result.unit != "mV":
        return replace(result, voltage_mv=voltage_mv)
    drop_mv, effective = sampler_mod.voltage_effect(result.setting, baseline_voltage_mv, measured)
    if effective is False:
        message = (f"not effective: asked {result.setting:+d} mV, the card dropped only "
                   f"{drop_mv:.0f} mV under load (the measured voltage is the evidence)")
        result = replace(result, warnings=(*result.warnings, message))
    return replace(result, voltage_mv=voltage_mv, voltage_drop_mv=drop_mv, effective=effective)


def _judge(results: dict[str, TrialResult], cards: Mapping[str, _Card],
           machine_lines: list[kernel_log.KernelEvent], library: str | None) -> TrialOutcome:
    """Who is to blame (see the module's docstring); one card alone is pinned for its own failure."""
    failed = {d: r for d, r in results.items() if r.verdict == Verdict.FAIL}
    several = len(results) > 1
    shared = {d for d, r in failed.items() if several and r.kind == "mismatch" and cards[d].figure == SHARED_FIGURE}
    own = {d: r for d, r in failed.items() if d not in shared}
    machine = None
    if machine_lines:
        machine = kernel_log.summarize(machine_lines)
    elif several and failed and all(r.kind == "hang" for r in failed.values()) and len(failed) == len(results):
        machine = "every rank hung at once (a freeze of the machine or of the collective)"
    elif several and all(r.kind == PEER for r in results.values()):
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
        return TrialOutcome(results, (), machine, collective=library)
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
    return TrialOutcome(results, pinned, None, collective=library)


def _not_run(cards: Mapping[str, _Card], knobs: Mapping[str, Knob], params: TrialParams, started_at: float,
             missing: list[str]) -> TrialOutcome:
    """A card without its reference cannot compare, and the group cannot run without it: nothing was touched."""
    results = {}
    for d, c in cards.items():
        verdict, reason = ((Verdict.ERROR, f"no reference for {d} (record the data-parallel reference at stock first)")
                           if d in missing else
                           (Verdict.INCONCLUSIVE, f"not run: {', '.join(missing)} has no reference"))
        results[d] = TrialResult(setting=c.setting, unit=knobs[d].unit, phase=params.phase, verdict=verdict,
                                 kind="setup", reason=reason, started_at=started_at)
    return TrialOutcome(results)
