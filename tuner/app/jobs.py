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
    return _available("tuner.tuning.engine_client")


def bisect_available() -> bool:
    return _available("tuner.tuning.job")


def pending_change(backend, device_id: str, value: int, *, timeout_s: float, clock: Callable[[], float]):
    """A keep-or-revert change (tuner.actions.keep_or_revert), not yet applied."""
    from tuner.actions.keep_or_revert import PendingChange

    return PendingChange(backend, device_id, value, timeout_s=timeout_s, clock=clock)


MANUAL_STRESS_S = 3600.0  # a stress run from the Tune screen lasts until stopped, at most an hour


def engine_run(target, *, duration_s: float, preset: str, mode: str):
    """A StressRun for `target` (a StressTarget), requested as every engine run is (engine_client.engine_request)."""
    from tuner.tuning import engine_client as stress_client
    config = stress_client.engine_request(target, duration_s=duration_s, preset=preset, mode=mode)
    return stress_client.StressRun(config)


class StressJob:
    """One stress run at the card's current setting. `note_load` brackets the run; the card is left as it was."""

    def __init__(self, backend, device_id: str, *, preset: str, mode: str, emit: Callable[[object], None],
                 duration_s: float = MANUAL_STRESS_S):
        self.backend, self.device_id = backend, device_id
        self.preset, self.mode, self.emit, self.duration_s = preset, mode, emit, duration_s
        self._run = None
        self._stop = threading.Event()
        self._done = threading.Event()

    def run(self) -> str:
        try:
            result = self.run_on(self.backend.stress_target(self.device_id))
            return describe_stress_result(result, stopped=self._stop.is_set())
        finally:
            self._done.set()

    def run_on(self, target):
        """Run the engine on `target` with the device marked as loaded; returns the StressResult."""
        self._run = engine_run(target, duration_s=self.duration_s, preset=self.preset, mode=self.mode)
        if self._stop.is_set():
            return None
        self.backend.note_load(self.device_id, True)
        try:
            self._run.start()
            if self._stop.is_set():
                self._run.stop()
            for event in self._run.events():
                self.emit(event)
            return self._run.result()
        finally:
            self._run.stop()
            self.backend.note_load(self.device_id, False)

    def verify_runner(self, target, duration_s: float, on_line):
        """tuner.profiles.verify's StressRunner shape: (target, duration_s, on_line) -> (verdict, reason)."""
        self.duration_s = duration_s
        result = self.run_on(target)
        if result is None:
            return "error", "stopped before it started"
        return result.verdict, result.reason

    def stop(self) -> None:
        self._stop.set()
        if self._run is not None:
            self._run.stop()

    def mark_done(self) -> None:
        self._done.set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


def describe_stress_result(result, *, stopped: bool) -> str:
    if result is None:
        return "stopped before it started"
    if stopped:
        return f"stopped by you after {result.steps} steps (no fault seen)" if result.verdict != "fail" else (
            f"FAIL ({result.reason}) before you stopped it")
    return f"{result.verdict.upper()}" + (f" ({result.reason})" if result.reason else "")


DETECTOR_OF_FAULT = {"mismatch": "reference", "canary": "canary", "gemm": "gemm", "nonfinite": "nonfinite",
                     "device-error": "device errors", "hang": "watchdog"}


