"""The App's long jobs as plain Python: blocking `run()`, thread-safe `stop()`, events handed to `emit`; and the
pure functions that fold their events into the UI's snapshots (tuner.app.state).

No textual here (the import contracts in pyproject.toml check it): the App runs these in thread workers and turns
`emit` into messages. The rules (what may be verified, which bisect may start) live in tuner.actions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from tuner.actions.keep_or_revert import PendingChange
from tuner.actions.profile_apply import ProfileApply, RigChange, verify_profile
from tuner.actions.stress import DetectorState, NoStockReference, RunStarted, StressRequest, StressSession
from tuner.app.state import BISECT_WARNINGS, HISTORY_SAMPLES, BisectState, CardState, StressState, appended
from tuner.backends.base import Backend
from tuner.core.models import Verdict
from tuner.engine.events import (
    CanaryEvent,
    EndEvent,
    FaultEvent,
    LogEvent,
    StartEvent,
    StepEvent,
    WarningEvent,
)
from tuner.tuning import kernel_log
from tuner.tuning.events import (
    BisectFailed,
    BisectStopped,
    Recommendation,
    RigConfirmFinished,
    RigConfirmStarted,
    RigRecommendation,
    SessionStarted,
    TrialFinished,
    TrialProgress,
    TrialRecovered,
    TrialStarted,
    TrialWarning,
)
from tuner.tuning.job import BisectJob, BisectOutcome

VERIFY_DURATION_S = 300  # a profile proven on another card of the same model: a 5-minute trial before keeping it
MANUAL_STRESS_S = 3600.0  # a stress run from the Tune screen lasts until stopped, at most an hour


Result = TypeVar("Result")  # what a job's run() returns: a summary line, or a bisect's outcome


class _Job(Generic[Result]):
    """The shape the App drives every long job through: `run()` blocks (on a worker thread) and sets `done` when
    it ends however it ends, `stop()` is thread-safe and may come before `run()`, `wait()` waits for the end."""

    def __init__(self, *device_ids: str) -> None:
        self.device_ids = device_ids  # every card the job may leave changed (make_safe resets them all)
        self.device_id = ",".join(device_ids)
        self._stop = threading.Event()
        self._done = threading.Event()

    def run(self) -> Result:
        try:
            return self._work()
        finally:
            self._done.set()

    def _work(self) -> Result:
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


def stress_question(backend: Backend, device_id: str, *, preset: str, mode: str) -> NoStockReference | None:
    """Why a stress run of this workload would start only with the user's consent (no stock reference and the
    card not at stock), else None. Reads the card and the reference cache (run it off the UI thread)."""
    session = StressSession(backend, StressRequest(device_id, preset=preset, mode=mode))
    try:
        session.reference_plan(backend.device(device_id), backend.stress_target(device_id))
    except NoStockReference as e:
        return e
    return None


class StressJob(_Job[str]):
    """One stress run at the card's current setting, through the stress action (tuner.actions.stress: the watchdog,
    canary, reference and kernel-log policy the CLI's `tuner stress` follows too). `without_reference`: the user
    chose to run without a stock reference (the Tune screen asked). Summed up in one line."""

    def __init__(self, backend: Backend, device_id: str, *, preset: str, mode: str, emit: Callable[[object], None],
                 without_reference: bool = False,
                 kernel_watcher_factory: Callable[[], kernel_log.KernelLogWatcher] | None = None,
                 reference_record_s: float | None = None) -> None:
        super().__init__(device_id)
        request = StressRequest(device_id, duration_s=MANUAL_STRESS_S, preset=preset, mode=mode,
                                without_reference=without_reference)
        self.emit = emit
        self.session = StressSession(backend, request, on_event=emit, kernel_watcher_factory=kernel_watcher_factory,
                                     reference_record_s=reference_record_s)

    def _work(self) -> str:
        if self._stop.is_set():
            return "stopped before it started"
        try:
            outcome = self.session.run()
        except NoStockReference as e:  # asked before starting; the card's setting or the cache changed since
            self.emit(f"not started: {e.message}")
            return "not started: no stock reference to compare with (press s again to be asked)"
        result = outcome.result
        if result is not None and not outcome.kernel_events and result.kind in CLIENT_FAULTS:
            # the engine wrote no `fault` for it (the watchdog's hang, a device error on its stderr): its detector
            # says so, as for the engine's own
            at = f" at step {result.failure_step}" if result.failure_step is not None else ""
            self.emit(DetectorState(DETECTOR_OF_FAULT[result.kind], f"FAULT{at}"))
        for line in outcome.checks_off():
            self.emit(f"this run was weaker: {line}")
        return outcome.summary()

    def stop(self) -> None:
        super().stop()
        self.session.stop()


class VerifyJob(_Job[str]):
    """A profile's verify, behind StressJob's shape: `tuner apply --verify`'s own action (its bundled reference,
    its lock clock, the journalled trial with its workload). Lines the trial reports are handed to `emit`."""

    def __init__(self, backend: Backend, plan: ProfileApply, duration_s: float, *,
                 emit: Callable[[str], None]) -> None:
        super().__init__(plan.device.id)
        self.backend, self.plan, self.duration_s, self.emit = backend, plan, duration_s, emit

    def _work(self) -> str:
        outcome = verify_profile(self.backend, self.plan, self.duration_s, on_line=self.emit, stop_event=self._stop)
        summary = f"verify {outcome.verdict}" + (f" ({outcome.reason})" if outcome.reason else "")
        return summary + ("; kept" if outcome.passed else f"; reverted to {outcome.knob.current:+d}")


DETECTOR_OF_FAULT = {"mismatch": "reference", "canary": "canary", "gemm": "gemm", "nonfinite": "nonfinite",
                     "device-error": "device errors", "hang": "watchdog"}
CLIENT_FAULTS = ("hang", "device-error")  # faults the client finds (tuner.tuning.engine_client), not the engine
# The engine's own detectors at the start of a run; the reference and the kernel log are the job's (DetectorState).
MANUAL_DETECTORS = (("reference", "off"), ("canary", "ok"), ("gemm", "ok"), ("nonfinite", "ok"),
                    ("device errors", "ok"), ("watchdog", "ok"), ("kernel log", "off"))
JOB_DETECTORS = ("reference", "kernel log")


def apply_stress_event(state: StressState, event: object) -> StressState:
    """The StressState after one engine event (tuner.tuning.engine_client) or a plain log line."""
    match event:
        case str():
            return state.written(event)
        case DetectorState():
            return state.with_detector(event.name, event.value)
        case RunStarted(purpose="reference"):
            return replace(state, steps=()).written("engine: recording this card's stock reference")
        case RunStarted():
            return replace(state, steps=()).written("engine: the stress run")
        case StartEvent():
            known = {name: state.detector(name) for name in JOB_DETECTORS if state.detector(name) != "-"}
            return replace(state, detectors=tuple({**dict(MANUAL_DETECTORS), **known}.items())).written(
                f"engine: {event.device_name or event.device} dtype {event.dtype} {event.params or 0:,} params, "
                f"repeatable {event.repeatable}")
        case StepEvent():
            if event.loss is not None and event.tok_s is not None:
                state = replace(state, steps=appended(state.steps, (event.step, event.loss, event.tok_s),
                                                      limit=HISTORY_SAMPLES))
            if event.step % 10 == 0 and event.loss is not None:
                state = state.written(f"step {event.step:>5}  loss {event.loss:.4f}  {event.tok_s or 0:,.0f} tok/s")
            return state
        case CanaryEvent():
            state = state.with_detector("canary", "ok" if event.ok is not False else "FAULT")
            return state.with_detector("gemm", "FAULT") if event.gemm_ok is False else state
        case FaultEvent():
            detector = DETECTOR_OF_FAULT.get(event.kind or "", event.kind or "fault")
            return state.with_detector(detector, f"FAULT at step {event.step}").written(
                f"FAULT {event.kind} at step {event.step}: {event.detail}")
        case WarningEvent():
            return state.written(f"warning {event.kind}: {event.detail}")
        case EndEvent():
            median = f", median {event.median_tok_s:,.0f} tok/s" if event.median_tok_s else ""
            if state.stopping and event.verdict != Verdict.FAIL:
                return state.written(f"stopped by you after {event.steps} steps (no fault seen){median}")
            return state.written(f"end: {event.verdict} {event.reason or ''} after {event.steps} steps{median}")
        case LogEvent(line=line) if line:
            return state.written(line)
    return state


class BisectRunner(_Job[BisectOutcome]):
    """A bisect of one card or several at once behind the same run/stop/wait shape as StressJob; keeps the outcome.

    `prepare` (tuner.actions.bisect.prepare_bisect) runs first, in the worker: it reads the cards and may refuse
    (raising before anything was touched). A stop asked for before the job exists is passed on when it does."""

    def __init__(self, prepare: Callable[[], BisectJob], device_ids: tuple[str, ...],
                 on_prepared: Callable[[], None] | None = None) -> None:
        super().__init__(*device_ids)
        self._prepare = prepare
        self._on_prepared = on_prepared  # runs once the bisect was accepted, before its first event
        self._job: BisectJob | None = None
        self._pausing = False  # Ctrl-Z (TunerApp.make_safe_to_stop): passed on to the job when it exists
        self.outcome: BisectOutcome | None = None

    @property
    def accepted(self) -> bool:
        """`prepare` passed: the bisect got past its checks (before it, a refusal touched nothing)."""
        return self._job is not None

    def _work(self) -> BisectOutcome:
        self._job = self._prepare()
        if self._on_prepared is not None:
            self._on_prepared()
        if self._stop.is_set():
            self._job.stop()
        if self._pausing:  # a Ctrl-Z came while `prepare` ran
            self._job.pause()
        self.outcome = self._job.run()
        return self.outcome

    def stop(self) -> None:
        super().stop()
        if self._job is not None:
            self._job.stop()

    def pause(self) -> None:
        """Ctrl-Z: the job's running trials end without a result, their cards at stock (BisectJob.pause)."""
        self._pausing = True
        if self._job is not None:
            self._job.pause()

    def paused_safely(self) -> bool:
        """No trial is running (before the job exists, none can be)."""
        return self._job is None or self._job.paused_safely()

    def resume(self) -> None:
        self._pausing = False
        if self._job is not None:
            self._job.resume()


