"""A stand-in for `tuner.tuning.trial.run_trial` when it runs several cards at once (h-dp's data-parallel trial),
as the bisect job's rig tests need it: fast, deterministic, and never kinder than the real one. A trial of one card
(a card's own search) goes to the real `run_trial` with the job's engine factory (tests pass the fake engine).

Like the real one it applies every card's setting through the backend (validated, read back), marks the cards
loaded, writes each card's reference when asked to record (and fails a card whose reference is missing when asked
to compare), resets every card to stock and verifies it on the way out (always, exceptions included), and
returns one TrialResult per card, the cards whose own detector fired first (`pinned`: the earliest fault step), and
a whole-machine event. A card fails when the simulated card injects faults at its setting (past its hidden
limit) or hangs, or when `pin(device, setting)` says the rig load is too much for it (a shared power supply:
tighter than the card alone). `machine_event(call, settings)` injects a whole-machine event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tuner.backends.base import Backend
from tuner.core.errors import NotApplied
from tuner.tuning.events import TrialEvent, TrialProgress, TrialResult
from tuner.tuning.plan import EDGE_KINDS
from tuner.tuning.trial import TrialOutcome, TrialParams
from tuner.tuning.trial import run_trial as real_run_trial  # bound now: tests replace the module's with this fake


@dataclass
class FakeRigTrial:
    pin: Callable[[str, int], bool] | None = None
    pin_kind: str = "mismatch"  # how a pinned card fails: mismatch (its own figures), or hang, device-lost, ... (edges)
    machine_event: Callable[[int, dict], str | None] | None = None
    on_start: Callable[[dict, TrialParams], None] | None = None
    collective: str | None = "gloo"  # what the ranks report they used (the simulated cards' engines: gloo)
    calls: list[tuple[dict, TrialParams]] = field(default_factory=list)

    def __call__(self, backend: Backend, settings: Mapping[str, int], params: TrialParams,
                 on_event: Callable[[TrialEvent], None] | None, stop: threading.Event, *,
                 engine_factory: object = None, kernel_watcher_factory: object = None) -> TrialOutcome:
        if len(settings) == 1:  # a card's own search: the real trial (the fake engine stands in for the CPU engine)
            return real_run_trial(backend, settings, params, on_event, stop, engine_factory=engine_factory,
                                  kernel_watcher_factory=kernel_watcher_factory)
        emit = on_event or (lambda ev: None)
        self.calls.append((dict(settings), params))
        touched: list[str] = []
        try:
            for device_id, setting in settings.items():
                touched.append(device_id)
                knob = backend.apply(device_id, setting)
                if knob.current != setting:
                    raise NotApplied(f"{device_id} reads back {knob.current}", "reset")
                backend.note_load(device_id, True)
            if self.on_start:
                self.on_start(dict(settings), params)
            if stop.is_set():
                return TrialOutcome({}, stopped=True)
            results: dict[str, TrialResult] = {}
            for device_id, setting in settings.items():
                knob = backend.knob(device_id)
                target = backend.stress_target(device_id)
                emit(TrialProgress(setting=setting, phase=params.phase, elapsed_s=params.duration_s,
                                   duration_s=params.duration_s, eta_s=0.0, step=60, device=device_id))
                common = {"setting": setting, "unit": knob.unit, "phase": params.phase, "steps": 60,
                          "duration_s": params.duration_s, "tok_s": 1000.0, "power_w": 250.0, "simulated": True}
                ref = (params.reference_paths or {}).get(device_id)
                if params.record_paths:
                    params.record_paths[device_id].write_text('{"steps": 1000}')
                if params.reference_paths is not None and (ref is None or not ref.exists()):
                    results[device_id] = TrialResult(verdict="error", kind="setup", reason="no reference", **common)
                elif target.hang:
                    results[device_id] = TrialResult(verdict="fail", kind="hang", reason="no heartbeat",
                                                     fault_step=3, edge=True, **common)
                elif target.fault_rate > 0:
                    results[device_id] = TrialResult(verdict="fail", kind="mismatch", reason="loss bits differ",
                                                     fault_step=2 + int(target.fault_rate * 10), **common)
                elif self.pin and self.pin(device_id, setting):
                    edge = self.pin_kind in EDGE_KINDS  # a hang, a reset, a lost device: as the real trial marks it
                    what = "loss bits differ" if self.pin_kind == "mismatch" else self.pin_kind
                    results[device_id] = TrialResult(verdict="fail", kind=self.pin_kind, reason=f"{what} under the "
                                                     "rig load", fault_step=7, edge=edge, **common)
                else:
                    results[device_id] = TrialResult(verdict="pass", tok_per_j=4.0, **common)
            event = self.machine_event(len(self.calls), dict(settings)) if self.machine_event else None
            if event:
                results = {d: TrialResult(**{**r.to_record(), "verdict": "fail", "kind": "machine",
                                             "reason": event, "kernel_log": (), "warnings": (), "pstates": (),
                                             "throttle_reasons": ()})
                           for d, r in results.items()}
                return TrialOutcome(results, (), event, collective=self.collective)
            steps = {d: r.fault_step for d, r in results.items() if r.verdict == "fail" and r.fault_step}
            first = min(steps.values(), default=None)
            return TrialOutcome(results, tuple(d for d, s in steps.items() if s == first), None,
                                  collective=self.collective)
        finally:
            for device_id in touched:
                backend.note_load(device_id, False)
                if backend.reset(device_id).current != backend.knob(device_id).stock:
                    raise NotApplied(f"{device_id} did not return to stock", "reboot")


class PeerGone(Exception):
    pass


class _Collective:
    """Lockstep like an all-reduce: the collective for step n completes when every rank arrived (even if one leaves
    right after); a rank that left makes every later collective fail at once; a stalled one, after `timeout_s`."""

    def __init__(self, ranks: int, timeout_s: float):
        self.ranks, self.timeout_s = ranks, timeout_s
        self._cond = threading.Condition()
        self._arrived: dict[int, int] = {}
        self._gone = False

    def wait(self, n: int) -> None:
        with self._cond:
            self._arrived[n] = self._arrived.get(n, 0) + 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._arrived[n] >= self.ranks or self._gone, self.timeout_s)
            if self._arrived[n] < self.ranks:
                raise PeerGone

    def leave(self) -> None:
        with self._cond:
            self._gone = True
            self._cond.notify_all()


class FakeGroupEngine:
    """A stand-in for the engines of one data-parallel group (`engine_factory` of the real `run_trial`), as
    strict as the real thing, whose behaviour it copies (real gloo, measured: tests/engine/test_data_parallel.py):

    - the ranks step in lockstep (a barrier per step, like the all-reduce); a rank whose peer is gone or stopped
      ends promptly with verdict error, kind `peer` (gloo: "Connection closed by peer"), or after
      `--collective-timeout-s` when the peer only stalls;
    - a rank whose simulated card injects faults fails at step 2 + 10 x the rate with figure `loss` (its own
      computation); a peer that took part in that step's all-reduce fails at the same step with figure `state`;
    - a card that hangs: its rank goes silent at step 3 and the client's watchdog ends it (fail, hang); the peers
      wait in the collective;
    - `stop()` ends a rank with error/stopped (SIGTERM); `result(timeout)` raises TimeoutError while it runs;
    - a passing recording writes its reference file; a rank never sees its peers' references.
    `crash_rank` dies (SIGKILL) at `crash_step`; `on_start(request)` runs as each rank starts.
    """

    def __init__(self, *, step_s: float = 0.01, crash_rank: int | None = None, crash_step: int = 3,
                 on_start: Callable[[object], None] | None = None):
        self.step_s, self.crash_rank, self.crash_step, self.on_start = step_s, crash_rank, crash_step, on_start
        self.runs: list[_GroupRun] = []
        self._barrier: _Collective | None = None
        self._lock = threading.Lock()
        self.fail_steps: dict[int, int | None] = {}  # rank -> the step its card's injected fault lands on

    def __call__(self, request, watchdog):
        from tuner.tuning import engine_client as sc

        assert isinstance(request, sc.EngineConfig) and isinstance(watchdog, sc.WatchdogPolicy)
        o = request.options
        with self._lock:
            if self._barrier is None:
                self._barrier = _Collective(o.world_size, o.collective_timeout_s)
        run = _GroupRun(self, request, watchdog)
        self.runs.append(run)
        return run


class _GroupRun:
    def __init__(self, group: FakeGroupEngine, request, watchdog):
        self.group, self.request, self.watchdog = group, request, watchdog
        self._stopped = threading.Event()
        self._done = threading.Event()
        self._result = None
        self.started = False

    def start(self):
        self.started = True
        if self.group.on_start:
            self.group.on_start(self.request)
        return self

    def stop(self) -> None:
        self._stopped.set()
        barrier = self.group._barrier
        if barrier is not None:
            barrier.leave()  # the rank's process ends: its sockets close, the peers' collectives fail

    def _end(self, verdict, kind, reason, steps, step=None, figure=None):
        from tests.tuning.fake_engine import event, result

        res = result(verdict, kind, reason, steps=steps, failure_step=step, reference_step=step,
                     median_tok_s=1000.0 if verdict != "error" else None)
        self._result = res
        end = None
        if kind not in ("hang", "crash"):
            end = event("end", verdict=verdict, kind=kind, reason=reason, step=step, steps=steps,
                        exit_code={"pass": 0, "fail": 1}.get(verdict, 2), figure=figure,
                        median_tok_s=res.median_tok_s)
        self._done.set()
        return end

    def events(self):
        from tests.tuning.fake_engine import event

        o = self.request.options
        barrier = self.group._barrier
        assert barrier is not None
        dp = {"world_size": o.world_size, "rank": o.rank, "backend": "gloo", "library": "gloo", "collectives": 0,
              "collective_s": 0.0}
        yield event("start", device=o.device, preset=o.preset, mode=o.mode, seed=o.seed, steps=o.steps,
                    duration_s=o.duration_s, fault_rate=o.fault_rate, fault_seed=o.effective_fault_seed,
                    injections=[str(i) for i in o.injections], record=o.record, data_parallel=dp)
        fail_step = 2 + int(o.fault_rate * 10) if o.fault_rate > 0 else None
        hang = any(i.kind == "hang" for i in o.injections)
        bound = o.steps or max(1, int((o.duration_s or 1.0) / self.group.step_s))
        self.group.fail_steps[o.rank] = fail_step  # seen by every rank after the first step's collective
        step = 0
        while True:
            if self._stopped.is_set():
                end = self._end("error", "stopped", "interrupted by SIGTERM", step)
                break
            if step >= bound:
                if o.record:
                    Path(o.record).write_text(f'{{"steps": {step}}}')
                end = self._end("pass", None, f"completed {step} steps", step)
                barrier.leave()
                break
            if hang and step + 1 == 3:
                self._stopped.wait(self.watchdog.min_silence_s)  # silent until the watchdog's SIGKILL
                barrier.leave()
                end = self._end("fail", "hang", "hang after step 2: no output", 2, step=3)
                break
            if self.group.crash_rank == o.rank and step + 1 == self.group.crash_step:
                barrier.leave()
                end = self._end("fail", "crash", f"the engine died of SIGKILL after step {step}", step, step=step + 1)
                break
            try:
                barrier.wait(step + 1)  # the step's all-reduce
            except PeerGone:
                if self._stopped.is_set():  # its own SIGTERM: the engine reports that, not the collective it broke
                    end = self._end("error", "stopped", "interrupted by SIGTERM", step)
                    break
                end = self._end("error", "peer", "peer stalled: a collective failed (Connection closed by peer)",
                                step)
                break
            step += 1
            first = min((s for s in self.group.fail_steps.values() if s is not None), default=None)
            if step == first:  # a card's fault this step: its own figures, the others' state (the all-reduce)
                figure = "loss" if fail_step == step else "state"
                yield event("fault", kind="mismatch", step=step, reference_step=step, detail=f"{figure} differs",
                            figure=figure)
                end = self._end("fail", "mismatch", f"step {step}: {figure} differs", step, step=step,
                                figure=figure)
                barrier.leave()
                break
            yield event("step", step=step, loss=5.0, grad_norm=1.0, dt_ms=self.group.step_s * 1e3, tok_s=1000.0,
                        tflops=None)
            time.sleep(self.group.step_s)
        if end is not None:
            yield end

    def result(self, timeout: float | None = None):
        if not self._done.wait(timeout):
            raise TimeoutError("the engine is still running")
        return self._result
