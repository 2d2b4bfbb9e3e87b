"""The App's long jobs as plain Python: blocking `run()`, thread-safe `stop()`, events handed to `emit`.

No textual here: the App runs these in thread workers and turns `emit` into messages. The engine, bisect and
keep-or-revert modules are imported lazily, so the UI starts fast and works (with a clear "not available yet")
in a checkout where one of them has not landed.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable

NOT_AVAILABLE = "{what} is not available yet in this build (module missing); nothing was started"
VERIFY_DURATION_S = 300  # a profile proven on another card of the same model: a 5-minute trial before keeping it


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def stress_available() -> bool:
    return _available("tuner.stress_client")


def bisect_available() -> bool:
    return _available("tuner.bisect_job")


def pending_change(backend, device_id: str, value: int, *, timeout_s: float, clock: Callable[[], float]):
    """A keep-or-revert change (tuner.keep_or_revert), not yet applied."""
    from tuner.keep_or_revert import PendingChange

    return PendingChange(backend, device_id, value, timeout_s=timeout_s, clock=clock)


class StressJob:
    """One stress run at the card's current setting. `note_load` brackets the run; the card is left as it was."""

    def __init__(self, backend, device_id: str, *, preset: str, mode: str, emit: Callable[[object], None]):
        self.backend, self.device_id = backend, device_id
        self.preset, self.mode, self.emit = preset, mode, emit
        self._run = None
        self._stop = threading.Event()
        self._done = threading.Event()

    def run(self) -> str:
        from tuner import stress_client

        try:
            target = self.backend.stress_target(self.device_id)
            config = stress_client.config_for_target(target, preset=self.preset, mode=self.mode)
            self._run = stress_client.StressRun(config)
            if self._stop.is_set():
                return "stopped before it started"
            self.backend.note_load(self.device_id, True)
            try:
                self._run.start()
                for event in self._run.events():
                    self.emit(event)
                    if self._stop.is_set():
                        self._run.stop()
                result = self._run.result()
            finally:
                self.backend.note_load(self.device_id, False)
            return describe_stress_result(result, stopped=self._stop.is_set())
        finally:
            self._done.set()

    def stop(self) -> None:
        self._stop.set()
        if self._run is not None:
            self._run.stop()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


def describe_stress_result(result, *, stopped: bool) -> str:
    verdict = getattr(result, "verdict", None) or "ended"
    reason = getattr(result, "reason", None)
    text = f"{verdict}" + (f" ({reason})" if reason else "")
    return f"stopped by you; {text}" if stopped else text


def apply_stress_event(state, event) -> None:
    """Fold one engine event (or a plain log line) into the StressState the Tune screen shows."""
    if isinstance(event, str):
        state.write(event)
        return
    kind = type(event).__name__.removesuffix("Event").lower()
    if kind == "step":
        state.steps.append((event.step, event.loss, event.tok_s))
        if event.step % 10 == 0:
            state.write(f"step {event.step:>5}  loss {event.loss:.4f}  {event.tok_s:,.0f} tok/s")
    elif kind == "start":
        for name in ("reference", "canary", "gemm", "nonfinite", "kernel log"):
            state.detectors.setdefault(name, "ok")
        state.write(f"engine started: {_fields(event)}")
    elif kind == "canary":
        state.detectors["canary"] = "ok" if getattr(event, "ok", True) else "FAULT"
    elif kind == "fault":
        detector = {"mismatch": "reference", "device-error": "kernel log"}.get(event.kind, event.kind)
        state.detectors[detector] = f"FAULT at step {event.step}"
        state.write(f"FAULT {event.kind} at step {event.step}: {event.detail}")
    elif kind == "warning":
        state.write(f"warning: {_fields(event)}")
    elif kind == "end":
        state.write(f"end: {_fields(event)}")
    state.version += 1


def _fields(event) -> str:
    data = getattr(event, "__dict__", {}) or {}
    return ", ".join(f"{k}={v}" for k, v in data.items() if not isinstance(v, (dict, list)))[:200]


def make_bisect_job(backend, device_id: str, params: dict, *, resume: bool, emit):
    from tuner import bisect_job

    return BisectRunner(bisect_job, backend, device_id, params, resume=resume, emit=emit)


class BisectRunner:
    """tuner.bisect_job.BisectJob behind the same run/stop/wait shape as StressJob."""

    def __init__(self, module, backend, device_id: str, params: dict, *, resume: bool, emit):
        self.device_id = device_id
        bisect_params = module.BisectParams(**params, **({"resume": True} if resume else {}))
        self._job = module.BisectJob(backend, device_id, bisect_params, emit)
        self._done = threading.Event()

    def run(self):
        try:
            return self._job.run()
        finally:
            self._done.set()

    def stop(self) -> None:
        self._job.stop()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


def describe_bisect_result(result) -> str:
    if result is None:
        return "ended"
    for attr in ("summary", "reason", "verdict"):
        if getattr(result, attr, None):
            return str(getattr(result, attr))
    return "ended"


def apply_bisect_event(state, event) -> None:
    """Fold one bisect event into the BisectState the Auto-bisect screen shows."""
    kind = type(event).__name__
    data = dict(getattr(event, "__dict__", {}))
    if kind == "TrialStarted":
        row = {"setting": data.get("setting"), "verdict": "running", "reason": "", "phase": data.get("phase")}
        state.trials.append(row)
        state.current = {"index": data.get("index", len(state.trials)), "total": data.get("total"),
                         "setting": data.get("setting"), "progress": 0.0, "eta_s": None}
    elif kind == "TrialProgress" and state.current is not None:
        state.current.update({k: data[k] for k in ("progress", "eta_s", "elapsed_s") if k in data})
    elif kind == "TrialFinished":
        row = next((r for r in reversed(state.trials) if r["setting"] == data.get("setting")), None)
        if row is None:
            row = {"setting": data.get("setting")}
            state.trials.append(row)
        row.update(data)
    elif kind == "Recommendation":
        state.recommendation = event
    elif kind == "BisectFailed":
        state.failure = str(data.get("reason") or data)
    state.version += 1


def tuning_from_bisect(state) -> dict | None:
    """The `[tuning]` evidence for a profile saved from the bisect screen, from what the bisect reported."""
    rec = state.recommendation
    if rec is None:
        return None
    to_tuning = getattr(rec, "tuning", None)
    if callable(to_tuning):
        return to_tuning()
    if isinstance(to_tuning, dict):
        return to_tuning
    return None