def describe_bisect_result(outcome: BisectOutcome | None) -> str:
    """The end in one line: one card's summary; several: the status and each card's final setting or why none."""
    if outcome is None:
        return "ended"
    if len(outcome.per_card) == 1:
        return outcome.card.summary
    if outcome.status == "stopped":
        return "stopped; every card is back at stock, u resumes it"
    parts = [f"{d} {v:+d}" for d, v in outcome.settings.items()]
    parts += [f"{d} none" for d in outcome.reasons if d not in outcome.settings]
    return f"{outcome.status}" + (f": {', '.join(parts)}" if parts else "")


RIG_ATTEMPTS = 20  # rig runs kept for the screen (at most MAX_RIG_ATTEMPTS + the recording at stock in practice)
CARD_DONE = (Recommendation, BisectFailed, BisectStopped)


def apply_bisect_event(state: BisectState, event: object, *, now_s: float | None = None) -> BisectState:
    """The BisectState after one event of a BisectJob: a card's event goes to that card's CardState, the rig's own
    events (device "rig") to the confirmation rows."""
    match event:
        case RigConfirmStarted():
            row = {"attempt": event.attempt, "phase": event.phase, "settings": dict(event.settings),
                   "verdict": "running", "duration_s": event.duration_s, "started_s": now_s}
            return replace(state, current=row, units={**state.units, **event.unit_by_device},
                           attempts=appended(state.attempts, row, limit=RIG_ATTEMPTS))
        case RigConfirmFinished():
            row = {"attempt": event.attempt, "phase": event.phase, "verdict": "pass" if event.passed else "fail",
                   "pinned": tuple(event.pinned), "machine_event": event.machine_event,
                   "backed_off": dict(event.backed_off), "reasons": dict(event.reasons)}
            return replace(state, current=None, attempts=_finish_row(state.attempts, row, "phase", merge=True))
        case RigRecommendation():
            return replace(state, settings=dict(event.settings), current=None)
        case TrialProgress() if state.current is not None and event.device in state.device_ids:
            # the rig run's progress (its cards were written when the first one arrives)
            return replace(state, current={**state.current, "ticks": state.current.get("ticks", 0) + 1})
    device = getattr(event, "device", "")
    if device in state.device_ids:
        card = apply_card_event(state.card(device), event, now_s=now_s)
        if isinstance(event, CARD_DONE):  # this card's search ended; the others may still run
            card = replace(card, running=False, current=None)
        units = {**state.units, device: card.unit} if card.unit else state.units
        return replace(state, cards={**state.cards, device: card}, units=units)
    if isinstance(event, TrialWarning):
        return replace(state, warnings=appended(state.warnings, event.message, limit=BISECT_WARNINGS))
    return state


