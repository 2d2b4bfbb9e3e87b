"""The bisect job, for one card or every card at once (a single card is a rig of one): the search the state machine
(`plan`) asks for on each card, journalled durably, then the whole-rig confirmation (a phase a rig of one skips).

`BisectJob(...).run()` blocks and returns a `BisectOutcome`; `stop()` is thread-safe (the running engines are
stopped, the cards reset to stock and verified, the journals closed as resumable). Events go to `on_event`, one at a
time, each naming its card (`device`; "rig" for the rig's own). A plain class for the CLI and the UI's worker alike.

1. Every card's writer lock for the job's whole life, taken in sorted order (two jobs over overlapping cards cannot
   deadlock: the second gets CardBusy). Every check (parameters, damaged state, a live session elsewhere, an
   unfinished one without --resume or --restart, foreign state) runs for every card before any card is touched.
2. One search per card, each in its own thread when there are several, each with its own journal, unsafe list and
   reference exactly as alone; a trial left open by a dead tool or an earlier boot is recovered first.
3. Several cards (docs/bisect.md, "Every card at once"): a data-parallel recording at stock, then every card at its
   candidate (its own recommendation) at once in `mixed` mode. A failure pinned on a card backs that card off one
   resolution step (a hard failure: onto its unsafe list, backed off by the edge margin, as a single card's
   recommendation keeps it); a whole-machine event backs off every card one step; at most `MAX_RIG_ATTEMPTS`. The
   rig journal records every rig trial before it touches a card, so `--resume` continues where it stopped.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace

from tuner.backends.base import Backend
from tuner.core import exit_codes
from tuner.core.durations import format_duration
from tuner.core.errors import DeviceLost, DiskFull, NotApplied, OutOfRange, TunerError, UsageError
from tuner.core.models import Knob, Mode, same_serial
from tuner.core.unsafe_rule import blocking_setting
from tuner.tuning import bound as bounds
from tuner.tuning import evidence, journal, kernel_log, load_check
from tuner.tuning import trial as trial_module
from tuner.tuning.engine_client import WatchdogPolicy, default_preset
from tuner.tuning.events import (
    BisectEvent,
    BisectFailed,
    BisectStopped,
    Recommendation,
    RigConfirmFinished,
    RigConfirmStarted,
    RigRecommendation,
    SessionStarted,
    TrialEvent,
    TrialFinished,
    TrialProgress,
    TrialRecovered,
    TrialResult,
    TrialStarted,
    TrialWarning,
)
from tuner.tuning.journal import FINISHED, INTERRUPTED, UNRESOLVED, Journal, Owner
from tuner.tuning.plan import (
    BASELINE,
    CONFIRM,
    CONTROL,
    MIXED_LOAD_FRACTION,
    REPLAY,
    STOCK_PHASES,
    BisectPlan,
    NextTrial,
    PlanParams,
    PlanResult,
    Recommend,
    Stop,
    check_params,
)
from tuner.tuning.trial import CHANGED_OUTSIDE, STOPPED, TrialOutcome, TrialParams

PAUSED_LINE = "paused (Ctrl-Z): the trial stopped and the card is back at stock; it runs again on continue (fg)"

MODES = tuple(Mode)
MAX_RIG_ATTEMPTS = 6  # confirmation attempts of the whole rig before it gives up (each is a --confirm long)
RIG_BASELINE, RIG_CONFIRM = "rig-baseline", "rig-confirm"
TrialRunner = Callable[..., TrialOutcome]  # tuner.tuning.trial.run_trial's signature


@dataclass(frozen=True)
class BisectParams:
    """What `tuner bisect` (or the TUI's form) asks for. Settings in the knob's unit; None = the default. A bad
    combination is refused here, before anything else happens."""

    step: int | None = None
    resolution: int | None = None
    margin: int | None = None
    trial_s: float = 300.0
    confirm_s: float = 1800.0
    floor: int | None = None
    mode: str = "train"
    preset: str | None = None  # default: "tiny" when the engine runs on the CPU (simulated cards), else "nanochat"
    compile: bool | None = None  # torch.compile in the engine (None: its default, on for GPUs)
    dtype: str | None = None
    seed: int = 0
    tolerance: bool = False  # opt in to the weaker comparison (reduced sensitivity) on a platform that does not repeat
    resume: bool = False
    restart: bool = False
    watchdog: WatchdogPolicy | None = None  # None: the policy for the engine's device (tighter on the CPU)
    # --bound (issue 26): "at most one fault per bound_s of this load" at 95 %; the trials are sized by the plan and
    # --confirm is the time the confirmation may take. None: the lengths are --trial / --confirm as given (the
    # bound reached is stated all the same); on --resume, None keeps the session's own (docs/bisect.md)
    bound_s: float | None = None

    SEARCH_KEYS = ("step", "resolution", "margin", "trial_s", "confirm_s", "floor", "mode", "preset", "dtype",
                   "seed", "tolerance", "compile", "bound_s")

    def __post_init__(self) -> None:
        if self.resume and self.restart:
            raise UsageError("--resume and --restart exclude each other", "pick one")
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}", f"use one of {', '.join(MODES)}")
        if not (self.trial_s >= 1 and self.confirm_s >= 1):  # also catches NaN
            raise UsageError(f"trials of {min(self.trial_s, self.confirm_s):g} s are too short to compare anything",
                             "give --trial and --confirm of at least 1 s (the defaults are 5m and 30m)")
        if self.bound_s is not None and not self.resume:  # a resumed session keeps (and was checked with) its own
            bounds.check_reachable(self.bound_s, self.confirm_s, f"--confirm {format_duration(self.confirm_s)}",
                                   load_fraction=MIXED_LOAD_FRACTION)

    def search(self) -> dict:
        return {k: getattr(self, k) for k in self.SEARCH_KEYS}

    def resumed_search(self, stored: Mapping) -> dict:
        """A resumed session's search: its stored parameters (the command line's only where it stored none)."""
        return {k: stored.get(k, getattr(self, k)) for k in self.SEARCH_KEYS}


def search_plan_params(knob: Knob, search: dict) -> PlanParams:
    """A search's plan parameters on `knob` (a None: the plan's default for that card): the baseline replayed at
    stock and a control after a mismatch, except in the GEMM burn (no trajectory to replay)."""
    return PlanParams.defaults_for(knob, step=search["step"], resolution=search["resolution"],
                                   margin=search["margin"], floor=search["floor"],
                                   replay_baseline=search["mode"] != "gemm", stock_control=True,
                                   bound_s=search.get("bound_s"), trial_s=float(search["trial_s"]))


def card_plan(knob: Knob, search: dict, unsafe: dict) -> BisectPlan:
    """The plan of one card's search (search_plan_params), its unsafe list (journal.unsafe_settings) excluded."""
    return BisectPlan(knob, search_plan_params(knob, search), unsafe=list(unsafe),
                      unsafe_edge=any(e.get("edge") for e in unsafe.values()))


@dataclass(frozen=True)
class BisectEstimate:
    """What a search will still run: at most `trials` trials (the confirmation included), one confirmation of
    `confirm_s`, at most `duration_s` in all (BisectPlan.remaining_estimate: a descent to the range end or floor;
    a failure on the way shortens it)."""

    trials: int
    confirm_s: float
    duration_s: float


def estimate_left(plan: BisectPlan, done: Sequence[PlanResult], search: Mapping) -> BisectEstimate:
    """What is left of a search with `done` behind it, each trial at its full length: the one rule behind the CLI's
    and the UI's `bisect ~N left` and the plan shown before a start. One confirmation takes `--confirm`, or with
    `--bound` the bound's whole evidence at the mixed load's share (the plan sizes it)."""
    short, confirms = plan.remaining_estimate(done)
    bound_s = search.get("bound_s")
    confirm_s = (float(search["confirm_s"]) if bound_s is None
                 else bounds.load_needed_s(float(bound_s)) / MIXED_LOAD_FRACTION)
    return BisectEstimate(short + confirms, confirm_s, short * float(search["trial_s"]) + confirms * confirm_s)


def estimate_search(knob: Knob, params: BisectParams, unsafe: dict) -> BisectEstimate:
    """The plan a new search of `knob` with `params` runs (UsageError for parameters the job would refuse)."""
    return estimate_left(card_plan(knob, params.search(), unsafe), [], params.search())


