"""Every card at once (issue 16): one bisect per card running concurrently, then a whole-rig confirmation.

`RigBisectJob(...).run()` blocks and returns a `RigOutcome`; `stop()` is thread-safe. It holds every card's writer
lock for its whole life (taken in sorted order, so two rigs over overlapping cards cannot deadlock: the second is
refused with CardBusy), and runs one `BisectJob` per card in its own thread (`take_lock=False`). Each card keeps its
own journal, unsafe list and reference, exactly as a single-card bisect; each trial has its own kernel-log watcher
(a line naming another card's PCI address is ignored, a line naming no card counts for every card with a trial
open). Events from the threads are serialised and carry their card (`device`).

Then the whole rig: a data-parallel recording at stock (every card records its own reference), then every card at
its candidate (its own recommendation) at once, in `mixed` mode, for the confirmation time (`rig_trial`, one
torch.distributed job over the cards). A failure pinned on a card backs that card off one resolution step toward
stock and the rig confirms again; a whole-machine event backs off every card one step; a card that reaches stock
stays there (its reason says so); at most `MAX_RIG_ATTEMPTS` attempts. The rig journal (journal_rig.py) records
every rig trial before it touches a card, so `--resume` after a crash or a reset continues: a rig trial left open
by an earlier boot is a whole-machine event (every card backs off one step, that combination is never applied
again); one left open in this boot (the tuner was killed) is inconclusive and runs again (issue 11's rule).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.backends.base import Backend
from tuner.core import exit_codes
from tuner.core.card_lock import CardLock
from tuner.core.errors import NotApplied, TunerError, UsageError
from tuner.core.models import Knob
from tuner.tuning import journal, kernel_log
from tuner.tuning.engine_client import default_preset
from tuner.tuning.events import (
    BisectEvent,
    BisectFailed,
    RigConfirmFinished,
    RigConfirmStarted,
    RigRecommendation,
    SessionStarted,
    TrialResult,
    TrialWarning,
)
from tuner.tuning.job import BisectJob, BisectOutcome, BisectParams, last_outcome, lock_at_baseline_clock
from tuner.tuning.journal_rig import RigJournal, rig_reference_path
from tuner.tuning.plan import PlanParams
from tuner.tuning.rig_trial import RigTrialParams, RigTrialResult, run_rig_trial

MAX_RIG_ATTEMPTS = 6  # confirmation attempts of the whole rig before it gives up (each is a --confirm long)
RIG_BASELINE, RIG_CONFIRM = "rig-baseline", "rig-confirm"


@dataclass(frozen=True)
class RigOutcome:
    status: str  # recommended | partial | failed | stopped
    exit_code: int  # 0 only if every card got a recommendation confirmed together
    per_card: Mapping[str, BisectOutcome]
    settings: Mapping[str, int]  # the final setting per card that got one (confirmed together)
    rig_attempts: tuple[RigTrialResult, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)  # card -> why it got no recommendation
    session: str | None = None  # the rig journal's session
    attempts: tuple[dict, ...] = ()  # the rig journal's record of every attempt (settings, pinned, backed off)


class RigBisectJob:
    def __init__(self, backend: Backend, device_ids: Sequence[str], params: BisectParams,
                 on_event: Callable[[BisectEvent], None] | None = None, *,
                 rig_trial: Callable[..., RigTrialResult] | None = None,
                 engine_factory: Callable | None = None,
                 kernel_watcher_factory: Callable[[str], kernel_log.KernelLogWatcher] | None = None,
                 max_attempts: int = MAX_RIG_ATTEMPTS):
        if len(set(device_ids)) != len(device_ids) or not device_ids:
            raise UsageError(f"--device names a card twice or none: {','.join(device_ids)}",
                             "name each card once, or use --device all")
        self.backend, self.params = backend, params
        self.device_ids: tuple[str, ...] = tuple(device_ids)
        self._on_event = on_event or (lambda ev: None)
        self._rig_trial = rig_trial or run_rig_trial
        self._engine_factory = engine_factory
        self._watcher_factory = kernel_watcher_factory
        self._max_attempts = max_attempts
        self._stop = threading.Event()
        self._emit_lock = threading.RLock()
        self._jobs: dict[str, BisectJob] = {}
        self._rig: RigJournal | None = None

    # --- public -----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Thread-safe: every running trial ends (engines stopped, cards reset and verified); run() returns."""
        self._stop.set()
        with self._emit_lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.stop()

    def run(self) -> RigOutcome:
        """Everything; every card's writer lock is held for all of it (sorted order: no deadlock between rigs)."""
        with contextlib.ExitStack() as locks:
            purpose = f"auto-bisect of the rig {','.join(self.device_ids)}"
            for device_id in sorted(self.device_ids):
                locks.enter_context(CardLock(device_id, purpose))
            return self._run()

    # --- the whole thing --------------------------------------------------------------------------------------
    def _emit(self, event: BisectEvent) -> None:
        with self._emit_lock:  # the threads' events one at a time: front ends need not be thread-safe
            try:
                self._on_event(event)
            except Exception:  # noqa: BLE001 - a broken display must not leave a card undervolted
                pass

    def _run(self) -> RigOutcome:
        knobs = {d: self.backend.knob(d) for d in self.device_ids}
        rig = self._rig = self._open_rig(knobs)
        try:
            per_card = self._search(rig, knobs)
            if self._stop.is_set() or any(o.status == "stopped" for o in per_card.values()):
                rig.close(journal.INTERRUPTED)
                return RigOutcome("stopped", exit_codes.INTERRUPTED, per_card, {}, session=rig.session,
                                  reasons={d: o.summary for d, o in per_card.items() if o.recommendation is None})
            return self._confirm(rig, knobs, per_card)
        except BaseException:
            if rig.state != journal.FINISHED:
                rig.close(journal.INTERRUPTED)
            raise

    # --- the rig journal --------------------------------------------------------------------------------------
    def _open_rig(self, knobs: dict[str, Knob]) -> RigJournal:
        p = self.params
        if p.resume and p.restart:
            raise UsageError("--resume and --restart exclude each other", "pick one")
        for device_id in self.device_ids:
            journal.check_safety_state(device_id)
        existing = RigJournal.open_existing(self.device_ids)
        self._check_not_running(existing)
        unresolved = existing is not None and existing.unresolved()
        if unresolved and not (p.resume or p.restart):
            raise UsageError(f"an unfinished rig bisect exists for {','.join(sorted(self.device_ids))}",
                             "continue it with --resume or discard it with --restart (the unsafe lists are kept)")
        if p.resume and (existing is None or not unresolved):
            raise UsageError(f"no unfinished rig bisect for {','.join(sorted(self.device_ids))}",
                             "start a new one without --resume")
        if not p.resume and not p.restart:
            for device_id in self.device_ids:  # before any card is touched, not halfway through the threads
                doc = journal.load(device_id)
                if doc is not None and doc.get("state") in journal.UNRESOLVED:
                    raise UsageError(f"an unfinished bisect session exists for {device_id} ({doc.get('session')})",
                                     "continue the rig with --resume, or start afresh with --restart (the unsafe "
                                     "lists are kept)")
        for device_id in self.device_ids:  # every card from a known state (a kill -9 left them where they were)
            foreign = self.backend.foreign_state(device_id)
            if foreign:
                raise UsageError(f"{foreign}; a bisect starts only from a known state",
                                 "run `tuner reset` (it returns the cards to stock), then start the bisect again")
            if self.backend.reset(device_id).current != knobs[device_id].stock:
                raise NotApplied(f"{device_id} did not return to stock", "run `tuner reset` or reboot before tuning")
        if p.resume:
            assert existing is not None
            existing.claim()
            self._recover(existing, knobs)
            return existing
        if existing is not None and unresolved:
            existing.close(journal.FINISHED, outcome="discarded by --restart")
        search = p.search()
        if search["preset"] is None:
            search["preset"] = default_preset(self.backend.stress_target(self.device_ids[0]))
        return RigJournal.create(self.device_ids, params=search, stock={d: k.stock for d, k in knobs.items()})

    def _check_not_running(self, existing: RigJournal | None) -> None:
        trial = existing.open_trial if existing is not None else None
        if trial is None:
            return
        if (trial.get("boot_id") == journal.current_boot_id() and trial.get("pid") != os.getpid()
                and journal.pid_alive(trial.get("pid"))):
            raise UsageError(f"a rig bisect is already running on {','.join(self.device_ids)} (pid "
                             f"{trial.get('pid')})", "wait for it to finish or stop it first")

    def _recover(self, rig: RigJournal, knobs: dict[str, Knob]) -> None:
        """A rig trial left open by a dead tool or an earlier boot (the per-card journals recover their own)."""
        trial = rig.open_trial
        if trial is None:
            return
        boot = journal.current_boot_id()
        rebooted = boot is not None and trial.get("boot_id") not in (None, boot)
        unknown = boot is None or trial.get("boot_id") is None  # a reset cannot be ruled out: as after one
        settings = {d: int(v) for d, v in trial["settings"].items()}
        attempt = int(trial.get("attempt") or 0)
        if not (rebooted or unknown):
            rig.end_trial()
            self._emit(TrialWarning(f"the tuner died during rig {trial.get('phase')} attempt {attempt} (pid "
                                    f"{trial.get('pid')}) in this boot: not evidence about the voltages; it runs "
                                    "again", device="rig"))
            return
        why = ("the machine froze or reset during this rig run (open in an earlier boot)" if rebooted else
               "the tuner died during this rig run and the boot id is unreadable, so a reset cannot be ruled out")
        if trial.get("phase") == RIG_BASELINE:
            rig.end_trial(baseline={"failed": why})
            return
        backed = {d: self._back_off(knobs[d], d, s, rig) for d, s in settings.items()}
        reasons = dict.fromkeys(settings, why)
        record = {"attempt": attempt, "settings": settings, "passed": False, "pinned": [], "machine_event": why,
                  "reasons": reasons, "backed_off": backed, "recovered": True}
        rig.end_trial(attempts=[*rig.attempts, record], never=[*rig.doc.get("never", []), settings],
                      candidates={**rig.doc.get("candidates", {}), **backed})
        self._emit(RigConfirmFinished(attempt=attempt, passed=False, pinned=(), machine_event=why,
                                      backed_off=backed, reasons=reasons))

    # --- per-card searches ------------------------------------------------------------------------------------
    def _search(self, rig: RigJournal, knobs: dict[str, Knob]) -> dict[str, BisectOutcome]:
        outcomes: dict[str, BisectOutcome] = {}
        errors: dict[str, BaseException] = {}
        threads = []
        for device_id in self.device_ids:
            done = self._finished_outcome(rig, device_id, knobs[device_id])
            if done is not None:
                outcomes[device_id] = done
                continue
            job = self._card_job(rig, device_id)
            with self._emit_lock:
                if self._stop.is_set():
                    break
                self._jobs[device_id] = job

            def work(d: str = device_id, j: BisectJob = job) -> None:
                try:
                    outcomes[d] = j.run()
                except BaseException as e:  # noqa: BLE001 - collected, decided below in the rig's thread
                    errors[d] = e

            thread = threading.Thread(target=work, name=f"bisect-{device_id}", daemon=True)
            threads.append(thread)
            thread.start()
        for thread in threads:
            thread.join()
        with self._emit_lock:
            self._jobs.clear()
        for device_id, error in errors.items():
            if not isinstance(error, TunerError):
                raise error  # KeyboardInterrupt, a bug: every other card is already back at stock (joined)
            failure = BisectFailed(kind="error", reason=error.one_line(), exit_code=error.exit_code, device=device_id)
            self._emit(failure)
            outcomes[device_id] = BisectOutcome("failed", error.exit_code, None, failure=failure)
        for device_id in self.device_ids:
            outcomes.setdefault(device_id, BisectOutcome("stopped", exit_codes.INTERRUPTED, None))
        return {d: outcomes[d] for d in self.device_ids}

    def _card_job(self, rig: RigJournal, device_id: str) -> BisectJob:
        recorded = rig.doc.get("sessions", {}).get(device_id)
        doc = journal.load(device_id)
        ours = doc is not None and (doc.get("session") == recorded or (
            recorded is None and float(doc.get("created_at") or 0) >= float(rig.doc.get("created_at") or 0)))
        resume = bool(ours and doc is not None and doc.get("state") in journal.UNRESOLVED)
        params = replace(self.params, resume=resume, restart=not resume and self.params.restart)
        if not resume and self.params.resume:
            params = replace(params, restart=True)  # a card the rig never got to: its own session starts now
        factory = self._watcher_factory
        per_card: Callable[[], kernel_log.KernelLogWatcher] | None = None
        if factory is not None:
            def per_card() -> kernel_log.KernelLogWatcher:  # each trial its own watcher, for its own card
                return factory(device_id)
        return BisectJob(self.backend, device_id, params, self._card_event(rig), engine_factory=self._engine_factory,
                         kernel_watcher_factory=per_card, take_lock=False)

    def _card_event(self, rig: RigJournal) -> Callable[[BisectEvent], None]:
        def on_event(event: BisectEvent) -> None:
            with self._emit_lock:
                if isinstance(event, SessionStarted) and rig.doc["sessions"].get(event.device) != event.session:
                    rig.update(sessions={**rig.doc["sessions"], event.device: event.session})
                self._emit(event)
        return on_event

    def _finished_outcome(self, rig: RigJournal, device_id: str, knob: Knob) -> BisectOutcome | None:
        """On resume: a card whose search this rig already finished is not searched again."""
        recorded = rig.doc.get("sessions", {}).get(device_id)
        doc = journal.load(device_id)
        if recorded is None or doc is None or doc.get("session") != recorded or doc.get("state") != journal.FINISHED:
            return None
        if doc.get("recommendation") is not None:
            return last_outcome(device_id, knob)
        failure = BisectFailed(kind=str(doc.get("outcome") or "failed"), reason=str(doc.get("reason") or ""),
                               exit_code=exit_codes.TEST_FAILED, device=device_id)
        return BisectOutcome("failed", exit_codes.TEST_FAILED, recorded, failure=failure,
                             trials=tuple(TrialResult.from_record(r) for r in doc.get("trials", [])),
                             params=doc.get("params") or {})

    # --- the whole-rig confirmation ---------------------------------------------------------------------------
    def _back_off(self, knob: Knob, device_id: str, setting: int, rig: RigJournal) -> int:
        step = int(rig.doc.get("steps", {}).get(device_id) or PlanParams.defaults_for(knob).resolution)
        backed = setting - knob.aggressive_direction * step
        return backed if knob.more_aggressive(backed, knob.stock) else knob.stock

    def _trial_params(self, rig: RigJournal, duration_s: float, **kw: Any) -> RigTrialParams:
        s = rig.doc["params"]
        return RigTrialParams(duration_s=duration_s, preset=s.get("preset"), seed=int(s.get("seed") or 0),
                              dtype=s.get("dtype"), compile=s.get("compile"), watchdog=self.params.watchdog,
                              tolerance=bool(s.get("tolerance")), **kw)

    def _call_rig_trial(self, settings: dict[str, int], params: RigTrialParams) -> RigTrialResult:
        watcher = self._watcher_factory
        return self._rig_trial(self.backend, settings, params, self._emit, self._stop,
                               engine_factory=self._engine_factory, kernel_watcher_factory=watcher)

    def _confirm(self, rig: RigJournal, knobs: dict[str, Knob], per_card: dict[str, BisectOutcome]) -> RigOutcome:
        recs = {d: o.recommendation for d, o in per_card.items() if o.recommendation is not None}
        reasons = {d: o.summary for d, o in per_card.items() if o.recommendation is None}
        if rig.phase == "search":
            rig.update(phase="baseline" if len(recs) >= 2 else "done",
                       candidates={d: r.setting for d, r in recs.items()},
                       steps={d: int(per_card[d].params.get("resolution") or
                                     PlanParams.defaults_for(knobs[d]).resolution) for d in recs})
        if len(recs) < 2:  # nothing to confirm together: one card's own confirmation is its whole story
            return self._finish(rig, per_card, {d: r.setting for d, r in recs.items()}, reasons, (), knobs)
        for device_id in recs:  # every rig run on a card at the lock its own search ran at (a resume sets it again)
            lock_at_baseline_clock(self.backend, device_id, per_card[device_id].trials)
        gemm = rig.doc["params"].get("mode") == "gemm"
        attempts: list[RigTrialResult] = []
        stock = {d: knobs[d].stock for d in recs}
        refs = {d: rig_reference_path(d, rig.session) for d in recs}
        if rig.phase == "baseline":
            failed = (rig.doc.get("baseline") or {}).get("failed")
            if failed is None and not gemm:
                self._emit(RigConfirmStarted(settings=stock, unit_by_device={d: knobs[d].unit for d in recs},
                                             duration_s=float(rig.doc["params"]["trial_s"]), attempt=0,
                                             phase=RIG_BASELINE))
                rig.begin_trial(RIG_BASELINE, 0, stock)
                res = self._call_rig_trial(stock, self._trial_params(
                    rig, float(rig.doc["params"]["trial_s"]), mode="train", record_paths=refs, phase=RIG_BASELINE))
                if res.stopped or self._stop.is_set():
                    rig.end_trial()
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
                return self._finish(rig, per_card, {}, {**reasons, **dict.fromkeys(recs, why)}, (), knobs)
            rig.update(phase="confirm")
        while rig.phase == "confirm":
            candidates = {d: int(v) for d, v in rig.doc["candidates"].items()}
            while rig.never(candidates) and any(v != knobs[d].stock for d, v in candidates.items()):
                candidates = {d: self._back_off(knobs[d], d, v, rig) for d, v in candidates.items()}
            attempt = len(rig.attempts) + 1
            if attempt > self._max_attempts or rig.never(candidates):
                why = (f"the rig confirmation failed {len(rig.attempts)} times (at most {self._max_attempts} "
                       "attempts); each card's own recommendation stands, but not together")
                return self._finish(rig, per_card, {}, {**reasons, **dict.fromkeys(candidates, why)},
                                    tuple(attempts), knobs)
            confirm_s = float(rig.doc["params"]["confirm_s"])
            self._emit(RigConfirmStarted(settings=candidates, unit_by_device={d: knobs[d].unit for d in candidates},
                                         duration_s=confirm_s, attempt=attempt))
            rig.begin_trial(RIG_CONFIRM, attempt, candidates)
            res = self._call_rig_trial(candidates, self._trial_params(
                rig, confirm_s, mode="gemm" if gemm else "mixed",
                reference_paths=None if gemm else refs, phase=RIG_CONFIRM))
            if res.stopped or self._stop.is_set():
                rig.end_trial()
                return self._stopped(rig, per_card, reasons)
            attempts.append(res)
            verdict = self._judge(res, candidates, knobs, rig)
            rig.end_trial(attempts=[*rig.attempts, verdict["record"]], candidates=verdict["candidates"],
                          dropped={**rig.doc.get("dropped", {}), **verdict["dropped"]},
                          phase="done" if verdict["final"] else "confirm")
            self._emit(RigConfirmFinished(attempt=attempt, passed=verdict["record"]["passed"],
                                          pinned=tuple(verdict["record"]["pinned"]),
                                          machine_event=res.machine_event, backed_off=verdict["backed"],
                                          reasons=verdict["record"]["reasons"]))
        return self._final(rig, per_card, reasons, tuple(attempts), knobs)

    def _judge(self, res: RigTrialResult, candidates: dict[str, int], knobs: dict[str, Knob],
               rig: RigJournal) -> dict:
        """What one confirmation attempt means: passed, or which cards back off (and which drop out)."""
        failing = {d: r for d, r in res.results.items() if d in candidates and r.verdict == "fail"}
        errors = {d: r for d, r in res.results.items() if d in candidates and r.verdict == "error"}
        missing = [d for d in candidates if d not in res.results]
        pinned = [d for d in res.pinned if d in candidates] or list(failing)
        reasons = {d: f"{r.verdict} ({r.kind}: {r.reason})" for d, r in {**failing, **errors}.items()}
        for d in missing:
            reasons[d] = "no result from the rig run"
        unsure = {d: r for d, r in res.results.items()
                  if d in candidates and r.verdict not in ("pass", "fail", "error")}
        for d, r in unsure.items():  # inconclusive (too few steps compared, a rank stopped by another's fault)
            reasons.setdefault(d, f"{r.verdict} ({r.kind}: {r.reason})")
        passed = not (failing or errors or missing or unsure or res.machine_event or res.pinned)
        backed: dict[str, int] = {}
        dropped: dict[str, str] = {}
        final = passed
        if res.machine_event:
            backed = {d: self._back_off(knobs[d], d, v, rig) for d, v in candidates.items()}
            if all(v == knobs[d].stock for d, v in candidates.items()):  # at stock: not a voltage problem
                why = f"a whole-machine event at stock in the rig run ({res.machine_event})"
                dropped = dict.fromkeys(candidates, why)
                backed, final = {}, True
        elif pinned:
            for d in pinned:
                if candidates[d] == knobs[d].stock:
                    dropped[d] = (f"fails the data-parallel confirmation even at stock ({reasons.get(d, 'pinned')}):"
                                  " not a voltage problem; check the card, its cooling and its PCIe link")
                else:
                    backed[d] = self._back_off(knobs[d], d, candidates[d], rig)
        elif errors and not failing:  # setup trouble (a rank that never ran, a collective that never formed):
            why = "; ".join(f"{d}: {r.kind}: {r.reason}" for d, r in errors.items())  # not the voltage, as for
            dropped = dict.fromkeys(candidates, f"the data-parallel run could not run ({why})")  # one card
            final = True
        # otherwise (an inconclusive run nobody is blamed for): the same settings run again, within the bound
        new = {d: v for d, v in {**candidates, **backed}.items() if d not in dropped}
        if len(new) < 1:
            final = True
        record = {"attempt": len(rig.attempts) + 1, "settings": candidates, "passed": passed, "pinned": pinned,
                  "collective": getattr(res, "collective", None),  # kept so a profile saved after --resume says it
                  "machine_event": res.machine_event, "reasons": reasons, "backed_off": new,
                  "results": {d: r.to_record() for d, r in res.results.items()}}
        return {"record": record, "candidates": new, "backed": new if not passed else {}, "dropped": dropped,
                "final": final}

    def _final(self, rig: RigJournal, per_card: dict[str, BisectOutcome], reasons: dict[str, str],
               attempts: tuple[RigTrialResult, ...], knobs: dict[str, Knob]) -> RigOutcome:
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
        return self._finish(rig, per_card, settings, reasons, attempts, knobs)

    def _stopped(self, rig: RigJournal, per_card: dict[str, BisectOutcome], reasons: dict[str, str]) -> RigOutcome:
        rig.close(journal.INTERRUPTED)
        return RigOutcome("stopped", exit_codes.INTERRUPTED, per_card, {}, reasons=reasons, session=rig.session,
                          attempts=tuple(rig.attempts))

    def _finish(self, rig: RigJournal, per_card: dict[str, BisectOutcome], settings: dict[str, int],
                reasons: dict[str, str], attempts: tuple[RigTrialResult, ...], knobs: dict[str, Knob]) -> RigOutcome:
        missing = {d: reasons.get(d, "no recommendation") for d in self.device_ids if d not in settings}
        if not missing:
            status, code = "recommended", exit_codes.OK
        else:
            status = "failed" if not settings else "partial"
            codes = [per_card[d].exit_code for d in self.device_ids if per_card[d].exit_code != exit_codes.OK]
            code = (exit_codes.HARDWARE if exit_codes.HARDWARE in codes else codes[0] if codes
                    else exit_codes.TEST_FAILED)
        recs = {d: per_card[d].recommendation for d in settings}
        rig.close(journal.FINISHED, phase="done", outcome=status, settings=settings, reasons=missing)
        if settings:
            self._emit(RigRecommendation(settings=dict(settings),
                                         per_card={d: r for d, r in recs.items() if r is not None}))
        return RigOutcome(status, code, per_card, dict(settings), attempts, missing, session=rig.session,
                          attempts=tuple(rig.attempts))


__all__ = ["MAX_RIG_ATTEMPTS", "RigBisectJob", "RigOutcome"]