def bisect_may_have_changed_cards(before: BisectState, after: BisectState) -> bool:
    """A trial or a rig run started, was applied (its first progress report), finished, or a search stopped: a
    card's setting may differ from what was last read."""
    cur = after.current or {}
    return any(card_may_have_changed(before.card(d), after.card(d)) for d in after.device_ids) or (
        (before.current is None) != (after.current is None) or cur.get("ticks") == 1)


@dataclass(frozen=True)
class EarlierTrials:
    """A resumed session's trials from before the resume (the journal's records): the table shows them all."""

    records: tuple
    device: str = ""  # the card (a rig resumes every card's session)


def unfinished_session(device_id: str) -> BisectState | None:
    """The card's unfinished bisect session (its journal), as the Bisect screen shows it before anything ran in
    this App: its trials so far and what continues it. None when it has none, or when its journal cannot be read
    (a start then refuses and says why: that is where a damaged journal is explained)."""
    from tuner.actions.safety_files import unfinished_session_trials

    trials = unfinished_session_trials(device_id)
    if trials is None:
        return None
    state = apply_bisect_event(BisectState(device_ids=(device_id,)), EarlierTrials(trials, device=device_id))
    return replace(state, unfinished=f"{len(trials)} trials done; u continues it, n starts afresh")


def _record_row(record: Mapping[str, object]) -> dict:
    row = dict(record)
    row["reason"] = record.get("reason") or record.get("kind") or ""
    return row


