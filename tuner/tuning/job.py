"""The bisect driver: runs the trials the state machine (`bisect_plan`) asks for, journals every step durably,
recovers trials left open by a dead tool or an earlier boot, and turns the outcome into a recommendation.

A plain class for both the CLI and the TUI's thread worker: `BisectJob(...).run()` blocks and returns a
`BisectOutcome`; `stop()` is thread-safe (the running engine is stopped, the card reset to stock and verified,
the journal closed as resumable). Events go to `on_event`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace

from tuner.backends.base import Backend
from tuner.core import exit_codes
from tuner.core.card_lock import CardLock
from tuner.core.errors import DeviceLost, DiskFull, NotApplied, UsageError
from tuner.core.models import DeviceInfo, Knob, Mode
from tuner.tuning import evidence, journal, kernel_log, load_check
from tuner.tuning.engine_client import WatchdogPolicy, default_preset
from tuner.tuning.events import (
    BisectEvent,
    BisectFailed,
    BisectStopped,
    Recommendation,
    SessionStarted,
    TrialEvent,
    TrialFinished,
    TrialProgress,
    TrialRecovered,
    TrialResult,
    TrialStarted,
    TrialWarning,
)
from tuner.tuning.plan import (
    BASELINE,
    CONFIRM,
    CONTROL,
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
from tuner.tuning.trial import STOPPED, TrialParams, run_trial

MODES = tuple(Mode)


@dataclass(frozen=True)
class BisectParams:
    """What `tuner bisect` (or the TUI's form) asks for. Settings in the knob's unit; None = the default."""

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

    SEARCH_KEYS = ("step", "resolution", "margin", "trial_s", "confirm_s", "floor", "mode", "preset", "dtype",
                   "seed", "tolerance", "compile")

    def plan_params(self, knob: Knob) -> PlanParams:
        """The plan's parameters for `knob`: a None here is the plan's default for that card."""
        return PlanParams.defaults_for(knob, step=self.step, resolution=self.resolution, margin=self.margin,
                                       floor=self.floor)

    def search(self) -> dict:
        return {k: getattr(self, k) for k in self.SEARCH_KEYS}


@dataclass(frozen=True)
class BisectOutcome:
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
        r = self.recommendation
        if r is None:
            return None
        p = self.params
        return {
            "baseline_tok_s": r.baseline_tok_s, "tuned_tok_s": r.tuned_tok_s,
            "baseline_power_w": r.baseline_power_w, "tuned_power_w": r.tuned_power_w,
            "baseline_tok_per_j": r.baseline_tok_per_j, "tuned_tok_per_j": r.tuned_tok_per_j,
            "efficiency_gain_pct": r.efficiency_gain_pct, "first_failure": r.first_failure,
            "lowest_pass": r.lowest_pass, "confirmed": r.confirmed, "margin": r.margin,
            "step": p.get("step"), "resolution": p.get("resolution"), "trial_duration_s": p.get("trial_s"),
            "confirm_duration_s": p.get("confirm_s"), "preset": p.get("preset"), "mode": p.get("mode"),
            "dtype": p.get("dtype"), "sensitivity": r.sensitivity,
            "trials": [t.profile_trial() for t in self.trials],
        }


class BisectJob:
    def __init__(self, backend: Backend, device_id: str, params: BisectParams,
                 on_event: Callable[[BisectEvent], None] | None = None, *,
                 engine_factory: Callable | None = None,
                 kernel_watcher_factory: Callable[[], kernel_log.KernelLogWatcher] | None = None,
                 take_lock: bool = True):
        """`take_lock=False`: the caller already holds this card's writer lock (a rig bisect holds every card's
        for its whole life) and the job must not try to take it again (a lock is one holder per process)."""
        self.backend, self.device_id, self.params = backend, device_id, params
        self._take_lock = take_lock
        self._emit_cb = on_event or (lambda ev: None)
        self._engine_factory = engine_factory
        self._kernel_watcher_factory = kernel_watcher_factory
        self._stop = threading.Event()
        self._journal: journal.Journal | None = None
        self._trial_wall_s: list[float] = []

    # --- public -----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Thread-safe: end the running trial (engine stopped, card reset and verified); run() then returns."""
        self._stop.set()

    def run(self) -> BisectOutcome:
        """Run the whole search; the card's writer lock is held for all of it, so no `set`, `apply` or `reset`
        from another shell (or the TUI) can change the card under a trial (CardBusy names the bisect)."""
        if not self._take_lock:
            return self._run()
        with CardLock(self.device_id, f"auto-bisect of {self.device_id}"):
            return self._run()

    def _run(self) -> BisectOutcome:
        device = self.backend.device(self.device_id)
        knob = self.backend.knob(self.device_id)
        j, params, resumed = self._open_session(device, knob)
        self._journal = j
        search = params
        plan_params = PlanParams.defaults_for(knob, step=search["step"], resolution=search["resolution"],
                                              margin=search["margin"], floor=search["floor"],
                                              replay_baseline=search["mode"] != "gemm", stock_control=True)
        unsafe = journal.unsafe_settings(self.device_id)
        plan = BisectPlan(knob, plan_params, unsafe=list(unsafe),
                          unsafe_edge=any(e.get("edge") for e in unsafe.values()))
        search = {**search, "step": plan_params.step, "resolution": plan_params.resolution,
                  "margin": plan_params.margin}
        self._emit(SessionStarted(session=j.session, device=self.device_id, label=device.label, unit=knob.unit,
                                  stock=knob.stock, resumed=resumed, params=search, unsafe=tuple(sorted(unsafe))))
        try:
            return self._loop(plan, knob, j, search)
        except BaseException:
            # KeyboardInterrupt / Terminated in the caller's thread: run_trial already reset the card
            if j.open_trial is not None:
                j.abandon_trial("interrupted")
            if j.state != journal.FINISHED:
                j.close(journal.INTERRUPTED)
            raise

    # --- session ----------------------------------------------------------------------------------------------
    def _open_session(self, device: DeviceInfo, knob: Knob) -> tuple[journal.Journal, dict, bool]:
        p = self.params
        journal.check_safety_state(self.device_id)  # a damaged unsafe list, journal or guard: refuse (fail closed)
        if p.resume and p.restart:
            raise UsageError("--resume and --restart exclude each other", "pick one")
        if p.mode not in MODES:
            raise UsageError(f"unknown mode {p.mode!r}", f"use one of {', '.join(MODES)}")
        if not (p.trial_s >= 1 and p.confirm_s >= 1):  # also catches NaN
            raise UsageError(f"trials of {min(p.trial_s, p.confirm_s):g} s are too short to compare anything",
                             "give --trial and --confirm of at least 1 s (the defaults are 5m and 30m)")
        check_params(knob, p.plan_params(knob))  # before touching anything
        existing = journal.Journal.open_existing(self.device_id)
        if existing is not None and existing.open_trial is not None:
            self._check_not_running(existing)
        if existing is not None and existing.unresolved() and not (p.resume or p.restart):
            n = len(existing.trials)
            raise UsageError(
                f"an unfinished bisect session exists for {self.device_id} ({existing.session}, {n} trials "
                "done)", "continue it with --resume or discard it with --restart (the unsafe list is kept)")
        if p.resume and (existing is None or not existing.unresolved()):
            raise UsageError(f"no unfinished bisect session for {self.device_id}", "start a new one without --resume")
        foreign = self.backend.foreign_state(self.device_id)  # PenguinBurner: every offset reads 0 first
        if foreign:
            raise UsageError(f"{foreign}; a bisect starts only from a known state",
                             "run `tuner reset` (it returns the card to stock), then start the bisect again")
        self._reset_to_stock()
        if existing is not None and existing.open_trial is not None:
            self._recover(existing, knob, device)
        if p.resume:
            assert existing is not None  # a --resume without an unfinished session was refused above
            existing.claim()
            stored = existing.doc.get("params") or {}
            params = {k: stored.get(k, getattr(p, k)) for k in BisectParams.SEARCH_KEYS}
            return existing, params, True
        if existing is not None and existing.unresolved():
            existing.close(journal.FINISHED, outcome="discarded by --restart")
        params = p.search()
        if params["preset"] is None:
            params["preset"] = default_preset(self.backend.stress_target(self.device_id))
        j = journal.Journal.create(self.device_id, params=params, knob=knob.to_dict(), serial=device.serial)
        return j, params, False

    def _check_not_running(self, existing: journal.Journal) -> None:
        trial = existing.open_trial
        if trial is None:
            return
        boot = journal.current_boot_id()
        if (trial.get("boot_id") == boot and trial.get("pid") != os.getpid()
                and journal.pid_alive(trial.get("pid"))):
            raise UsageError(f"a bisect is already running on {self.device_id} (pid {trial.get('pid')})",
                             "wait for it to finish or stop it first")

    def _recover(self, existing: journal.Journal, knob: Knob, device: DeviceInfo) -> None:
        """An open trial whose process is gone. Left by an earlier boot: the machine froze or reset, a failure and
        an unsafe value. Left in this boot: the tuner died (kill -9, a full disk), which says nothing about the
        voltage: inconclusive, and the plan runs it again."""
        trial = existing.open_trial
        if trial is None:
            return
        boot = journal.current_boot_id()
        setting, phase = int(trial["setting"]), trial.get("phase", "coarse")
        rebooted = boot is not None and trial.get("boot_id") not in (None, boot)
        # Without both boot ids a reset cannot be ruled out: fail closed, as after a reset.
        unknown = boot is None or trial.get("boot_id") is None
        if phase == BASELINE and not rebooted:
            existing.abandon_trial("the tuner died during the baseline (at stock); it runs again")
            return
        if unknown and not rebooted:
            lines, kind, edge = None, "system-reset", True
            reason = ("the tuner died during this trial and the boot id is unreadable, so a machine reset cannot "
                      "be ruled out")
        elif rebooted:
            target = self.backend.stress_target(self.device_id)
            lines = None if target.simulated else kernel_log.previous_boot_events(target.pci_bus_id)
            kind = "system-reset"
            reason = ("the machine froze or reset during this trial (open in an earlier boot)"
                      + (f"; previous boot's kernel log: {lines[-1][:160]}" if lines else
                         "; previous boot's kernel log unavailable"))
            edge = True
        else:
            result = TrialResult(setting=setting, unit=knob.unit, phase=phase, verdict=evidence.INCONCLUSIVE,
                                 kind=evidence.TOOL_DIED, reason=f"the tuner died during this trial (pid "
                                 f"{trial.get('pid')}) in this boot: not evidence about the voltage; it runs again",
                                 started_at=trial.get("started_at"), simulated=device.simulated)
            existing.record_recovered(result.to_record())
            self._emit(TrialRecovered(result))
            return
        result = TrialResult(setting=setting, unit=knob.unit, phase=phase, verdict="fail", kind=kind,
                             reason=reason, edge=edge, kernel_log=tuple(lines or ()),
                             started_at=trial.get("started_at"), simulated=device.simulated)
        existing.record_recovered(result.to_record())
        if setting != knob.stock:
            journal.add_unsafe(self.device_id, setting, unit=knob.unit, kind=kind, reason=reason, edge=edge,
                               session=existing.session, serial=device.serial, kernel_log=lines)
        self._emit(TrialRecovered(result))

    def _reset_to_stock(self) -> None:
        knob = self.backend.reset(self.device_id)
        if knob.current != knob.stock:
            raise NotApplied(f"{self.device_id} did not return to stock (reads {knob.current:+d} {knob.unit})",
                             "run `tuner reset` or reboot before tuning")

    # --- the loop ---------------------------------------------------------------------------------------------
    def _loop(self, plan: BisectPlan, knob: Knob, j: journal.Journal, search: dict) -> BisectOutcome:
        while True:
            results = [TrialResult.from_record(r) for r in j.trials]
            if self._stop.is_set():
                return self._stopped(j, results, search, "stopped on request")
            decision = plan.decide([PlanResult.from_record(r) for r in j.trials])
            if isinstance(decision, Recommend):
                return self._recommend(decision, knob, j, results, search)
            if isinstance(decision, Stop):
                code = exit_codes.TEST_FAILED
                failure = BisectFailed(kind=decision.kind, reason=decision.reason, exit_code=code)
                self._emit(failure)
                j.close(journal.FINISHED, outcome=decision.kind, reason=decision.reason)
                return BisectOutcome("failed", code, j.session, failure=failure, trials=tuple(results),
                                     params=search)
            assert isinstance(decision, NextTrial)
            if decision.setting in journal.unsafe_settings(self.device_id):  # the plan never proposes these
                raise AssertionError(f"refusing to apply unsafe {decision.setting}")
            outcome = self._run_one(decision, plan, knob, j, results, search)
            if outcome is not None:
                return outcome

    def _trial_params(self, decision: NextTrial, j: journal.Journal, results: list[TrialResult],
                      search: dict) -> TrialParams:
        mode = search["mode"]
        reruns = evidence.short_reruns(j.trials, decision.setting, decision.phase)  # too short before: longer
        trial_s = evidence.rerun_duration_s(float(search["trial_s"]), reruns)
        confirm_s = evidence.rerun_duration_s(float(search["confirm_s"]), reruns)
        baseline = next((r for r in reversed(results) if r.phase == BASELINE and r.passed), None)
        common = {"phase": decision.phase, "preset": search["preset"], "seed": int(search["seed"]),
                  "dtype": search.get("dtype"), "compile": search.get("compile"), "watchdog": self.params.watchdog,
                  "baseline_tok_per_j": baseline.tok_per_j if baseline else None,
                  "baseline_voltage_mv": baseline.voltage_mv if baseline else None,
                  "tolerance": bool(search.get("tolerance"))}
        if decision.phase == BASELINE:
            if mode == "gemm":  # the GEMM burn has no training trajectory to record
                return TrialParams(duration_s=trial_s, mode=mode, **common)
            # One trial long: later runs loop the reference (--reference-loop), so it covers any length.
            return TrialParams(duration_s=trial_s, mode="train", record_path=j.reference, **common)
        reference = j.reference if mode != "gemm" and j.reference.exists() else None
        if decision.phase == REPLAY and baseline is not None:
            # The whole recording, replayed in a second process at stock and compared bit for bit (see
            # docs/engine.md, "Repeatability proven": runs that diverge often do so only after 100+ steps).
            return TrialParams(duration_s=baseline.duration_s or trial_s, steps=max(1, baseline.steps or 1),
                               mode="train", reference_path=reference, verify_repeatable=True, **common)
        if decision.phase == CONTROL:
            steps = control_steps(results[-1] if results else None)
            return TrialParams(duration_s=trial_s, steps=steps, mode="train", reference_path=reference, **common)
        if decision.phase == CONFIRM:
            return TrialParams(duration_s=confirm_s, mode="gemm" if mode == "gemm" else "mixed",
                               reference_path=reference, **common)
        return TrialParams(duration_s=trial_s, mode=mode, reference_path=reference, **common)

    def _run_one(self, decision: NextTrial, plan: BisectPlan, knob: Knob, j: journal.Journal,
                 results: list[TrialResult], search: dict) -> BisectOutcome | None:
        reruns = evidence.short_reruns(j.trials, decision.setting, decision.phase)
        if reruns > evidence.MAX_SHORT_RERUNS:
            return self._too_short(j, results, search, decision, knob)
        tp = self._trial_params(decision, j, results, search)
        if decision.phase != BASELINE and tp.mode != "gemm" and tp.reference_path is None:
            # the reference was lost (resumed on another machine, state dir cleaned): record it again
            j.doc["trials"] = [r for r in j.trials if r.get("phase") != BASELINE]
            j.set_field("trials", j.doc["trials"])
            return None
        index = len(results) + 1
        j.begin_trial(decision.setting, decision.phase)
        open_trial = j.open_trial
        assert open_trial is not None  # begin_trial has just written it
        short, confirms = plan.remaining_estimate([PlanResult.from_record(r) for r in j.trials])
        rest_s = short * float(search["trial_s"]) + confirms * float(search["confirm_s"])
        if decision.phase != CONFIRM:
            rest_s -= float(search["trial_s"])
        else:
            rest_s -= float(search["confirm_s"])
        rest_s = max(0.0, rest_s)
        self._emit(TrialStarted(index=index, setting=decision.setting, unit=knob.unit, phase=decision.phase,
                                duration_s=tp.duration_s, started_at=open_trial["started_at"],
                                expected_trials=index - 1 + short + confirms))

        def on_trial_event(ev: TrialEvent) -> None:
            if isinstance(ev, TrialProgress):
                ev = replace(ev, eta_total_s=round(ev.eta_s + rest_s, 1))
            self._emit(ev)

        lock_at_baseline_clock(self.backend, self.device_id, results)
        watcher = self._kernel_watcher_factory() if self._kernel_watcher_factory else None
        try:
            result = run_trial(self.backend, self.device_id, decision.setting, tp, on_trial_event, self._stop,
                               engine_factory=self._engine_factory, kernel_watcher=watcher)
        except NotApplied as e:
            j.abandon_trial(f"not applied: {e.message}")
            return self._hardware_failure(j, results, search, "not-applied", e.one_line())
        except DeviceLost as e:
            lost = TrialResult(setting=decision.setting, unit=knob.unit, phase=decision.phase, verdict="fail",
                               kind="device-lost", reason=e.one_line(), edge=True)
            j.finish_trial(lost.to_record())
            if decision.setting != knob.stock:
                journal.add_unsafe(self.device_id, decision.setting, unit=knob.unit, kind="device-lost",
                                   reason=e.one_line(), edge=True, session=j.session)
            self._emit(TrialFinished(index, lost))
            return self._hardware_failure(j, [*results, lost], search, "device-lost", e.one_line())
        if result.verdict == STOPPED:
            j.abandon_trial("stopped")
            return self._stopped(j, results, search, "stopped on request")
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
        j.finish_trial(result.to_record())
        if result.kind == evidence.ENGINE_KILLED:  # re-running now could meet the same killer (the OOM killer)
            self._emit(TrialFinished(index, result))
            return self._stopped(j, results, search, result.reason)
        if result.kind == evidence.DISK_FULL:  # run() closes the session as resumable
            self._emit(TrialFinished(index, result))
            raise DiskFull(f"the disk holding {journal.journal_dir()} is full; the trial at {decision.setting:+d} "
                           f"{knob.unit} did not count", f"free disk space, then `tuner bisect --device "
                           f"{self.device_id} --resume`")
        if result.verdict == "fail" and result.edge and decision.setting != knob.stock:
            journal.add_unsafe(self.device_id, decision.setting, unit=knob.unit, kind=result.kind or "hang",
                               reason=result.reason, edge=True, session=j.session,
                               kernel_log=list(result.kernel_log))
        if result.effective is False:
            self._emit(TrialWarning(next(w for w in result.warnings if w.startswith("not effective"))))
        self._emit(TrialFinished(index, result))
        return None

    # --- endings ----------------------------------------------------------------------------------------------
    def _stopped(self, j: journal.Journal, results: list[TrialResult], search: dict, reason: str) -> BisectOutcome:
        j.close(journal.INTERRUPTED)
        self._emit(BisectStopped(reason=reason, resumable=True))
        return BisectOutcome("stopped", exit_codes.INTERRUPTED, j.session, trials=tuple(results), params=search)

    def _too_short(self, j: journal.Journal, results: list[TrialResult], search: dict, decision: NextTrial,
                   knob: Knob) -> BisectOutcome:
        last = next(r for r in reversed(j.trials) if r.get("setting") == decision.setting
                    and r.get("kind") == evidence.TOO_SHORT)
        reason = (f"{decision.phase} trials at {decision.setting:+d} {knob.unit} compared too few steps "
                  f"({last.get('steps')} steps, {last.get('warmup_steps') or 0} of them warm-up) even at "
                  f"{evidence.RERUN_FACTOR ** evidence.MAX_SHORT_RERUNS}x the duration; a pass needs "
                  f"{evidence.MIN_COMPARED_STEPS} compared steps: give a longer --trial / --confirm")
        failure = BisectFailed(kind=evidence.TOO_SHORT, reason=reason, exit_code=exit_codes.TEST_FAILED)
        self._emit(failure)
        j.close(journal.FINISHED, outcome=evidence.TOO_SHORT, reason=reason)
        return BisectOutcome("failed", exit_codes.TEST_FAILED, j.session, failure=failure, trials=tuple(results),
                             params=search)

    def _hardware_failure(self, j: journal.Journal, results: list[TrialResult], search: dict, kind: str,
                          reason: str) -> BisectOutcome:
        failure = BisectFailed(kind=kind, reason=reason, exit_code=exit_codes.HARDWARE)
        self._emit(failure)
        j.close(journal.INTERRUPTED, reason=reason)
        return BisectOutcome("failed", exit_codes.HARDWARE, j.session, failure=failure, trials=tuple(results),
                             params=search)

    def _recommend(self, d: Recommend, knob: Knob, j: journal.Journal, results: list[TrialResult],
                   search: dict) -> BisectOutcome:
        baseline = next((r for r in reversed(results) if r.phase == BASELINE and r.passed), None)
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
        )
        self._emit(rec)
        j.close(journal.FINISHED, outcome="recommended", recommendation=asdict(rec))
        return BisectOutcome("recommended", exit_codes.OK, j.session, recommendation=rec, trials=tuple(results),
                             params=search)

    def _emit(self, event: BisectEvent) -> None:
        if getattr(event, "device", None) == "":  # every event names its card (several run at once in a rig)
            event = replace(event, device=self.device_id)
        try:
            self._emit_cb(event)
        except Exception:  # noqa: BLE001 - a broken display must not leave the card undervolted
            pass