@dataclass(frozen=True)
class CardOutcome:
    """One card's search."""

    status: str  # recommended | failed | stopped
    exit_code: int
    session: str | None
    recommendation: Recommendation | None = None
    failure: BisectFailed | None = None
    trials: tuple[TrialResult, ...] = ()
    params: dict = field(default_factory=dict)

    @property
    def summary(self) -> str:
        if self.recommendation is not None:
            r = self.recommendation
            return f"recommend {r.setting:+d} {r.unit}"
        if self.failure is not None:
            return self.failure.reason
        return "stopped; resume with --resume"

    def tuning(self) -> dict | None:
        """The `[tuning]` table of a profile saved from this outcome (None entries dropped by the profile)."""
        r, p = self.recommendation, self.params
        if r is None:
            return None
        measured = ("baseline_tok_s", "tuned_tok_s", "baseline_power_w", "tuned_power_w", "baseline_tok_per_j",
                    "tuned_tok_per_j", "efficiency_gain_pct", "first_failure", "lowest_pass", "confirmed", "margin",
                    "sensitivity", "bound_s", "bound", "confirmed_bound", "bound_met")
        searched = {"step": "step", "resolution": "resolution", "trial_duration_s": "trial_s",
                    "confirm_duration_s": "confirm_s", "preset": "preset", "mode": "mode", "dtype": "dtype"}
        return {**{k: getattr(r, k) for k in measured}, **{k: p.get(v) for k, v in searched.items()},
                "trials": [t.profile_trial() for t in self.trials]}


@dataclass(frozen=True)
class BisectOutcome:
    """The whole job: each card's search and, with several cards, the rig confirmation."""

    status: str  # recommended | partial | failed | stopped
    exit_code: int  # 0 only if every card got a recommendation (confirmed together, with several)
    per_card: Mapping[str, CardOutcome]
    settings: Mapping[str, int]  # the final setting per card that got one
    rig_attempts: tuple[TrialOutcome, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)  # card -> why it got no recommendation
    attempts: tuple[dict, ...] = ()  # the rig journal's record of every attempt (settings, pinned, backed off)

    @property
    def card(self) -> CardOutcome:
        """The search of a rig of one card."""
        [outcome] = self.per_card.values()
        return outcome