def _finish_row(rows: tuple, row: dict, key: str, *, merge: bool = False) -> tuple:
    """`rows` with the last running row whose `key` is `row`'s replaced by `row` (`merge`: updated with it, keeping
    what only the running row says), or `row` appended when there is none: a trial's result, a rig run's end."""
    for i in range(len(rows) - 1, -1, -1):
        if rows[i].get("verdict") == "running" and rows[i].get(key) == row[key]:
            return (*rows[:i], {**rows[i], **row} if merge else row, *rows[i + 1:])
    return (*rows, row)


def apply_card_event(state: CardState, event: object, *, now_s: float | None = None) -> CardState:
    """One card's CardState after one tuner.tuning.events event. `now_s` (monotonic seconds) times each trial from
    its start to the next one's, set-up and reset included, so the ETA comes from what trials really took."""
    match event:
        case SessionStarted():
            return replace(state, unit=event.unit, session=event.session)
        case EarlierTrials():
            return replace(state, trials=(*(_record_row(r) for r in event.records), *state.trials))
        case TrialRecovered():
            return replace(state, trials=(*state.trials, _record_row(event.result.to_record())))
        case TrialStarted():
            state = _timed_start(state, event.duration_s, now_s)
            row = {"setting": event.setting, "phase": event.phase, "verdict": "running", "reason": ""}
            current = {"index": event.index, "total": event.expected_trials, "setting": event.setting,
                       "phase": event.phase, "progress": 0.0,
                       "eta_s": round(event.duration_s * wall_factor(state), 1), "eta_total_s": None}
            return replace(state, trials=(*state.trials, row), current=current, unit=state.unit or event.unit)
        case TrialProgress() if state.current is not None:
            progress = min(1.0, event.elapsed_s / event.duration_s) if event.duration_s else 0.0
            eta_s, eta_total_s = measured_eta_s(state, event, now_s)
            return replace(state, current={**state.current, "progress": progress, "eta_s": eta_s,
                                           "finishing": event.finishing, "eta_total_s": eta_total_s,
                                           "ticks": state.current.get("ticks", 0) + 1})
        case TrialFinished():
            return replace(state, trials=_finish_row(state.trials, _record_row(event.result.to_record()), "setting"),
                           current=None if state.current is None else {**state.current, "progress": 1.0})
        case Recommendation():
            return replace(state, recommendation=event)
        case BisectFailed():
            return replace(state, failure=f"{event.kind}: {event.reason}")
        case BisectStopped():
            trials = tuple({**r, "verdict": "stopped", "reason": "stopped by you"} if r.get("verdict") == "running"
                           else r for r in state.trials)
            why = "stopped by you" if event.reason == "stopped on request" else f"stopped ({event.reason})"
            return replace(state, trials=trials, failure=why + ("; u resumes it" if event.resumable else ""))
        case TrialWarning():
            return replace(state, warnings=appended(state.warnings, event.message, limit=BISECT_WARNINGS))
    return state