CONTROL_MARGIN_STEPS = 20  # a control runs at least this many steps past the failure's step...
CONTROL_MARGIN_FRACTION = 0.25  # ...or a quarter more, whichever is larger


def control_steps(failed: TrialResult | None) -> int:
    """Steps of a control at stock: as many as the failure took, plus a margin (so the control passes the step at
    which the failing trial diverged, with room for divergence that depends on time, e.g. another process)."""
    at = (failed.fault_step or failed.steps or 1) if failed is not None else 1
    return at + max(CONTROL_MARGIN_STEPS, int(at * CONTROL_MARGIN_FRACTION))


def lock_at_baseline_clock(backend: Backend, device_id: str, results: Sequence[TrialResult]) -> None:
    """NVIDIA: lock at the clock the card sustained under its passing stock baseline, not the V/F table top (which
    caps nothing). Every trial of a card's search and every rig run on it is made at this lock; the lock is the
    process's choice, so a resumed session sets it again from the journal's baseline. No-op on other cards."""
    baseline = next((r for r in reversed(results) if r.phase == BASELINE and r.passed), None)
    if baseline is not None and baseline.median_core_clock_mhz:
        backend.lock_at_measured_clock(device_id, baseline.median_core_clock_mhz)


def last_outcome(device_id: str, knob: Knob) -> BisectOutcome:
    """The finished session's outcome, rebuilt from the journal (validated on load), for saving it as a profile
    after the fact (`tuner bisect --save NAME --from-last`: the save at the end of the run failed, or was not
    asked for). UsageError when the last session did not end with a recommendation."""
    doc = journal.load(device_id)
    if doc is None or doc.get("state") != journal.FINISHED or doc.get("recommendation") is None:
        raise UsageError(f"no finished bisect with a recommendation for {device_id} in "
                         f"{journal.journal_path(device_id)}",
                         "run `tuner bisect` (a new bisect replaces the last one's result)")
    names = {f.name for f in fields(Recommendation)}
    rec = Recommendation(**{"device": device_id, **{k: v for k, v in doc["recommendation"].items() if k in names}})
    stored = doc["params"]
    pp = PlanParams.defaults_for(knob, step=stored.get("step"), resolution=stored.get("resolution"),
                                 margin=stored.get("margin"), floor=stored.get("floor"))
    search = {**stored, "step": pp.step, "resolution": pp.resolution, "margin": pp.margin}
    trials = tuple(TrialResult.from_record(r) for r in doc["trials"])
    return BisectOutcome("recommended", exit_codes.OK, doc["session"], recommendation=rec, trials=trials,
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


__all__ = ["BisectJob", "BisectOutcome", "BisectParams", "last_outcome"]


def _with_load_report(result: TrialResult, preset: str | None) -> tuple[TrialResult, str | None]:
    """The baseline's load against the card's power limit, and a warning when it is light."""
    note = load_check.load_note(result.power_w, result.power_limit_w)
    light = load_check.light_load_warning(result.power_w, result.power_limit_w, preset=preset,
                                          throttle_reasons=result.throttle_reasons)
    return (replace(result, load_note=note) if note else result), light