class BisectJob:
    def __init__(self, backend: Backend, device_ids: str | Sequence[str], params: BisectParams,
                 on_event: Callable[[BisectEvent], object] | None = None, *,
                 run_trial: TrialRunner | None = None, engine_factory: Callable | None = None,
                 kernel_watcher_factory: Callable[[str], kernel_log.KernelLogWatcher | None] | None = None,
                 max_attempts: int = MAX_RIG_ATTEMPTS):
        """`run_trial`: the trial runner (default tuner.tuning.trial.run_trial, looked up now: tests replace it).
        Refuses a card list naming a card twice or none, and parameters that do not fit a card, here."""
        ids = (device_ids,) if isinstance(device_ids, str) else tuple(device_ids)
        if len(set(ids)) != len(ids) or not ids:
            raise UsageError(f"--device names a card twice or none: {','.join(ids)}",
                             "name each card once, or use --device all")
        for device_id in ids:  # before anything is touched
            knob = backend.knob(device_id)
            check_params(knob, search_plan_params(knob, params.search()))
        self.backend, self.device_ids, self.params = backend, ids, params
        self._on_event = on_event or (lambda ev: None)
        self._run_trial: TrialRunner = run_trial or trial_module.run_trial
        self._engine_factory = engine_factory
        self._watcher_factory = kernel_watcher_factory
        self._max_attempts = max_attempts
        self._stop = threading.Event()
        self._emit_lock = threading.RLock()
        self._changed_outside: str | None = None  # a card's setting changed under a trial: the job stops (BUSY)
        # Ctrl-Z (issue 28.1): `pause()` ends every running trial (engines stopped, cards at stock) and holds the
        # next; `_halt` is what the trials watch (a stop or a pause), `_in_flight` how many are running
        self._halt = threading.Event()
        self._pause = threading.Condition()
        self._paused = False
        self._in_flight = 0

    # --- public -----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Thread-safe: every running trial ends (engines stopped, cards reset and verified); run() returns."""
        self._stop.set()
        with self._pause:
            self._halt.set()
            self._pause.notify_all()

    def pause(self) -> None:
        """Thread-safe (Ctrl-Z): every running trial ends, its cards back at stock and verified, without a result
        (it runs again after `resume()`); no trial starts until then. `paused_safely()` says when every card is
        back, so the process may stop."""
        with self._pause:
            self._paused = True
            self._halt.set()

    def paused_safely(self) -> bool:
        with self._pause:
            return self._paused and self._in_flight == 0

    def resume(self) -> None:
        with self._pause:
            self._paused = False
            if not self._stop.is_set():
                self._halt.clear()
            self._pause.notify_all()

    @contextlib.contextmanager
    def _trial_slot(self) -> Iterator[None]:
        """Around everything a trial writes to a card: waits while paused, counts the trial as running."""
        with self._pause:
            while self._paused and not self._stop.is_set():
                self._pause.wait(0.5)
            self._in_flight += 1
        try:
            yield
        finally:
            with self._pause:
                self._in_flight -= 1
                self._pause.notify_all()

    def _stop_reason(self) -> str:
        if self._changed_outside:
            return f"another card was changed outside this bisect ({self._changed_outside})"
        return "stopped on request"

    def _was_paused(self, stopped: bool) -> bool:
        """A trial that ended stopped, not by a stop of the job: by a pause (Ctrl-Z)."""
        return stopped and not self._stop.is_set()

    def run(self) -> BisectOutcome:
        """Everything, with every card's writer lock held for all of it, so no `set`, `apply` or `reset` from
        another shell (or the TUI) can change a card under a trial (CardBusy names the bisect)."""
        with contextlib.ExitStack() as locks:
            several = len(self.device_ids) > 1
            purpose = (f"auto-bisect of the rig {','.join(self.device_ids)}" if several
                       else f"auto-bisect of {self.device_ids[0]}")
            for device_id in sorted(self.device_ids):  # through the root helper: held machine-wide, every user
                locks.enter_context(self.backend.holding(device_id, purpose))
            return self._run()

    def _emit(self, event: BisectEvent) -> None:
        # the threads' events one at a time (front ends need not be thread-safe); a broken display must not leave a
        # card undervolted
        with self._emit_lock, contextlib.suppress(Exception):
            self._on_event(event)

    def _run(self) -> BisectOutcome:
        knobs = {d: self.backend.knob(d) for d in self.device_ids}
        rig = self._prepare(knobs)
        try:
            per_card = self._search(rig, knobs)
            reasons = {d: o.summary for d, o in per_card.items() if o.recommendation is None}
            if any(o.status == "stopped" for o in per_card.values()) or (rig is not None and self._stop.is_set()):
                return self._stopped(rig, per_card, reasons)
            if rig is None:
                own = {d: o.recommendation.setting for d, o in per_card.items() if o.recommendation is not None}
                return self._finish(None, per_card, own, reasons, ())
            return self._confirm(rig, knobs, per_card, reasons)
        except BaseException:
            if rig is not None and rig.state != FINISHED:
                rig.close(INTERRUPTED)
            raise

    # --- every check, before any card is touched ------------------------------------------------------------------
    def _prepare(self, knobs: dict[str, Knob]) -> Journal | None:
        """Refuse what must not start; reset every card to stock; open (or recover) the rig's journal."""
        p, ids = self.params, self.device_ids
        several = len(ids) > 1
        for device_id in ids:
            # a damaged unsafe list, journal or guard: refuse (fail closed)
            journal.check_safety_state(device_id, self.backend)
        rig = Journal.open_rig(ids, self.backend) if several else None
        cards = {d: Journal.open_existing(d, self.backend) for d in ids}
        for j in (rig, *cards.values()):
            if j is not None and j.open_trial and journal.classify_open_trial(j.open_trial) == Owner.RUNNING:
                raise UsageError(f"a bisect is already running on {_name(j)} (pid {j.open_trial.get('pid')})",
                                 "wait for it to finish or stop it first")
        session = rig if several else cards[ids[0]]  # what --resume continues
        if p.resume and (session is None or not session.unresolved()):
            raise UsageError(f"no unfinished {'rig bisect' if several else 'bisect session'} for "
                             f"{','.join(sorted(ids))}", "start a new one without --resume")
        if p.resume:  # the journals are keyed by slot: another card swapped in must not take these trials as its own
            for device_id, j in cards.items():
                if j is None or not j.unresolved():
                    continue
                serial = self.backend.device(device_id).serial
                if same_serial(j.serial, serial) is False:
                    raise UsageError(f"the unfinished bisect session for {device_id} ({j.session}) was run on another "
                                     f"card (serial {j.serial}; this one is {serial}): its trials say nothing about "
                                     "this card", "start over with --restart (the unsafe list is kept)")
                if j.unit is not None and j.unit != knobs[device_id].unit:  # a serial may be unknown (the simulated
                    # kinds share them): a card of another kind has another unit
                    raise UsageError(f"the unfinished bisect session for {device_id} ({j.session}) was run on a card "
                                     f"of another kind (its trials are in {j.unit}; this card's setting is in "
                                     f"{knobs[device_id].unit}): its trials say nothing about this card",
                                     "start over with --restart (the unsafe list is kept)")
        if p.resume:  # the sessions it continues keep their bound, parameters and trials: refused before any card
            for device_id, j in cards.items():  # is reset, not when its search opens the session (nothing changed)
                if j is not None and self._card_resume(rig, device_id):
                    stored = j.doc.get("params") or {}
                    _check_resumed_bound(p.bound_s, stored.get("bound_s"))
                    _check_resumed_search(knobs[device_id], p.resumed_search(stored))
                    _check_resumed_trials(knobs[device_id], j.trials)
        if p.resume and rig is not None:  # a card whose search finished too: its result is reused, not searched
            for device_id in ids:
                recorded, serial = self._rig_serial(rig, device_id), self.backend.device(device_id).serial
                if same_serial(recorded, serial) is False:
                    raise UsageError(f"the unfinished rig bisect for {_name(rig)} ({rig.session}) was run with another "
                                     f"card in {device_id} (serial {recorded}; this one is {serial}): its results say "
                                     "nothing about this card", "start over with --restart (the unsafe list is kept)")
        if p.resume and rig is not None:
            # a finished card's result on a card of another kind (or one its range cannot take), and stored
            # candidates beyond the cards' own recommendations, are refused here, before any card is reset or the
            # rig journal claimed, not when the searches or the confirmation would start
            finished = {d: self._finished_outcome(rig, d, knobs[d]) for d in ids}
            recs = {d: o.recommendation for d, o in finished.items() if o is not None and o.recommendation is not None}
            if rig.phase != "search" and len(recs) >= 2:  # the confirmation's own, stored when it began
                _check_resumed_candidates(knobs, recs, rig.doc["candidates"])
        if not (p.resume or p.restart):  # before any card is touched, not halfway through the threads
            for j in (rig, *cards.values()):
                if j is not None and j.unresolved():
                    what, done = (("rig bisect", "") if j.device_id is None
                                  else ("bisect session", f", {len(j.trials)} trials done"))
                    raise UsageError(f"an unfinished {what} exists for {_name(j)} ({j.session}{done})",
                                     "continue it with --resume or discard it with --restart (the unsafe list is "
                                     "kept)")
        for device_id in ids:  # every card from a known state (a kill -9 left them where they were)
            foreign = self.backend.foreign_state(device_id)  # PenguinBurner: every offset reads 0 first
            if foreign:
                raise UsageError(f"{foreign}; a bisect starts only from a known state",
                                 "run `tuner reset` (it returns the card to stock), then start the bisect again")
            trial_module.reset_and_verify(self.backend, device_id)
        if rig is not None and p.resume:
            rig.claim()
            self._recover_rig(rig, knobs)
            return rig
        if rig is not None and rig.unresolved():
            rig.claim()
            self._recover_rig(rig, knobs)  # a combination open at a reset goes on `never` before the session goes
            rig.close(FINISHED, outcome="discarded by --restart")
        if not several:
            return None
        search = {**p.search(), "preset": p.preset if p.preset is not None
                  else default_preset(self.backend.stress_target(ids[0]))}
        # a combination that reset the machine is never applied again, in this session or any later one
        return Journal.create_rig(ids, params=search, stock={d: k.stock for d, k in knobs.items()},
                                  backend=self.backend, never=rig.doc.get("never", []) if rig is not None else [],
                                  serials={d: self.backend.device(d).serial for d in ids})

    @staticmethod
    def _rig_serial(rig: Journal, device_id: str) -> str | None:
        """The serial of the card the rig ran on in this slot: the rig journal's; an older tuner's recorded none,
        so the card's own journal of the rig's session says it (None: unknown, nothing to refuse by)."""
        serials = rig.doc.get("serials") or {}
        if device_id in serials:
            return serials[device_id]
        doc = journal.load(device_id)
        recorded = rig.doc.get("sessions", {}).get(device_id)
        ours = doc is not None and recorded is not None and doc.get("session") == recorded
        return doc.get("serial") if ours and doc is not None else None

    def _recover_rig(self, rig: Journal, knobs: dict[str, Knob]) -> None:
        """A rig trial left open by a dead tool or an earlier boot (each card's journal recovers its own)."""
        trial = rig.open_trial
        if trial is None:
            return
        settings = {d: int(v) for d, v in trial["settings"].items()}
        attempt = int(trial.get("attempt") or 0)
        owner = journal.classify_open_trial(trial)
        if not owner.machine_may_have_reset:
            rig.end_trial()
            self._emit(TrialWarning(f"the tuner died during rig {trial.get('phase')} attempt {attempt} (pid "
                                    f"{trial.get('pid')}) in this boot: not evidence about the voltages; it runs "
                                    "again", device="rig"))
            return
        why = ("the machine froze or reset during this rig run (open in an earlier boot)" if owner == Owner.EARLIER_BOOT
               else "the tuner died during this rig run and the boot id is unreadable, so a reset cannot be ruled out")
        if trial.get("phase") == RIG_BASELINE:
            rig.end_trial(baseline={"failed": why})
            return
        # a whole-machine event: every card backs off one step, the combination is never applied again; nothing
        # says which card reset the machine, so no card's unsafe list is touched
        backed = {d: self._back_off(knobs[d], d, s, rig) for d, s in settings.items()}
        reasons = dict.fromkeys(settings, why)
        record = {"attempt": attempt, "settings": settings, "passed": False, "pinned": [], "machine_event": why,
                  "reasons": reasons, "backed_off": backed, "recovered": True}
        rig.end_trial(attempts=[*rig.attempts, record], never=[*rig.doc.get("never", []), settings],
                      candidates={**rig.doc.get("candidates", {}), **backed})
        self._emit(RigConfirmFinished(attempt=attempt, passed=False, pinned=(), machine_event=why,
                                      backed_off=backed, reasons=reasons))

    # --- the searches -----------------------------------------------------------------------------------------
    def _search(self, rig: Journal | None, knobs: dict[str, Knob]) -> dict[str, CardOutcome]:
        if rig is None:  # a rig of one: no thread, errors propagate as they are
            [device_id] = self.device_ids
            return {device_id: _Search(self, None, device_id, knobs[device_id]).run()}
        outcomes: dict[str, CardOutcome] = {}
        errors: dict[str, BaseException] = {}
        searches = []
        for device_id in self.device_ids:
            done = self._finished_outcome(rig, device_id, knobs[device_id])
            if done is not None:
                outcomes[device_id] = done
            else:  # each search ends at once, resumable, when the job was stopped before it began
                searches.append(_Search(self, rig, device_id, knobs[device_id]))

        def work(search: _Search) -> None:
            try:
                outcomes[search.device_id] = search.run()
            except BaseException as e:  # noqa: BLE001 - collected, decided below in the job's thread
                errors[search.device_id] = e

        threads = [threading.Thread(target=work, args=(s,), name=f"bisect-{s.device_id}", daemon=True)
                   for s in searches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for device_id, error in errors.items():
            if not isinstance(error, TunerError):
                raise error  # KeyboardInterrupt, a bug: every other card is already back at stock (joined)
            failure = BisectFailed(kind="error", reason=error.one_line(), exit_code=error.exit_code, device=device_id)
            self._emit(failure)
            outcomes[device_id] = CardOutcome("failed", error.exit_code, None, failure=failure)
        for device_id in self.device_ids:
            outcomes.setdefault(device_id, CardOutcome("stopped", exit_codes.INTERRUPTED, None))
        return {d: outcomes[d] for d in self.device_ids}

    def _card_resume(self, rig: Journal | None, device_id: str) -> bool:
        """Does this card's search continue its unfinished session? Alone: when asked. In a rig: when its session
        is the rig's (recorded there, or started after the rig's journal) and unfinished; a card the rig never got
        to starts its own session now."""
        if rig is None:
            return self.params.resume
        recorded = rig.doc.get("sessions", {}).get(device_id)
        doc = journal.load(device_id)
        ours = doc is not None and (doc.get("session") == recorded or (
            recorded is None and float(doc.get("created_at") or 0) >= float(rig.doc.get("created_at") or 0)))
        return bool(ours and doc is not None and doc.get("state") in UNRESOLVED)

    def _session_opened(self, rig: Journal | None, device_id: str, session: str) -> None:
        with self._emit_lock:
            if rig is not None and rig.doc["sessions"].get(device_id) != session:
                rig.update(sessions={**rig.doc["sessions"], device_id: session})

    def _finished_outcome(self, rig: Journal, device_id: str, knob: Knob) -> CardOutcome | None:
        """On resume: a card whose search this rig already finished is not searched again."""
        recorded = rig.doc.get("sessions", {}).get(device_id)
        doc = journal.load(device_id)
        if recorded is None or doc is None or doc.get("session") != recorded or doc.get("state") != FINISHED:
            return None
        if doc.get("recommendation") is not None:
            try:
                return last_outcome(device_id, knob)
            except UsageError as e:  # its refusal (another kind of card, a range it does not fit) with a rig's
                # remedy: `tuner bisect` alone is refused while this rig's journal stays unfinished
                raise UsageError(e.message, "start over with --restart (the unsafe list is kept)") from None
        failure = BisectFailed(kind=str(doc.get("outcome") or "failed"), reason=str(doc.get("reason") or ""),
                               exit_code=exit_codes.TEST_FAILED, device=device_id)
        return CardOutcome("failed", exit_codes.TEST_FAILED, recorded, failure=failure,
                           trials=tuple(TrialResult.from_record(r) for r in doc.get("trials", [])),
                           params=doc.get("params") or {})

    # --- the whole-rig confirmation ---------------------------------------------------------------------------
    def _back_off(self, knob: Knob, device_id: str, setting: int, rig: Journal, *, edge_margin: int = 0) -> int:
        """One resolution step toward stock; by the edge margin after a hard failure; never past stock."""
        step = edge_margin or int(rig.doc.get("steps", {}).get(device_id) or PlanParams.defaults_for(knob).resolution)
        backed = setting - knob.aggressive_direction * step
        return backed if knob.more_aggressive(backed, knob.stock) else knob.stock

    def _clear_of_unsafe(self, knob: Knob, device_id: str, setting: int, rig: Journal) -> int:
        """`setting` backed off until nothing on the card's unsafe list blocks it: a value listed after the card's
        own search ended (a verify that reset the machine before the rig resumed) is never applied by the rig."""
        unsafe = journal.unsafe_settings(device_id, self.backend, unit=knob.unit)  # this card's unit, as set does
        while setting != knob.stock and blocking_setting(knob, setting, unsafe) is not None:
            setting = self._back_off(knob, device_id, setting, rig)
        return setting

    def _together(self, rig: Journal, knobs: dict[str, Knob], phase: str, attempt: int, settings: dict[str, int],
                  duration_s: float, **kw: object) -> TrialOutcome | None:
        """One run of every card at `settings` together, journalled before any card is touched; None: stopped."""
        params = TrialParams(phase=phase, duration_s=duration_s, **self._trial_options(rig.doc["params"]),
                             **kw)  # type: ignore[arg-type]  # kw: TrialParams' own fields, by name
        while True:
            with self._trial_slot():
                self._emit(RigConfirmStarted(settings=settings, unit_by_device={d: knobs[d].unit for d in settings},
                                             duration_s=duration_s, attempt=attempt, phase=phase))
                rig.begin_trial(phase, attempt=attempt, settings=settings)
                res = self._run_trial(self.backend, settings, params, self._emit, self._halt,
                                      engine_factory=self._engine_factory, kernel_watcher_factory=self._watcher_factory)
            if not self._was_paused(res.stopped):
                break
            rig.end_trial()  # paused (Ctrl-Z): no result; the same run starts again on continue
            self._emit(TrialWarning(PAUSED_LINE, device="rig"))
        changed = next((r.reason for r in res.results.values() if r.kind == CHANGED_OUTSIDE), None)
        if changed:  # not an attempt: the rig stops, resumable (docs/bisect.md, "Changed outside this bisect")
            self._outside_change(changed)
        if res.stopped or self._stop.is_set():
            rig.end_trial()
            return None
        return res

    def _trial_options(self, search: Mapping) -> dict:
        """What every trial of a search runs with, a card's own or the rig's: its load, seed and comparison."""
        return {"preset": search.get("preset"), "seed": int(search.get("seed") or 0), "dtype": search.get("dtype"),
                "compile": search.get("compile"), "watchdog": self.params.watchdog,
                "tolerance": bool(search.get("tolerance"))}

    def _outside_change(self, reason: str) -> None:
        """Something outside this bisect changed a card under a trial: every search stops, resumable, exit BUSY
        (a retry would fight whatever keeps changing it)."""
        with self._emit_lock:
            self._changed_outside = self._changed_outside or reason
        self._stop.set()

    def _confirm(self, rig: Journal, knobs: dict[str, Knob], per_card: dict[str, CardOutcome],
                 reasons: dict[str, str]) -> BisectOutcome:
        """The whole-rig confirmation; `reasons`: why each card without a recommendation has none."""
        recs = {d: o.recommendation for d, o in per_card.items() if o.recommendation is not None}
        if rig.phase == "search":
            rig.update(phase="baseline" if len(recs) >= 2 else "done",
                       candidates={d: r.setting for d, r in recs.items()},
                       steps={d: int(per_card[d].params.get("resolution") or
                                     PlanParams.defaults_for(knobs[d]).resolution) for d in recs})
        if len(recs) < 2:  # nothing to confirm together: one card's own confirmation is its whole story
            return self._finish(rig, per_card, {d: r.setting for d, r in recs.items()}, reasons, ())
        for device_id in recs:  # every rig run on a card at the lock its own search ran at (a resume sets it again)
            lock_at_baseline_clock(self.backend, device_id, per_card[device_id].trials)
        edge_margins = {d: PlanParams.defaults_for(knobs[d], margin=per_card[d].params.get("margin")).edge_margin
                        for d in recs}
        gemm = rig.doc["params"].get("mode") == "gemm"
        attempts: list[TrialOutcome] = []
        stock = {d: knobs[d].stock for d in recs}
        refs = {d: journal.rig_reference_path(d, rig.session) for d in recs}
        if rig.phase == "baseline":
            failed = (rig.doc.get("baseline") or {}).get("failed")
            if failed is None and not gemm:
                res = self._together(rig, knobs, RIG_BASELINE, 0, stock, float(rig.doc["params"]["trial_s"]),
                                     mode="train", record_paths=refs)
                if res is None:
                    return self._stopped(rig, per_card, reasons)
                bad = {d: r for d, r in res.results.items() if not r.passed}
                if bad or res.machine_event:
                    failed = "; ".join([f"{d}: {r.verdict} ({r.kind}: {r.reason})" for d, r in bad.items()]
                                       + ([res.machine_event] if res.machine_event else []))
                rig.end_trial(baseline={"failed": failed,
                                        "results": {d: r.to_record() for d, r in res.results.items()}},
                              references={d: str(p) for d, p in refs.items()},
                              phase="confirm" if failed is None else "baseline")
                self._emit(RigConfirmFinished(attempt=0, passed=failed is None, pinned=res.pinned,
                                              machine_event=res.machine_event, backed_off={},
                                              reasons={d: r.reason or str(r.kind) for d, r in bad.items()},
                                              phase=RIG_BASELINE))
            if failed is not None:
                why = (f"the data-parallel recording at stock failed ({failed}): the rig cannot be confirmed "
                       "together (not a voltage problem: check the cards, cooling, power and the PCIe links)")
                return self._finish(rig, per_card, {}, {**reasons, **dict.fromkeys(recs, why)}, ())
            rig.update(phase="confirm")
        while rig.phase == "confirm":
            candidates = {d: self._clear_of_unsafe(knobs[d], d, int(v), rig) for d, v in rig.doc["candidates"].items()}
            while rig.never(candidates) and any(v != knobs[d].stock for d, v in candidates.items()):
                candidates = {d: self._back_off(knobs[d], d, v, rig) for d, v in candidates.items()}
            attempt = len(rig.attempts) + 1
            if attempt > self._max_attempts or rig.never(candidates):
                why = (f"the rig confirmation failed {len(rig.attempts)} times (at most {self._max_attempts} "
                       "attempts); each card's own recommendation stands, but not together")
                return self._finish(rig, per_card, {}, {**reasons, **dict.fromkeys(candidates, why)}, tuple(attempts))
            res = self._together(rig, knobs, RIG_CONFIRM, attempt, candidates, float(rig.doc["params"]["confirm_s"]),
                                 mode="gemm" if gemm else "mixed", reference_paths=None if gemm else refs)
            if res is None:
                return self._stopped(rig, per_card, reasons)
            attempts.append(res)
            self._judge(res, attempt, candidates, knobs, rig, edge_margins)
        return self._final(rig, per_card, reasons, tuple(attempts), knobs)

    def _judge(self, res: TrialOutcome, attempt: int, candidates: dict[str, int], knobs: dict[str, Knob],
               rig: Journal, edge_margins: dict[str, int]) -> None:
        """What one confirmation attempt means, journalled and said: passed, or which cards back off (and which drop
        out). A hard failure pinned on a card goes on its unsafe list and backs it off by the edge margin (one rule:
        `journal.record_hard_failure`, as for a single card)."""
        failing = {d: r for d, r in res.results.items() if d in candidates and r.verdict == "fail"}
        errors = {d: r for d, r in res.results.items() if d in candidates and r.verdict == "error"}
        pinned = [d for d in res.pinned if d in candidates] or list(failing)
        reasons = {d: f"{r.verdict} ({r.kind}: {r.reason})" for d, r in {**failing, **errors}.items()}
        reasons |= dict.fromkeys((d for d in candidates if d not in res.results), "no result from the rig run")
        # inconclusive (too few steps compared, a rank stopped by another's fault)
        reasons |= {d: f"{r.verdict} ({r.kind}: {r.reason})" for d, r in res.results.items()
                    if d in candidates and r.verdict not in ("pass", "fail", "error")}
        passed = not (reasons or res.machine_event or res.pinned)  # a reason for every card that did not pass
        backed: dict[str, int] = {}
        dropped: dict[str, str] = {}
        if res.machine_event:
            if all(v == knobs[d].stock for d, v in candidates.items()):  # at stock: not a voltage problem
                why = f"a whole-machine event at stock in the rig run ({res.machine_event})"
                dropped = dict.fromkeys(candidates, why)
            else:
                backed = {d: self._back_off(knobs[d], d, v, rig) for d, v in candidates.items()}
        elif pinned:
            for d in pinned:
                if candidates[d] == knobs[d].stock:
                    dropped[d] = (f"fails the data-parallel confirmation even at stock ({reasons.get(d, 'pinned')}):"
                                  " not a voltage problem; check the card, its cooling and its PCIe link")
                    continue
                hard = d in failing and journal.record_hard_failure(d, failing[d], stock=knobs[d].stock,
                                                                    session=rig.session, backend=self.backend,
                                                                    serial=self._rig_serial(rig, d))
                backed[d] = self._back_off(knobs[d], d, candidates[d], rig,
                                           edge_margin=edge_margins[d] if hard else 0)
        elif errors and not failing:  # setup trouble (a rank that never ran, a collective that never formed):
            why = "; ".join(f"{d}: {r.kind}: {r.reason}" for d, r in errors.items())  # not the voltage, as for
            dropped = dict.fromkeys(candidates, f"the data-parallel run could not run ({why})")  # one card
        # otherwise (an inconclusive run nobody is blamed for): the same settings run again, within the bound
        new = {d: v for d, v in {**candidates, **backed}.items() if d not in dropped}
        record = {"attempt": attempt, "settings": candidates, "passed": passed, "pinned": pinned,
                  "collective": res.collective,  # kept so a profile saved after --resume says it
                  "machine_event": res.machine_event, "reasons": reasons, "backed_off": new,
                  "results": {d: r.to_record() for d, r in res.results.items()}}
        rig.end_trial(attempts=[*rig.attempts, record], candidates=new,
                      dropped={**rig.doc.get("dropped", {}), **dropped},
                      phase="done" if passed or not new else "confirm")
        self._emit(RigConfirmFinished(attempt=attempt, passed=passed, pinned=tuple(pinned),
                                      machine_event=res.machine_event, backed_off={} if passed else new,
                                      reasons=reasons))

    def _final(self, rig: Journal, per_card: dict[str, CardOutcome], reasons: dict[str, str],
               attempts: tuple[TrialOutcome, ...], knobs: dict[str, Knob]) -> BisectOutcome:
        reasons = {**reasons, **rig.doc.get("dropped", {})}
        last = rig.attempts[-1] if rig.attempts else None
        settings: dict[str, int] = {}
        if last is not None and last.get("passed"):
            for d, v in last["settings"].items():
                own = per_card[d].recommendation
                if v == knobs[d].stock and own is not None and own.setting != knobs[d].stock:
                    reasons[d] = (f"backed off to stock by the rig confirmation (its own recommendation "
                                  f"{own.setting:+d} {knobs[d].unit} failed together with the other cards at every "
                                  "step tried)")
                else:
                    settings[d] = int(v)
        return self._finish(rig, per_card, settings, reasons, attempts)

    # --- endings ----------------------------------------------------------------------------------------------
    def _stopped(self, rig: Journal | None, per_card: dict[str, CardOutcome],
                 reasons: dict[str, str]) -> BisectOutcome:
        if rig is not None:
            rig.close(INTERRUPTED)
        code = exit_codes.BUSY if self._changed_outside else exit_codes.INTERRUPTED
        return BisectOutcome("stopped", code, per_card, {}, reasons=reasons,
                             attempts=tuple(rig.attempts) if rig else ())

    def _finish(self, rig: Journal | None, per_card: dict[str, CardOutcome], settings: dict[str, int],
                reasons: dict[str, str], attempts: tuple[TrialOutcome, ...]) -> BisectOutcome:
        """Exit code: 0 only if every card got a recommendation; else 5 if any card's hardware failed, else the
        first failing card's own code, else 1 (the rig confirmation failed or backed a card off to stock)."""
        missing = {d: reasons.get(d, "no recommendation") for d in self.device_ids if d not in settings}
        if not missing:
            status, code = "recommended", exit_codes.OK
        else:
            status = "failed" if not settings else "partial"
            codes = [per_card[d].exit_code for d in self.device_ids if per_card[d].exit_code != exit_codes.OK]
            code = (exit_codes.HARDWARE if exit_codes.HARDWARE in codes else codes[0] if codes
                    else exit_codes.TEST_FAILED)
        if rig is None:
            return BisectOutcome(status, code, per_card, dict(settings), reasons=missing)
        recs = {d: per_card[d].recommendation for d in settings}
        rig.close(FINISHED, phase="done", outcome=status, settings=settings, reasons=missing)
        if settings:
            self._emit(RigRecommendation(settings=dict(settings),
                                         per_card={d: r for d, r in recs.items() if r is not None}))
        return BisectOutcome(status, code, per_card, dict(settings), attempts, missing, attempts=tuple(rig.attempts))


def _check_resumed_bound(asked_s: float | None, stored_s: float | None) -> None:
    """A resumed session keeps the bound it was started with: its trials were sized for it (None: keep it)."""
    if asked_s is None or asked_s == stored_s:
        return
    if stored_s is None:
        raise UsageError("this session was started without --bound (its trials were not sized for one)",
                         "resume without --bound, or start over with --restart")
    was = format_duration(float(stored_s))
    raise UsageError(f"this session was started with --bound {was}",
                     f"resume without --bound (or with --bound {was}), or start over with --restart")


def _check_resumed_search(knob: Knob, search: dict) -> None:
    """A resumed session runs with its stored steps, margin and floor (the command line's are not used): ones this
    card cannot take (a hand-edited journal, a driver whose step changed) are refused before the session is claimed,
    with the remedy --resume leaves (check_params' own would ask for a flag --resume ignores)."""
    try:
        check_params(knob, search_plan_params(knob, search))
    except UsageError as e:
        raise UsageError(f"this session's stored parameters do not fit this card: {e.message}",
                         "start over with --restart") from None


def _check_resumed_trials(knob: Knob, records: Sequence[Mapping]) -> None:
    """A resumed session's stored trials steer its plan (a stored pass is where it confirms): one this card cannot
    take (a hand-edited or damaged journal) is refused as the stored parameters are, not left to end the search on
    the card's own refusal of a value the user never asked for."""
    for n, record in enumerate(records, 1):
        try:
            knob.validate(record["setting"], allow_overvolt=True)
        except OutOfRange as e:
            raise UsageError(f"this session's stored trials do not fit this card: trial {n}: {e.message}",
                             "start over with --restart") from None


def _check_resumed_candidates(knobs: Mapping[str, Knob], recs: Mapping[str, Recommendation],
                              candidates: Mapping[str, int]) -> None:
    """A rig's stored candidates are where it confirms: each starts at its card's own recommendation and only backs
    off toward stock. One beyond that (a hand-edited or damaged rig journal), or of a card with no recommendation,
    would apply a value no search confirmed: refused before any card is touched, as stored trials are."""
    for device_id, value in candidates.items():
        knob, rec = knobs[device_id], recs.get(device_id)
        if rec is None or knob.more_aggressive(value, rec.setting) or knob.more_aggressive(knob.stock, value):
            own = "none" if rec is None else f"{rec.setting:+d} {knob.unit}"
            raise UsageError(f"this rig's stored candidates do not fit its cards: {device_id} at {value:+d} "
                             f"{knob.unit} is not between its stock ({knob.stock:+d} {knob.unit}) and its own "
                             f"recommendation ({own})", "start over with --restart")


def _name(j: Journal) -> str:
    return j.device_id or ",".join(j.doc.get("devices") or ())


class _Search:
    """One card's search (docs/bisect.md, "The search"): the plan's trials on this card, journalled in its own
    journal, exactly as alone; the job's stop, trial runner and events are shared."""

    def __init__(self, job: BisectJob, rig: Journal | None, device_id: str, knob: Knob):
        self.job, self.rig, self.device_id, self.knob = job, rig, device_id, knob
        self.backend = job.backend

    def _emit(self, event: BisectEvent) -> None:
        if getattr(event, "device", None) == "":  # every event names its card (several run at once in a rig)
            event = replace(event, device=self.device_id)
        self.job._emit(event)

    def run(self) -> CardOutcome:
        knob = self.knob
        device = self.backend.device(self.device_id)
        j, search, resumed = self._open_session(knob)
        # the machine's list too, via the helper; in this card's unit only, the rule set, apply and the helper use
        unsafe = journal.unsafe_settings(self.device_id, self.backend, unit=knob.unit)
        plan = card_plan(knob, search, unsafe)
        search = {**search, "step": plan.params.step, "resolution": plan.params.resolution,
                  "margin": plan.params.margin}
        self._emit(SessionStarted(session=j.session, device=self.device_id, label=device.label, unit=knob.unit,
                                  stock=knob.stock, resumed=resumed, params=search, unsafe=tuple(sorted(unsafe))))
        try:
            return self._loop(plan, j, search)
        except BaseException:
            # KeyboardInterrupt / Terminated in the caller's thread: run_trial already reset the card
            if j.open_trial is not None:
                j.abandon_trial("interrupted")
            if j.state != FINISHED:
                j.close(INTERRUPTED)
            raise

    def _open_session(self, knob: Knob) -> tuple[Journal, dict, bool]:
        """The card's session: its open trial recovered, then continued (--resume) or a new one (the job made
        every check and reset the card)."""
        p = self.job.params
        existing = Journal.open_existing(self.device_id, self.backend)
        if existing is not None and existing.open_trial is not None:
            self._recover(existing, knob)
        device = self.backend.device(self.device_id)
        if self.job._card_resume(self.rig, self.device_id):
            assert existing is not None  # resumable: the job checked there is an unfinished session
            stored = existing.doc.get("params") or {}
            search = p.resumed_search(stored)  # checked by the job (_prepare), before any card was reset
            existing.claim()
            self.job._session_opened(self.rig, self.device_id, existing.session)
            return existing, search, True
        if existing is not None and existing.unresolved():
            existing.close(FINISHED, outcome="discarded by --restart")
        params = {**p.search(), "preset": p.preset if p.preset is not None
                  else default_preset(self.backend.stress_target(self.device_id))}
        j = Journal.create(self.device_id, params=params, knob=knob.to_dict(), serial=device.serial,
                           backend=self.backend)
        self.job._session_opened(self.rig, self.device_id, j.session)
        return j, params, False

    def _recover(self, existing: Journal, knob: Knob) -> None:
        """An open trial whose process is gone. A reset cannot be ruled out (an earlier boot, or an unreadable boot
        id: fail closed): the machine froze or reset, a failure and an unsafe value. Left in this boot: the tuner
        died (kill -9, a full disk), which says nothing about the voltage: inconclusive, the plan runs it again.
        Through the root helper, the helper's word counts too (Backend.recovered_trials): a trial of this session it
        found open after a freeze or reset is that failure, whatever this user's journal could tell."""
        trial = existing.open_trial
        assert trial is not None
        device = self.backend.device(self.device_id)
        setting, phase = int(trial["setting"]), trial.get("phase", "coarse")
        owner = journal.classify_open_trial(trial)
        # in the unit the trial ran in (the session's knob): a card of another kind swapped into the slot since has
        # another, and -40 mV recorded as -40 MHz blocked that card's stock while the crashed card's list ignored it
        common = {"setting": setting, "unit": existing.unit or knob.unit, "phase": phase,
                  "started_at": trial.get("started_at"), "simulated": device.simulated}
        machine_reset = next((r for r in self.backend.recovered_trials(self.device_id) if r.verdict == "fail"
                              and r.trial.setting == setting and r.trial.session == existing.session), None)
        if phase == BASELINE and owner != Owner.EARLIER_BOOT and machine_reset is None:
            existing.abandon_trial("the tuner died during the baseline (at stock); it runs again")
            return
        if machine_reset is not None and owner != Owner.EARLIER_BOOT:
            result = TrialResult(verdict="fail", kind="system-reset", edge=True, reason=(
                f"the root helper found this trial open after the machine froze or reset ({machine_reset.reason})"),
                **common)
        elif owner == Owner.EARLIER_BOOT:
            target = self.backend.stress_target(self.device_id)
            lines = None if target.simulated else kernel_log.previous_boot_events(target.pci_bus_id)
            result = TrialResult(verdict="fail", kind="system-reset", edge=True, kernel_log=tuple(lines or ()),
                                 reason="the machine froze or reset during this trial (open in an earlier boot)"
                                 + (f"; previous boot's kernel log: {lines[-1][:160]}" if lines else
                                    "; previous boot's kernel log unavailable"), **common)
        elif owner == Owner.UNKNOWN_BOOT:
            result = TrialResult(verdict="fail", kind="system-reset", edge=True, reason=(
                "the tuner died during this trial and the boot id is unreadable, so a machine reset cannot be ruled "
                "out"), **common)
        else:
            result = TrialResult(verdict=evidence.INCONCLUSIVE, kind=evidence.TOOL_DIED, reason=(
                f"the tuner died during this trial (pid {trial.get('pid')}) in this boot: not evidence about the "
                "voltage; it runs again"), **common)
        # on the unsafe list before the trial closes: a kill or a full disk between the two must leave the trial
        # open (recovered again next time), never a closed trial whose value no list remembers. Under the serial of
        # the card the trial ran on (the session's), not the card in the slot now: one swapped in since (a
        # --restart) must not take the refusal while the card that crashed keeps none (the helper files a line
        # under its serial's card)
        journal.record_hard_failure(self.device_id, result, stock=knob.stock, session=existing.session,
                                    serial=existing.serial)
        existing.finish_trial(result.to_record())
        self._emit(TrialRecovered(result))

    # --- the loop ---------------------------------------------------------------------------------------------
    def _loop(self, plan: BisectPlan, j: Journal, search: dict) -> CardOutcome:
        while True:
            results = [TrialResult.from_record(r) for r in j.trials]
            if self.job._stop.is_set():
                return self._stopped(j, results, search, self.job._stop_reason())
            decision = plan.decide([PlanResult.from_record(r) for r in j.trials])
            if isinstance(decision, Recommend):
                return self._recommend(decision, j, results, search)
            if isinstance(decision, Stop):
                return self._failed(j, results, search, decision.kind, decision.reason)
            assert isinstance(decision, NextTrial)
            # the plan never proposes these
            if decision.setting in journal.unsafe_settings(self.device_id, self.backend, unit=self.knob.unit):
                raise AssertionError(f"refusing to apply unsafe {decision.setting}")
            outcome = self._run_one(decision, plan, j, results, search)
            if outcome is not None:
                return outcome

    def _trial_params(self, decision: NextTrial, j: Journal, results: list[TrialResult],
                      search: dict) -> TrialParams:
        d, mode = self.device_id, search["mode"]
        reruns = evidence.short_reruns(j.trials, decision.setting, decision.phase)  # too short before: longer
        trial_s = evidence.rerun_duration_s(float(search["trial_s"]), reruns)
        confirm_s = evidence.rerun_duration_s(float(search["confirm_s"]), reruns)
        baseline = stock_baseline(results)
        common = {"phase": decision.phase, "baselines": {d: baseline} if baseline else None,
                  **self.job._trial_options(search)}
        if decision.phase == BASELINE:
            if mode == "gemm":  # the GEMM burn has no training trajectory to record
                return TrialParams(duration_s=trial_s, mode=mode, **common)
            # One trial long: later runs loop the reference (--reference-loop), so it covers any length.
            return TrialParams(duration_s=trial_s, mode="train", record_paths={d: j.reference}, **common)
        reference = {d: j.reference} if mode != "gemm" and j.reference.exists() else None
        if decision.phase == REPLAY and baseline is not None:
            # The whole recording, replayed in a second process at stock and compared bit for bit (see
            # docs/engine.md, "Repeatability proven": runs that diverge often do so only after 100+ steps).
            return TrialParams(duration_s=baseline.duration_s or trial_s, steps=max(1, baseline.steps or 1),
                               mode="train", reference_paths=reference, verify_repeatable=True, **common)
        if decision.phase == CONTROL:
            steps = control_steps(results[-1] if results else None)
            return TrialParams(duration_s=trial_s, steps=steps, mode="train", reference_paths=reference, **common)
        confirm = decision.phase == CONFIRM
        run_mode = ("gemm" if mode == "gemm" else "mixed") if confirm else mode
        if decision.steps is not None and decision.duration_s is not None:
            # sized by the plan (a bound was asked for): its compared steps, the baseline's warm-up on top; the
            # duration only feeds the ETA (a mixed confirmation's idle and partial phases make it longer)
            steps = decision.steps + int((baseline.warmup_steps if baseline else None) or 0)
            eta_s = decision.duration_s / MIXED_LOAD_FRACTION if confirm and mode != "gemm" else decision.duration_s
            return TrialParams(duration_s=max(1.0, round(eta_s, 1)), steps=steps, mode=run_mode,
                               reference_paths=reference, **common)
        return TrialParams(duration_s=confirm_s if confirm else trial_s, mode=run_mode, reference_paths=reference,
                           **common)

    def _run_one(self, decision: NextTrial, plan: BisectPlan, j: Journal, results: list[TrialResult],
                 search: dict) -> CardOutcome | None:
        reruns = evidence.short_reruns(j.trials, decision.setting, decision.phase)
        if reruns > evidence.MAX_SHORT_RERUNS:
            return self._too_short(j, results, search, decision)
        tp = self._trial_params(decision, j, results, search)
        if decision.phase != BASELINE and tp.mode != "gemm" and tp.reference_paths is None:
            # the reference was lost (resumed on another machine, state dir cleaned): record it again
            j.update(trials=[r for r in j.trials if r.get("phase") != BASELINE])
            return None
        with self.job._trial_slot():  # held while paused (Ctrl-Z); counted as running from here
            return self._run_one_now(decision, plan, j, results, search, tp)

    def _run_one_now(self, decision: NextTrial, plan: BisectPlan, j: Journal, results: list[TrialResult],
                     search: dict, tp: TrialParams) -> CardOutcome | None:
        knob = self.knob
        index = len(results) + 1
        open_trial = j.begin_trial(decision.phase, setting=decision.setting)
        left = estimate_left(plan, [PlanResult.from_record(r) for r in j.trials], search)
        this_s = left.confirm_s if decision.phase == CONFIRM else float(search["trial_s"])
        rest_s = max(0.0, left.duration_s - this_s)  # an upper bound: a screen is a tenth of a --trial
        self._emit(TrialStarted(index=index, setting=decision.setting, unit=knob.unit, phase=decision.phase,
                                duration_s=tp.duration_s, started_at=open_trial["started_at"],
                                expected_trials=index - 1 + left.trials))

        def on_trial_event(ev: TrialEvent) -> None:
            if isinstance(ev, TrialProgress):
                ev = replace(ev, eta_total_s=round(ev.eta_s + rest_s, 1))
            self._emit(ev)

        lock_at_baseline_clock(self.backend, self.device_id, results)
        try:
            result = self.job._run_trial(self.backend, {self.device_id: decision.setting}, tp, on_trial_event,
                                         self.job._halt, engine_factory=self.job._engine_factory,
                                         kernel_watcher_factory=self.job._watcher_factory).results[self.device_id]
        except NotApplied as e:
            j.abandon_trial(f"not applied: {e.message}")
            return self._failed(j, results, search, "not-applied", e.one_line(), hardware=True)
        except DeviceLost as e:
            lost = TrialResult(setting=decision.setting, unit=knob.unit, phase=decision.phase, verdict="fail",
                               kind="device-lost", reason=e.one_line(), edge=True)
            # on the unsafe list before the trial closes: through the helper, the mark ends its open trial
            journal.record_hard_failure(self.device_id, lost, stock=knob.stock, session=j.session,
                                        serial=j.serial, backend=self.backend)
            j.finish_trial(lost.to_record())
            self._emit(TrialFinished(index, lost))
            return self._failed(j, [*results, lost], search, "device-lost", e.one_line(), hardware=True)
        if self.job._was_paused(result.verdict == STOPPED):  # Ctrl-Z: no result, it runs again on continue
            j.abandon_trial("paused (Ctrl-Z)")
            self._emit(TrialWarning(PAUSED_LINE))
            return None
        if result.verdict == STOPPED:
            j.abandon_trial("stopped")
            return self._stopped(j, results, search, self.job._stop_reason())
        if result.sensitivity == "reduced" and not search.get("tolerance") and result.verdict != "error":
            # the engine compared with tolerances without being asked: never accept a silent downgrade
            result = replace(result, verdict="error", kind="reduced-sensitivity",
                             reason="the engine ran with reduced sensitivity without --tolerance (a silent "
                                    "downgrade): refusing the result")
        # the minimum of compared steps is about a voltage: runs at stock that test the platform are exempt
        result = evidence.judge(result, baseline=decision.phase in STOCK_PHASES,
                                disk_is_full=result.verdict != "pass" and evidence.disk_full(journal.journal_dir()))
        if decision.phase == BASELINE and result.passed:
            result, light = _with_load_report(result, search["preset"])
            if light:
                self._emit(TrialWarning(light))
        # on the unsafe list before the trial closes: through the helper, the mark ends its open trial. Under the
        # session's serial (the card it ran on, read before any trial: a lost card may answer nothing now), which
        # the helper files an imported line by (service._key_for), not the slot whatever card is in it then
        journal.record_hard_failure(self.device_id, result, stock=knob.stock, session=j.session,
                                    serial=j.serial, backend=self.backend)
        j.finish_trial(result.to_record())
        if result.kind == CHANGED_OUTSIDE:  # inconclusive, recorded; the bisect stops (docs/bisect.md)
            self._emit(TrialFinished(index, result))
            self.job._outside_change(result.reason)
            return self._stopped(j, results, search, f"{result.reason}; find what changes the card (another "
                                 "`tuner reset --force`, another tool)", exit_code=exit_codes.BUSY)
        if result.kind == evidence.ENGINE_KILLED:  # re-running now could meet the same killer (the OOM killer)
            self._emit(TrialFinished(index, result))
            return self._stopped(j, results, search, result.reason)
        if result.kind == evidence.DISK_FULL:  # run() closes the session as resumable
            self._emit(TrialFinished(index, result))
            raise DiskFull(f"the disk holding {journal.journal_dir()} is full; the trial at {decision.setting:+d} "
                           f"{knob.unit} did not count", f"free disk space, then `tuner bisect --device "
                           f"{self.device_id} --resume`")
        if result.effective is False:
            self._emit(TrialWarning(next(w for w in result.warnings if w.startswith("not effective"))))
        b = (plan.bound_at(result.setting, [PlanResult.from_record(r) for r in j.trials])
             if result.passed and decision.phase not in STOCK_PHASES else None)
        self._emit(TrialFinished(index, result, bound=None if b is None else b.to_dict(),
                                 bound_text=None if b is None else b.text()))
        return None

    # --- endings ----------------------------------------------------------------------------------------------
    def _stopped(self, j: Journal, results: list[TrialResult], search: dict, reason: str, *,
                 exit_code: int = exit_codes.INTERRUPTED) -> CardOutcome:
        j.close(INTERRUPTED)
        self._emit(BisectStopped(reason=reason, resumable=True))
        return CardOutcome("stopped", exit_code, j.session, trials=tuple(results), params=search)

    def _too_short(self, j: Journal, results: list[TrialResult], search: dict, decision: NextTrial) -> CardOutcome:
        last = next(r for r in reversed(j.trials) if r.get("setting") == decision.setting
                    and r.get("kind") == evidence.TOO_SHORT)
        reason = (f"{decision.phase} trials at {decision.setting:+d} {self.knob.unit} compared too few steps "
                  f"({last.get('steps')} steps, {last.get('warmup_steps') or 0} of them warm-up) even at "
                  f"{evidence.RERUN_FACTOR ** evidence.MAX_SHORT_RERUNS}x the duration; a pass needs "
                  f"{evidence.MIN_COMPARED_STEPS} compared steps: give a longer --trial / --confirm")
        return self._failed(j, results, search, evidence.TOO_SHORT, reason)

    def _failed(self, j: Journal, results: list[TrialResult], search: dict, kind: str, reason: str, *,
                hardware: bool = False) -> CardOutcome:
        """No recommendation: a failed test finishes the session; a hardware failure (a setting not applied, the
        card lost) leaves it resumable."""
        code, state = (exit_codes.HARDWARE, INTERRUPTED) if hardware else (exit_codes.TEST_FAILED, FINISHED)
        failure = BisectFailed(kind=kind, reason=reason, exit_code=code)
        self._emit(failure)
        j.close(state, **({"outcome": kind} if state == FINISHED else {}), reason=reason)
        return CardOutcome("failed", code, j.session, failure=failure, trials=tuple(results), params=search)

    def _recommend(self, d: Recommend, j: Journal, results: list[TrialResult], search: dict) -> CardOutcome:
        knob = self.knob
        baseline = stock_baseline(results)
        measured = _measured_near(d.setting, knob, results)
        gain = None
        if baseline and measured and baseline.tok_per_j and measured.tok_per_j:
            gain = round((measured.tok_per_j / baseline.tok_per_j - 1.0) * 100.0, 2)
        rec = Recommendation(
            sensitivity="reduced" if search.get("tolerance") else "full",
            device=self.device_id, unit=knob.unit, setting=d.setting, confirmed=d.confirmed,
            lowest_pass=d.lowest_pass, first_failure=d.first_failure, margin=d.margin, edge=d.edge,
            baseline_tok_s=baseline.tok_s if baseline else None,
            baseline_power_w=baseline.power_w if baseline else None,
            baseline_tok_per_j=baseline.tok_per_j if baseline else None,
            tuned_tok_s=measured.tok_s if measured else None, tuned_power_w=measured.power_w if measured else None,
            tuned_tok_per_j=measured.tok_per_j if measured else None,
            measured_at=measured.setting if measured else None, efficiency_gain_pct=gain,
            bound_s=d.bound_s, bound=None if d.bound is None else d.bound.to_dict(),
            confirmed_bound=None if d.confirmed_bound is None else d.confirmed_bound.to_dict(),
            bound_met=d.bound_met,
        )
        self._emit(rec)
        j.close(FINISHED, outcome="recommended", recommendation=asdict(rec))
        return CardOutcome("recommended", exit_codes.OK, j.session, recommendation=rec, trials=tuple(results),
                           params=search)


CONTROL_MARGIN_STEPS = 20  # a control runs at least this many steps past the failure's step...
CONTROL_MARGIN_FRACTION = 0.25  # ...or a quarter more, whichever is larger


def control_steps(failed: TrialResult | None) -> int:
    """Steps of a control at stock: as many as the failure took, plus a margin (so the control passes the step at
    which the failing trial diverged, with room for divergence that depends on time, e.g. another process)."""
    at = (failed.fault_step or failed.steps or 1) if failed is not None else 1
    return at + max(CONTROL_MARGIN_STEPS, int(at * CONTROL_MARGIN_FRACTION))


def stock_baseline(results: Sequence[TrialResult]) -> TrialResult | None:
    """The card's last passing baseline at stock: what efficiency, the clock lock and the replay are measured by."""
    return next((r for r in reversed(results) if r.phase == BASELINE and r.passed), None)


def lock_at_baseline_clock(backend: Backend, device_id: str, results: Sequence[TrialResult]) -> None:
    """NVIDIA: lock at the clock the card sustained under its passing stock baseline, not the V/F table top (which
    caps nothing). Every trial of a card's search and every rig run on it is made at this lock; the lock is the
    process's choice, so a resumed session sets it again from the journal's baseline. No-op on other cards."""
    baseline = stock_baseline(results)
    if baseline is not None and baseline.median_core_clock_mhz:
        backend.lock_at_measured_clock(device_id, baseline.median_core_clock_mhz)


def last_outcome(device_id: str, knob: Knob, serial: str | None = None) -> CardOutcome:
    """The finished session's outcome, rebuilt from the journal (validated on load), for saving it as a profile
    after the fact (`tuner bisect --save NAME --from-last`: the save at the end of the run failed, or was not
    asked for). UsageError when the last session did not end with a recommendation, or was run on another card
    than the one of `serial` now in the slot, or on a card of another kind (its unit)."""
    doc = journal.load(device_id)
    if doc is None or doc.get("state") != FINISHED or doc.get("recommendation") is None:
        raise UsageError(f"no finished bisect with a recommendation for {device_id} in "
                         f"{journal.journal_path(device_id)}",
                         "run `tuner bisect` (a new bisect replaces the last one's result)")
    if same_serial(doc.get("serial"), serial) is False:  # keyed by slot, as --resume refuses it (BisectJob)
        raise UsageError(f"the last bisect of {device_id} ({doc.get('session')}) was run on another card (serial "
                         f"{doc.get('serial')}; this one is {serial}): its result says nothing about this card",
                         "run `tuner bisect` on this card")
    names = {f.name for f in fields(Recommendation)}
    rec = Recommendation(**{"device": device_id, **{k: v for k, v in doc["recommendation"].items() if k in names}})
    if rec.unit != knob.unit:  # a serial may be unknown: a card of another kind swapped in must not read -45 mV as MHz
        raise UsageError(f"the last bisect of {device_id} ({doc.get('session')}) was run on a card of another kind "
                         f"(its result is {rec.setting:+d} {rec.unit}; this card's setting is in {knob.unit}): it says "
                         "nothing about this card", "run `tuner bisect` on this card")
    try:  # a journal from another card, or hand-edited: said here, with the file, not by the profile's check
        knob.validate(rec.setting)  # no overvolt: a profile records an undervolt
    except OutOfRange as e:
        raise UsageError(f"the last bisect's recommendation in {journal.journal_path(device_id)} does not fit this "
                         f"card: {e.message}", "run `tuner bisect` (a new bisect replaces the last one's result)"
                         ) from None
    stored = doc["params"]
    pp = PlanParams.defaults_for(knob, step=stored.get("step"), resolution=stored.get("resolution"),
                                 margin=stored.get("margin"), floor=stored.get("floor"))
    search = {**stored, "step": pp.step, "resolution": pp.resolution, "margin": pp.margin}
    trials = tuple(TrialResult.from_record(r) for r in doc["trials"])
    return CardOutcome("recommended", exit_codes.OK, doc["session"], recommendation=rec, trials=trials,
                       params=search)


def _measured_near(setting: int, knob: Knob, results: list[TrialResult]) -> TrialResult | None:
    """The passing measurement at the recommended setting (the confirm run preferred), else the nearest passing
    one on the stock side of it (so the reported gain is never overstated)."""
    passes = [r for r in results if r.passed and r.tok_per_j]
    exact = [r for r in passes if r.setting == setting]
    if exact:
        return next((r for r in reversed(exact) if r.phase == CONFIRM), exact[-1])
    safer = [r for r in passes if not knob.more_aggressive(r.setting, setting)]
    if not safer:
        return None
    return max(safer, key=lambda r: ((r.setting - knob.stock) * knob.aggressive_direction, r.phase == CONFIRM))


def _with_load_report(result: TrialResult, preset: str | None) -> tuple[TrialResult, str | None]:
    """The baseline's load against the card's power limit, and a warning when it is light."""
    note = load_check.load_note(result.power_w, result.power_limit_w)
    light = load_check.light_load_warning(result.power_w, result.power_limit_w, preset=preset,
                                          throttle_reasons=result.throttle_reasons)
    return (replace(result, load_note=note) if note else result), light


__all__ = ["BisectJob", "BisectOutcome", "BisectParams", "CardOutcome", "last_outcome"]
