"""A stand-in for `tuner.tuning.engine_client.StressRun`, fast and deterministic, for driver tests.

Fails (kind "mismatch", at step 2 + 10 x the fault rate) whenever the simulated card injects faults, hangs when
it says so; with `software_fault`, every trial after the baseline fails the way it says (a fault that is the
software's, not the card's). Records every request it was given.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace


@dataclass
class FakeEngine:
    requests: list = field(default_factory=list)
    tok_s: float = 1000.0
    on_start: object = None  # callable(request) run when a trial starts (tests use it to kill/stop)
    error: bool = False
    # request -> (kind, failing step, reference step) for every trial that does not record; None: no such fault
    software_fault: object = None
    # request -> steps a passing run makes (default 60: past the driver's minimum of compared steps)
    steps: object = None
    # request -> a result that replaces the run's (an engine killed from outside, ...); None: run normally
    override: object = None

    def __call__(self, request: dict, watchdog):
        self.requests.append(request)
        return _FakeRun(self, request)


class _FakeRun:
    def __init__(self, engine: FakeEngine, request: dict):
        self.engine, self.request = engine, request
        self._stopped = threading.Event()
        self._result = None

    def start(self) -> None:
        if self.engine.on_start:
            self.engine.on_start(self.request)

    def events(self):
        r = self.request
        yield SimpleNamespace(event="start", pci_bus_id=None, repeatable=True)
        n = self.engine.steps(r) if self.engine.steps else 60
        if self.engine.override and (forced := self.engine.override(r)) is not None:
            self._result = forced
            return
        fail_step = None
        if r["fault_rate"] > 0:
            fail_step = 2 + int(r["fault_rate"] * 10)
        hang = any(i.startswith("hang@") for i in r["injections"])
        if self.engine.software_fault and not r.get("record"):
            kind, step, ref_step = self.engine.software_fault(r)
            self._result = SimpleNamespace(verdict="fail", kind=kind, reason=f"{kind} at step {step}",
                                           failure_step=step, reference_step=ref_step, steps=step, duration_s=1.0,
                                           median_tok_s=self.engine.tok_s, sensitivity="full")
            return
        for step in range(1, n + 1):
            if self._stopped.is_set():
                self._result = SimpleNamespace(verdict="error", kind="stopped", reason="stopped", failure_step=None,
                                               steps=step, duration_s=0.1, median_tok_s=None, sensitivity="full")
                return
            if hang and step == 3:
                self._result = SimpleNamespace(verdict="fail", kind="hang", reason="no heartbeat", failure_step=3,
                                               steps=3, duration_s=1.0, median_tok_s=self.engine.tok_s,
                                               sensitivity="full")
                return
            if fail_step is not None and step == fail_step:
                self._result = SimpleNamespace(verdict="fail", kind="mismatch", reason="loss bits differ",
                                               failure_step=step, steps=step, duration_s=1.0,
                                               median_tok_s=self.engine.tok_s, sensitivity="full")
                return
            yield SimpleNamespace(event="step", step=step, tok_s=self.engine.tok_s)
        if self.engine.error:
            self._result = SimpleNamespace(verdict="error", kind="setup", reason="out of memory", failure_step=None,
                                           steps=0, duration_s=0.1, median_tok_s=None, sensitivity=None)
            return
        if r.get("record"):
            from pathlib import Path

            Path(r["record"]).write_text('{"steps": 1000}')
        self._result = SimpleNamespace(verdict="pass", kind=None, reason="", failure_step=None, steps=n,
                                       duration_s=r["duration_s"], median_tok_s=self.engine.tok_s,
                                       sensitivity="full")

    def stop(self) -> None:
        self._stopped.set()

    def result(self):
        return self._result
