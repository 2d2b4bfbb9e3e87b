"""A stand-in for `tuner.tuning.engine_client.StressRun`, fast and deterministic, for driver tests.

Speaks the real types: its events are the engine's event dataclasses, made by the client's own parser
(`tuner.engine.events.decode_line`) from protocol lines checked against the engine's protocol (tuner/engine/events.py,
docs/engine.md), and its result is a `StressResult`. Fails (kind "mismatch", at step 2 + 10 x the fault rate)
whenever the simulated card injects faults, hangs when it says so; with `software_fault`, every trial after the
baseline fails the way it says (a fault that is the software's, not the card's). Records every request
(`EngineConfig`) it was given.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.engine.examples import EXAMPLES
from tuner.engine.events import EndEvent, Event, LogEvent, StartEvent, UnknownEvent, decode_line, validate
from tuner.tuning import engine_client as sc


def event(name: str, **fields) -> Event:
    """One protocol line, checked against the engine's protocol and read by the client's own parser."""
    unknown = set(fields) - set(EXAMPLES[name])
    assert not unknown, f"the engine never sends {name}.{unknown}"
    doc = {"event": name, "t": 0.0, **EXAMPLES[name], **fields}
    validate(doc)
    ev = decode_line(json.dumps(doc))
    assert not isinstance(ev, (UnknownEvent, LogEvent)), name
    return ev


def result(verdict: str, kind: str | None, reason: str, *, steps: int, failure_step: int | None = None,
           reference_step: int | None = None, duration_s: float | None = 1.0,
           median_tok_s: float | None = None, sensitivity: str | None = "full",
           end: EndEvent | None = None) -> sc.StressResult:
    return sc.StressResult(verdict, kind, reason, failure_step, steps, duration_s, median_tok_s, None,
                           exit_code=0 if verdict == "pass" else 1, sensitivity=sensitivity,
                           reference_step=reference_step, end=end)


@dataclass
class FakeEngine:
    requests: list[sc.EngineConfig] = field(default_factory=list)
    tok_s: float = 1000.0
    step_ms: float | None = 1.0  # the end event's median step time (None: an engine too old to say)
    on_start: object = None  # callable(request) run when a trial starts (tests use it to kill/stop)
    error: bool = False
    # request -> (kind, failing step, reference step) for every trial that does not record; None: no such fault
    software_fault: object = None
    runs: list[_FakeRun] = field(default_factory=list)
    # request -> (kind, failing step) for the baseline's replay (--verify-repeatable); None: it repeats
    replay_fault: object = None
    sensitivity: str = "full"  # what every result reports ("reduced": the engine compared with tolerances)
    # request -> steps a passing run makes (default 60: past the driver's minimum of compared steps)
    steps: object = None
    # request -> a result that replaces the run's (an engine killed from outside, ...); None: run normally
    override: object = None
    pci_bus_id: str | None = None  # the PCI bus id its start event reports (as a GPU engine's does)

    def __call__(self, request: sc.EngineConfig, watchdog: sc.WatchdogPolicy) -> _FakeRun:
        assert isinstance(request, sc.EngineConfig) and isinstance(watchdog, sc.WatchdogPolicy)
        self.requests.append(request)
        run = _FakeRun(self, request)
        self.runs.append(run)
        return run


class _FakeRun:
    def __init__(self, engine: FakeEngine, request: sc.EngineConfig):
        self.engine, self.request = engine, request
        self._stopped = threading.Event()
        self._result: sc.StressResult | None = None
        self._start: Event | None = None
        self.started = False

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def start(self) -> None:
        self.started = True
        if self.engine.on_start:
            self.engine.on_start(self.request)

    def events(self):
        o = self.request.options
        self._start = event("start", device=o.device, preset=o.preset, mode=o.mode, seed=o.seed, steps=o.steps,
                    duration_s=o.duration_s, fault_rate=o.fault_rate, fault_seed=o.effective_fault_seed,
                    injections=[str(i) for i in o.injections], record=o.record,
                    pci_bus_id=self.engine.pci_bus_id)
        yield self._start
        # a run bound by steps makes that many (as the engine's --steps); else 60, past the minimum of compared steps
        n = self.engine.steps(self.request) if self.engine.steps else (o.steps if o.steps is not None else 60)
        if self.engine.override and (forced := self.engine.override(self.request)) is not None:
            self._result = forced
            return
        fail_step = 2 + int(o.fault_rate * 10) if o.fault_rate > 0 else None
        hang = any(i.kind == "hang" for i in o.injections)
        sens = self.engine.sensitivity
        replay = o.verify_repeatable
        if replay and self.engine.replay_fault and self.engine.replay_fault(self.request):
            kind, step = self.engine.replay_fault(self.request)
            self._result = result("fail", kind, f"{kind} at step {step}", failure_step=step, reference_step=step,
                                  steps=step, median_tok_s=self.engine.tok_s, sensitivity=sens)
            return
        fault = (self.engine.software_fault(self.request)
                 if self.engine.software_fault and not o.record and not replay else None)
        if fault:
            kind, step, ref_step = fault
            self._result = result("fail", kind, f"{kind} at step {step}", failure_step=step,
                                  reference_step=ref_step, steps=step, median_tok_s=self.engine.tok_s,
                                  sensitivity=sens)
            return
        for step in range(1, n + 1):
            if self._stopped.is_set():
                self._result = result("error", "stopped", "stopped", steps=step, duration_s=0.1, sensitivity=sens)
                return
            if hang and step == 3:
                self._result = result("fail", "hang", "no heartbeat", failure_step=3, steps=3,
                                      median_tok_s=self.engine.tok_s, sensitivity=sens)
                return
            if fail_step is not None and step == fail_step:
                yield event("fault", kind="mismatch", step=step, reference_step=step, detail="loss bits differ")
                self._result = result("fail", "mismatch", "loss bits differ", failure_step=step, steps=step,
                                      median_tok_s=self.engine.tok_s, sensitivity=sens)
                return
            yield event("step", step=step, loss=5.0, grad_norm=1.0, dt_ms=1.0, tok_s=self.engine.tok_s,
                        tflops=None)
        if self.engine.error:
            self._result = result("error", "setup", "out of memory", steps=0, duration_s=0.1, sensitivity=None)
            return
        if o.record:
            Path(o.record).write_text('{"steps": 1000}')
        took_s = o.duration_s if o.duration_s is not None else 1.0  # a run bound by steps (the replay)
        end = event("end", steps=n, duration_s=took_s, median_tok_s=self.engine.tok_s,
                    median_step_ms=self.engine.step_ms)
        yield end
        # the client keeps the end event in its result (engine_client.StressRun._summarise)
        assert isinstance(end, EndEvent)
        self._result = result("pass", None, "", steps=n, duration_s=took_s, median_tok_s=self.engine.tok_s,
                              sensitivity=self.engine.sensitivity, end=end)

    def stop(self) -> None:
        self._stopped.set()

    def result(self, timeout: float | None = None) -> sc.StressResult | None:
        if self._result is None or self._start is None:
            return self._result
        assert isinstance(self._start, StartEvent)  # the client keeps it in its result, as the end event
        return dataclasses.replace(self._result, start=self._start)
