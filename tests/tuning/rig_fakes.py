"""A stand-in for `tuner.tuning.rig_trial.run_rig_trial` (h-dp's data-parallel trial), as the rig driver's tests
need it: fast, deterministic, and never kinder than the real one.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tuner.backends.base import Backend
from tuner.core.errors import NotApplied
from tuner.tuning.events import TrialEvent, TrialProgress, TrialResult
from tuner.tuning.rig_trial import RigTrialParams, RigTrialResult


@dataclass
class FakeRigTrial:
    pin: Callable[[str, int], bool] | None = None
    machine_event: Callable[[int, dict], str | None] | None = None
    on_start: Callable[[dict, RigTrialParams], None] | None = None
    calls: list[tuple[dict, RigTrialParams]] = field(default_factory=list)

    def __call__(self, backend: Backend, settings: Mapping[str, int], params: RigTrialParams,
                 on_event: Callable[[TrialEvent], None] | None, stop: threading.Event, *,
                 engine_factory: object = None, kernel_watcher_factory: object = None) -> RigTrialResult:
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
                return RigTrialResult({}, (), None, stopped=True)
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
                    results[device_id] = TrialResult(verdict="fail", kind="mismatch", reason="loss bits differ "
                                                     "under the rig load", fault_step=7, **common)
                else:
                    results[device_id] = TrialResult(verdict="pass", tok_per_j=4.0, **common)
            event = self.machine_event(len(self.calls), dict(settings)) if self.machine_event else None
            if event:
                results = {d: TrialResult(**{**r.to_record(), "verdict": "fail", "kind": "machine",
                                             "reason": event, "kernel_log": (), "warnings": (), "pstates": (),
                                             "throttle_reasons": ()})
                           for d, r in results.items()}
                return RigTrialResult(results, (), event)
            steps = {d: r.fault_step for d, r in results.items() if r.verdict == "fail" and r.fault_step}
            first = min(steps.values(), default=None)
            return RigTrialResult(results, tuple(d for d, s in steps.items() if s == first), None)
        finally:
            for device_id in touched:
                backend.note_load(device_id, False)
                if backend.reset(device_id).current != backend.knob(device_id).stock:
                    raise NotApplied(f"{device_id} did not return to stock", "reboot")