def apply_stress_event(state, event) -> None:
    """Fold one engine event (tuner.tuning.engine_client) or a plain log line into the StressState the Tune screen shows."""
    if isinstance(event, str):
        state.write(event)
        return
    kind = type(event).__name__.removesuffix("Event").lower()
    if kind == "start":
        # A manual run has no recorded reference trajectory and no kernel-log watcher (bisect trials have both).
        for name, value in (("reference", "off"), ("canary", "ok"), ("gemm", "ok"), ("nonfinite", "ok"),
                            ("device errors", "ok"), ("watchdog", "ok"), ("kernel log", "off")):
            state.detectors[name] = value
        state.write(f"engine: {event.device_name or event.device} dtype {event.dtype} "
                    f"{event.params or 0:,} params, repeatable {event.repeatable}")
    elif kind == "step":
        if event.loss is not None and event.tok_s is not None:
            state.steps.append((event.step, event.loss, event.tok_s))
        if event.step % 10 == 0 and event.loss is not None:
            state.write(f"step {event.step:>5}  loss {event.loss:.4f}  {event.tok_s or 0:,.0f} tok/s")
    elif kind == "canary":
        state.detectors["canary"] = "ok" if event.ok is not False else "FAULT"
        if event.gemm_ok is False:
            state.detectors["gemm"] = "FAULT"
    elif kind == "fault":
        detector = DETECTOR_OF_FAULT.get(event.kind or "", event.kind or "fault")
        state.detectors[detector] = f"FAULT at step {event.step}"
        state.write(f"FAULT {event.kind} at step {event.step}: {event.detail}")
    elif kind == "warning":
        state.write(f"warning {event.kind}: {event.detail}")
    elif kind == "end":
        state.write(f"end: {event.verdict} {event.reason or ''} after {event.steps} steps"
                    + (f", median {event.median_tok_s:,.0f} tok/s" if event.median_tok_s else ""))
    elif kind == "log" and event.line:
        state.write(event.line)
    state.version += 1


def make_bisect_job(backend, device_id: str, params: dict, *, resume: bool, emit, restart: bool = False,
                    options: dict | None = None):
    from tuner.tuning import job as bisect_job
    bisect_params = bisect_job.BisectParams(**params, resume=resume, restart=restart)
    job = bisect_job.BisectJob(backend, device_id, bisect_params, emit, **(options or {}))
    return BisectRunner(job, device_id)


class BisectRunner:
    """tuner.tuning.job.BisectJob behind the same run/stop/wait shape as StressJob; keeps the outcome."""

    def __init__(self, job, device_id: str):
        self._job, self.device_id = job, device_id
        self.outcome = None
        self._done = threading.Event()

    def run(self):
        try:
            self.outcome = self._job.run()
            return self.outcome
        finally:
            self._done.set()

    def stop(self) -> None:
        self._job.stop()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


def describe_bisect_result(outcome) -> str:
    return "ended" if outcome is None else outcome.summary


def _result_row(result) -> dict:
    row = result.to_record()
    row["reason"] = result.reason or result.kind or ""
    return row


def apply_bisect_event(state, event) -> None:
    """Fold one tuner.tuning.events event into the BisectState the Auto-bisect screen shows."""
    kind = type(event).__name__
    if kind == "SessionStarted":
        state.unit = event.unit
        state.session = event.session
    elif kind == "TrialRecovered":
        state.trials.append(_result_row(event.result))
    elif kind == "TrialStarted":
        state.trials.append({"setting": event.setting, "phase": event.phase, "verdict": "running", "reason": ""})
        state.current = {"index": event.index, "total": event.expected_trials, "setting": event.setting,
                         "phase": event.phase,
                         "progress": 0.0, "eta_s": event.duration_s, "eta_total_s": None}
    elif kind == "TrialProgress" and state.current is not None:
        progress = min(1.0, event.elapsed_s / event.duration_s) if event.duration_s else 0.0
        state.current.update(progress=progress, eta_s=event.eta_s, eta_total_s=event.eta_total_s,
                             tok_s=event.tok_s, power_w=event.power_w)
    elif kind == "TrialFinished":
        row = _result_row(event.result)
        running = [r for r in state.trials if r.get("verdict") == "running" and r.get("setting") == row["setting"]]
        if running:
            running[-1].clear()
            running[-1].update(row)
        else:
            state.trials.append(row)
        if state.current is not None:
            state.current["progress"] = 1.0
    elif kind == "Recommendation":
        state.recommendation = event
    elif kind == "BisectFailed":
        state.failure = f"{event.kind}: {event.reason}"
    elif kind == "BisectStopped":
        state.failure = f"stopped ({event.reason})" + ("; u resumes" if event.resumable else "")
        for row in state.trials:
            if row.get("verdict") == "running":
                row.update(verdict="stopped", reason="stopped by you")
    elif kind == "TrialWarning":
        state.warnings.append(event.message)
    state.version += 1


def tuning_from_bisect(state) -> dict | None:
    """The `[tuning]` evidence for a profile saved from the bisect screen (BisectOutcome.tuning)."""
    outcome = getattr(state, "outcome", None)
    return outcome.tuning() if outcome is not None else None