def _timed_start(state: CardState, duration_s: float, now_s: float | None) -> CardState:
    """Close the previous trial's wall-clock measurement (start to this start: set-up, trial and reset)."""
    if now_s is None:
        return state
    if state.trial_started_s is not None and state.trial_nominal_s:
        state = replace(state, measured=(*state.measured, (now_s - state.trial_started_s, state.trial_nominal_s)))
    return replace(state, trial_started_s=now_s, trial_nominal_s=duration_s)


def wall_factor(state: CardState) -> float:
    """Measured wall seconds per nominal trial second (1.0 until a trial was measured): engine start-up, the
    reference check and the reset between trials all cost time the trial's own duration does not count."""
    wall_s = sum(w for w, _ in state.measured)
    nominal_s = sum(n for _, n in state.measured)
    return max(1.0, wall_s / nominal_s) if nominal_s > 0 else 1.0


def measured_eta_s(state: CardState, event: TrialProgress, now_s: float | None) -> tuple[float, float | None]:
    """(this trial, the whole bisect) in seconds, scaled by what earlier trials really took."""
    factor = wall_factor(state)
    if now_s is not None and state.trial_started_s is not None:
        eta_s = max(0.0, (state.trial_nominal_s or event.duration_s) * factor - (now_s - state.trial_started_s))
    else:
        eta_s = event.eta_s * factor
    rest_s = None if event.eta_total_s is None else max(0.0, event.eta_total_s - event.eta_s) * factor
    return round(eta_s, 1), (None if rest_s is None else round(eta_s + rest_s, 1))


def card_may_have_changed(before: CardState, after: CardState) -> bool:
    """A trial started, was applied (its first progress report), finished, or the bisect stopped: the card's
    setting may differ from what was last read."""
    b, a = before.current or {}, after.current or {}
    return (a.get("index"), a.get("phase")) != (b.get("index"), b.get("phase")) or (
        a.get("ticks") == 1 and b.get("ticks") != 1) or a.get("progress") == 1.0 != b.get("progress") or (
        before.failure != after.failure)


# --- a change waiting for keep-or-revert: one card (PendingChange) or a whole rig (RigChange) ----------------------
RESULT_NAME = "bisect-result"  # the unsaved ALL CARDS result's profile name: internal, never shown as a name


def profile_words(name: str) -> str:
    """A rig profile as the UI says it: its quoted name, or "the bisect's result" for the unsaved one."""
    return "the bisect's result" if name == RESULT_NAME else repr(name)


def keep_question(pending: PendingChange | RigChange) -> str:
    """What the keep-or-revert dialog asks: every card with its value and unit."""
    if not isinstance(pending, RigChange):
        unit = f" {pending.applied.unit}" if pending.applied is not None else ""
        return f"Applied {pending.value:+d}{unit} on {pending.device_id}. Keep this setting?"
    cards = ", ".join(f"{c.device_id} {c.value:+d}" + (f" {c.applied.unit}" if c.applied is not None else "")
                      for c in pending.changes)
    return (f"Applied {profile_words(pending.plan.profile.name)} to {len(pending.changes)} cards at once: {cards}. "
            "Keep all of them? Revert puts every card back.")
