"""One card's screen: its engine runs (through the stress action, `tuner.actions.stress`), the fault attribution,
the error counters before and after, and the verdict (`tuner.actions.screen.verdict.CardVerdict`).

Every engine run is a stress run of the stress action with the bundled trajectory as its reference (`given`): the
same engine request, canary, watchdog, kernel-log watch and load marker as `tuner stress` and the Tune screen. The
workload (preset, seed, dtype, compile) is the reference's; the engine pins the batch to it and refuses a run
whose fingerprint differs (that refusal is `incomparable`, naming the keys).

Writes: none, except two excursions, each a keep-or-revert change (`PendingChange`, `_excursion`: the value
validated, written and read back; on leaving, normally or not, always reverted: the previous value written back and
read back, or stock when it cannot be, said) under the card's writer lock, which the whole screen holds:
- with `tuner screen --profile NAME`, the profile's setting for the whole screen (`profile_setting`, checked as
  `tuner apply` checks it), put back to the card's own setting when the screen ends: a profile's value is never
  left on the card (`tuner apply NAME` keeps it);
- the stock run of a fault's attribution on a card that is not at stock, put back to the setting screened.
Once the card is back at its own setting, that value is kept (through the root helper it would otherwise be put
back); the profile's value, put back to after a stock run, is never kept, so whatever ends this process, the helper
puts the card's own setting back. A hang, a lost card or a GPU reset is never re-run, and that value goes on the
unsafe list (never applied again automatically); the card is then left as it reads back (a driver reset puts it at
stock) and the verdict says so.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from tuner.actions.keep_or_revert import PendingChange
from tuner.actions.screen import attribution as at
from tuner.actions.screen import verdict as v
from tuner.actions.screen.profile_setting import ProfileRefused, ProfileSetting
from tuner.actions.screen.tolerance import DEFAULT_MARGIN_NATS, PairedComparison, paired
from tuner.actions.stress import EngineFactory, StressOutcome, StressRequest, StressSession
from tuner.backends.base import Backend
from tuner.core.errors import NoOffsetAllowed, TunerError
from tuner.core.models import DeviceInfo, ErrorCounters, Knob
from tuner.engine.reference import differing_keys
from tuner.profiles import reference_bundle as rb
from tuner.tuning import journal, kernel_log
from tuner.tuning.bound import Bound

Emit = Callable[[str, object], None]  # (device id, event)


@dataclass(frozen=True)
class ScreenPlan:
    """What every card of a screen runs: the reference, the tier (its load per run) and the comparison mode."""

    bundle: rb.Bundle
    trajectory_path: Path  # the bundled trajectory, written out for the engine's --reference
    tier: at.Tier
    tolerance: bool = False  # the labelled tolerance mode: held-out losses, not bits
    margin_nats: float = DEFAULT_MARGIN_NATS
    host: str = ""


# `setting.source` of a card whose driver allows no offset (AMD Overdrive off): its own setting, which is stock
OVERDRIVE_OFF_SOURCE = "current (overdrive off)"
UE_MARKERS = ("uncorrected", "uncorrectable", "_ue", "remap_failure", "remap_pending")


class CardScreen:
    """Screen one card: `run()` blocks (a worker thread per card) and returns its CardVerdict; `stop()` is
    thread-safe. The caller holds the card's writer lock for the whole screen. `profile`: screen at that setting
    (checked by `profile_setting.plan_profile_screen` under the lock), not the card's own."""

    def __init__(self, backend: Backend, device_id: str, plan: ScreenPlan, *, on_event: Emit | None = None,
                 engine_factory: EngineFactory | None = None,
                 kernel_watcher_factory: Callable[[], kernel_log.KernelLogWatcher] | None = None,
                 profile: ProfileSetting | None = None):
        self.backend, self.device_id, self.plan, self.profile = backend, device_id, plan, profile
        self._holding = False  # the profile's setting is on the card for this screen: nothing is kept meanwhile
        self._emit = on_event or (lambda device_id, event: None)
        self._engine_factory = engine_factory
        self._watcher_factory = kernel_watcher_factory
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._session: StressSession | None = None
        self.runs: list[tuple[at.RunSummary, StressOutcome | None]] = []
        self.notes: list[str] = []
        self.tolerance: PairedComparison | None = None  # the screen run's paired comparison (tolerance mode)
        self._no_offset: NoOffsetAllowed | None = None  # the driver allows no offset: the card runs at stock
        self._attribution_load_s = plan.tier.load_s  # the repeat's and the stock run's load (attribution_load_s)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            session = self._session
        if session is not None:
            session.stop()

    # --- the run ------------------------------------------------------------------------------------------------

    def run(self) -> v.CardVerdict:
        device = self.backend.device(self.device_id)
        knob = self._own_knob()
        differences = [] if self.plan.tolerance else rb.card_differences(self.plan.bundle, device)
        profile = self.profile
        if profile is None or differences or _at(knob, profile):  # nothing to write (an incomparable card: nothing
            if profile is not None and not differences:          # run, so nothing applied)
                self._emit(self.device_id, f"already at profile {profile.name!r}'s setting: nothing written")
            return self._screen(device, knob, differences)
        what = f"profile {profile.name!r}"
        try:
            with self._excursion(profile.value, what, lock_clock_mhz=profile.lock_clock_mhz) as (at_profile, back):
                self._emit(self.device_id, f"at {what}'s setting for this screen only: {knob.current:+d} -> "
                           f"{at_profile.current:+d} {at_profile.unit} (read back); put back afterwards")
                verdict = self._screen(device, at_profile, [])
        except _NotSet as e:  # checked under the lock, yet the card did not take it: it is as it was
            raise ProfileRefused(f"{self.device_id}: {what}'s {profile.value:+d} {knob.unit} could not be applied "
                                 f"({e.cause.message}); the card is as it was", e.cause.remedy,
                                 exit_code=e.cause.exit_code) from None
        left = back[0]
        note = (f"{profile.source}'s {at_profile.current:+d} {at_profile.unit} was applied for this screen only: the "
                f"card is back at {left.current:+d} {left.unit} (read back); `tuner apply {profile.name}` applies "
                "the profile")
        self._emit(self.device_id, note)
        setting = msgspec.structs.replace(verdict.setting, left_at=left.current)
        return msgspec.structs.replace(verdict, setting=setting, reason=f"{verdict.reason}; {note}")

    def _own_knob(self) -> Knob:
        """The card's own setting; with no offset allowed (AMD Overdrive off) the card runs at stock, screened as
        such (`setting.source` says so). A profile's setting cannot be applied there: refused (its one-line fix)."""
        try:
            return self.backend.knob(self.device_id)
        except NoOffsetAllowed as e:
            if self.profile is not None:
                raise
            self._no_offset = e
            return e.at_stock

    def _screen(self, device: DeviceInfo, knob: Knob, differences: list[rb.Difference]) -> v.CardVerdict:
        """The screen at the setting now on the card (`knob`): the runs, the attribution, the verdict."""
        at_stock = knob.current == knob.stock
        counters_before = self._counters()
        first = repeat = stock = None
        if differences:  # no engine run: these bits cannot be expected to match
            first = at.RunSummary("screen", knob.current, at.INCOMPARABLE,
                                  "must-match fields differ: " + "; ".join(d.text() for d in differences))
        else:
            first, differences = self._checked_run("screen", knob.current)
            self._attribution_load_s = at.attribution_load_s(self.plan.tier.load_s, first.duration_s)
            if at.needs_repeat(first) and not self._stop.is_set():
                repeat, _ = self._checked_run("repeat", knob.current)
            if at.needs_stock(first, repeat, at_stock) and not self._stop.is_set():
                stock = self._stock_run(knob)
        counters_after = self._counters()
        decision = at.decide(first, repeat, stock, at_stock=at_stock, unit=knob.unit, tolerance=self.plan.tolerance)
        counters = _counter_doc(counters_before, counters_after)
        risen = _risen(counters)
        if risen and decision.verdict in ("pass", "retest"):
            decision = at.Decision("fail", "drain", "not attributed",
                                   f"uncorrectable error counters rose during the screen ({', '.join(risen)})")
        for run in (first, repeat):  # whichever run hung, lost the card or reset it
            if run is not None and run.outcome == at.HARD:
                self._mark_unsafe(device, knob, run)
        return self._verdict(device, knob, decision, differences, counters, first)

    # --- engine runs ----------------------------------------------------------------------------------------------

    def _request(self, purpose: v.RunPurpose) -> StressRequest:
        fp = self.plan.bundle.engine_fingerprint
        seed = int(fp.get("seed") or 0)
        fault_seed = fault_seed_for(self.backend.device(self.device_id), purpose)
        common: dict[str, Any] = {"preset": self.plan.bundle.preset, "seed": seed, "dtype": fp.get("dtype"),
                                      "compile": bool(fp.get("compile")), "fault_seed": fault_seed}
        if self.plan.tolerance:  # the reference's steps, on its batches, then the held-out windows
            return StressRequest(self.device_id, steps=self.plan.bundle.steps, without_reference=True,
                                 batch_size=fp.get("batch_size"), **common)
        load_s = self.plan.tier.load_s if purpose == "screen" else self._attribution_load_s
        return StressRequest(self.device_id, duration_s=load_s, reference=self.plan.trajectory_path, **common)

    def _engine_run(self, purpose: v.RunPurpose, setting: int) -> at.RunSummary:
        if self._stop.is_set():
            return at.RunSummary(purpose, setting, at.STOPPED, "stopped before it started")
        session = StressSession(self.backend, self._request(purpose), on_event=lambda e: self._emit(self.device_id, e),
                                engine_factory=self._engine_factory, kernel_watcher_factory=self._watcher_factory)
        with self._lock:
            self._session = session
        if self._stop.is_set():
            session.stop()
        try:
            outcome = session.run()
        except TunerError as e:  # refused before anything started (a usage problem of this card)
            summary = at.RunSummary(purpose, setting, at.ERROR, e.one_line())
            self.runs.append((summary, None))
            return summary
        finally:
            with self._lock:
                self._session = None
        summary = summarize(purpose, setting, outcome, tolerance=self.plan.tolerance)
        self.runs.append((summary, outcome))
        return summary

    def _checked_run(self, purpose: v.RunPurpose, setting: int) -> tuple[at.RunSummary, list[rb.Difference]]:
        """An engine run, judged: bitwise by the engine itself; in the tolerance mode by the paired held-out
        comparison afterwards. The must-match fields that differ, when the run could not compare."""
        run = self._engine_run(purpose, setting)
        if run.outcome == at.INCOMPARABLE and run.keys:
            return run, rb.engine_differences(self.plan.bundle, list(run.keys), run.reason)
        if self.plan.tolerance:
            return self._tolerance_check(run)
        return run, []

    def _stock_run(self, knob: Knob) -> at.RunSummary:
        """The same steps at stock, the card put back at `knob.current` afterwards (keep-or-revert: always
        reverted)."""
        try:
            with self._excursion(knob.stock, "stock", note=True):
                return self._checked_run("stock", knob.stock)[0]
        except _NotSet as e:
            summary = at.RunSummary("stock", knob.stock, at.NOT_RUN, f"stock could not be set: {e.cause.one_line()}")
            self.runs.append((summary, None))
            return summary

    @contextmanager
    def _excursion(self, value: int, what: str, *, lock_clock_mhz: int | None = None,
                   note: bool = False) -> Iterator[tuple[Knob, list[Knob]]]:
        """The card at `value` for the block, then back at the setting it had, whatever ends the block: a
        keep-or-revert change (validated, written, read back; reverted to the previous value, read back, or to
        stock with a note). Yields the knob read back and a list that holds, after the block, the knob it was put
        back to. `lock_clock_mhz` (NVIDIA): the locked max clock the value was proven at, set first and put back
        with the value. A value that could not be set raises _NotSet (the card as it was); `note`: say the round
        trip in the verdict's reason.

        The outermost excursion (a profile's, or the stock run's at the card's own setting) keeps the value it puts
        back (through the root helper it would otherwise be put back again); one inside a profile's excursion keeps
        nothing, so the profile's value is never confirmed to the helper."""
        before = self.backend.knob(self.device_id)
        outermost = not self._holding
        change = PendingChange(self.backend, self.device_id, value, timeout_s=float("inf"),
                               lock_clock_mhz=lock_clock_mhz)
        try:
            applied = change.apply()
        except TunerError as e:  # the value never took (a lock clock chosen for it was put back)
            raise _NotSet(e) from e
        self._holding = True
        back: list[Knob] = []
        try:
            yield applied, back
        finally:
            try:
                knob = change.revert()  # the previous value, read back (or stock, with a note, when it cannot be)
            finally:
                self._holding = not outermost
            back.append(knob)
            if change.restore_note:
                self.notes.append(change.restore_note)
            if outermost and knob.current != knob.stock:
                self.backend.keep(self.device_id)  # the user's value, as before: through the helper, kept again
            if note:
                self.notes.append(f"went to {what} ({value:+d} {before.unit}) for the attribution and back to "
                                  f"{knob.current:+d} {knob.unit} (read back)")

    def _tolerance_check(self, run: at.RunSummary) -> tuple[at.RunSummary, list[rb.Difference]]:
        """The tolerance mode's verdict of a finished run: the workload must match, then the paired comparison."""
        outcome = next((o for s, o in reversed(self.runs) if s is run), None)
        result = outcome.result if outcome is not None else None
        if run.outcome != at.PASS or result is None:
            return run, []
        workload = _workload(result.start) if result.start is not None else {}
        differences = rb.tolerance_differences(self.plan.bundle, workload)
        if differences:
            return replace(run, outcome=at.INCOMPARABLE, reason="the workload differs: " + "; ".join(
                d.text() for d in differences)), differences
        ref_losses = self.plan.bundle.recording.eval_losses
        if not ref_losses:
            return replace(run, outcome=at.ERROR, reason="this reference holds no held-out losses (bundled from a "
                           "bisect): record one with `tuner reference record` for the tolerance mode"), []
        end = result.end
        here = tuple(end.eval_losses) if end is not None else ()
        if len(ref_losses) < 2 or len(here) != len(ref_losses):
            return replace(run, outcome=at.ERROR, reason=f"held-out losses: {len(here)} windows here, "
                           f"{len(ref_losses)} in the reference"), []
        comparison = paired(ref_losses, here, self.plan.margin_nats)
        if run.purpose == "screen":
            self.tolerance = comparison
        verdict = comparison.verdict
        if verdict == "pass":
            return replace(run, reason=comparison.text()), []
        if verdict == "fail":
            return replace(run, outcome=at.FAULT, kind="held-out-loss", reason=comparison.text()), []
        return replace(run, outcome=at.ERROR, reason=f"inconclusive: {comparison.text()}"), []

    def _counters(self) -> ErrorCounters:
        try:
            return self.backend.error_counters(self.device_id)
        except TunerError as e:
            return ErrorCounters(why=f"could not be read: {e.one_line()}")

    def _mark_unsafe(self, device: DeviceInfo, knob: Knob, run: at.RunSummary) -> None:
        """A hang, lost card or reset at a setting off stock: never applied again automatically (the bisect's rule)."""
        if run.setting == knob.stock:
            return
        try:
            journal.add_unsafe(device.id, run.setting, unit=knob.unit, kind=run.kind or "hang", reason=run.reason,
                               edge=True, serial=device.serial, kernel_log=list(run.kernel_lines))
            self.notes.append(f"{run.setting:+d} {knob.unit} is on this card's unsafe list now")
        except TunerError as e:
            self.notes.append(f"could not put {run.setting:+d} {knob.unit} on the unsafe list: {e.one_line()}")

    # --- the verdict ----------------------------------------------------------------------------------------------

    def _verdict(self, device: DeviceInfo, knob: Knob, decision: at.Decision, differences: list[rb.Difference],
                 counters: v.CountersDoc, first: at.RunSummary) -> v.CardVerdict:
        try:
            after = self.backend.knob(self.device_id)
        except TunerError:
            after = knob
        source = self.profile.source if self.profile else "current"
        if self._no_offset is not None:
            source = OVERDRIVE_OFF_SOURCE
        reason = decision.reason
        if after.current != knob.current:
            reason += (f"; the card now reads {after.current:+d} {after.unit} (it was {knob.current:+d}: a driver "
                       "reset puts it at stock; nothing was applied again)")
        if self.notes:
            reason += "; " + "; ".join(self.notes)
        runs = [s for s, _ in self.runs]
        fired = _fired(runs, counters)
        screen_outcome = next((o for s, o in self.runs if s.purpose == "screen"), None)
        evidence = v.EvidenceDoc(
            steps_compared=first.compared_steps, reference_steps=first.reference_steps or self.plan.bundle.steps,
            segments=first.segments, differences=1 if first.outcome in (at.FAULT, at.HARD) else 0,
            first_difference=_first_difference(first), detectors=_detectors(screen_outcome, first, counters,
                                                                              self.plan.tolerance),
            detectors_fired=fired, kernel_log=[line for s in runs for line in s.kernel_lines], counters=counters,
            runs=[_run_doc(s) for s in runs], tolerance=_tolerance_doc(self.tolerance),
            checks_off=_checks_off(screen_outcome, counters))
        bound = None
        if decision.verdict == "pass" and not self.plan.tolerance:
            step_s = None if first.median_step_ms is None else first.median_step_ms / 1e3
            b = Bound(steps=first.compared_steps, step_s=step_s)
            d = b.to_dict()
            bound = v.BoundDoc(confidence=b.confidence, steps=b.steps, faults=b.faults, rate_per_step=b.rate,
                               steps_per_fault=d["steps_per_fault"], duration_s=d.get("duration_s"),
                               step_s=step_s, text=b.text())
        return v.CardVerdict(
            host=self.plan.host, card=_identity(device), setting=v.SettingDoc(
                kind=knob.kind.value, unit=knob.unit, value=knob.current, stock=knob.stock,
                at_stock=knob.current == knob.stock, source=source,
                left_at=after.current),
            tier=v.TierDoc(**asdict(self.plan.tier)), mode="tolerance" if self.plan.tolerance else "bitwise",
            verdict=decision.verdict, severity=decision.severity, action=decision.action, reason=reason,
            attribution=decision.attribution,
            incomparable=[v.DifferenceDoc(**asdict(d)) for d in differences],
            evidence=evidence, bound=bound, exit_code=decision.exit_code)


# --- helpers ------------------------------------------------------------------------------------------------------


class _NotSet(Exception):
    """An excursion's value could not be set (the card as it was): its cause."""

    def __init__(self, cause: TunerError):
        super().__init__(cause.message)
        self.cause = cause


def _at(knob: Knob, profile: ProfileSetting) -> bool:
    """The card already holds the profile's setting: nothing to write."""
    return knob.current == profile.value and profile.lock_clock_mhz in (None, knob.lock_clock_mhz)


def fault_seed_for(device: DeviceInfo, purpose: str) -> int:
    """A simulated card's faults are drawn from the engine's fault seed: one per card (its serial, which differs
    between simulated machines; else its id) and run, so a repeat is a new draw, as a real card's random corruption
    would be, and two cards never fault on the same step by construction. Real cards inject nothing."""
    return zlib.crc32(f"{device.serial or device.id}:{purpose}".encode()) & 0x7FFFFFFF


def summarize(purpose: v.RunPurpose, setting: int, outcome: StressOutcome, *, tolerance: bool = False) -> at.RunSummary:
    """A stress outcome as the attribution needs it."""
    r = outcome.result
    end = None if r is None else r.end
    ref = None if end is None else end.reference
    compared = ref.compared_steps if ref is not None else 0
    if tolerance and r is not None and r.verdict == "pass":
        compared = r.steps  # no step is compared bit for bit; the whole run is the comparison
    keys: tuple[str, ...] = ()
    if r is not None and r.verdict == "error" and r.kind == "usage":
        keys = tuple(differing_keys(r.reason))
    edge = any(e.edge for e in outcome.kernel_events)
    kind = outcome.kind
    outcome_class = at.classify(str(outcome.verdict), kind, compared_steps=compared, edge=edge,
                                incomparable_keys=keys)
    reason = outcome.reason if outcome.result is not None or outcome.kernel_events else "stopped before it started"
    if outcome_class == at.INCOMPARABLE:
        reason = "the engine refused the reference: must-match fields differ: " + reason.split(
            "under another configuration: ", 1)[-1]
    return at.RunSummary(
        purpose=purpose, setting=setting, outcome=outcome_class, reason=reason, kind=kind,
        engine_verdict=str(outcome.verdict), steps=0 if r is None else r.steps, compared_steps=compared,
        step=None if r is None else r.failure_step, reference_step=None if r is None else r.reference_step,
        figure=None if end is None else end.figure, duration_s=None if r is None else r.duration_s,
        median_step_ms=None if end is None else end.median_step_ms,
        reference_steps=0 if ref is None else ref.reference_steps, segments=0 if ref is None else ref.segments,
        keys=keys, kernel_lines=tuple(e.line for e in outcome.kernel_events))


def _workload(start: Any) -> dict[str, object]:
    """This run's workload, from its `start` event, under the engine fingerprint's names."""
    model = start.model
    data = start.data
    workload: dict[str, object] = {"protocol": start.protocol, "preset": start.preset, "seed": start.seed,
                                   "dtype": start.dtype, "batch_size": start.batch_size, "seq_len": start.seq_len}
    if model is not None:
        workload.update(depth=model.depth, width=model.width, head_dim=model.head_dim, vocab=model.vocab,
                        window_pattern=model.window_pattern, value_embeds=model.value_embeds)
    if data is not None:
        workload["data_sha256"] = data.sha256
        tokenizer = getattr(data, "tokenizer", None)
        if tokenizer is not None and hasattr(tokenizer, "sha256"):
            workload["tokenizer_sha256"] = tokenizer.sha256
    return workload


def _identity(device: DeviceInfo) -> v.CardIdentity:
    return v.CardIdentity(id=device.id, vendor=device.vendor, model=device.name, pci_id=device.pci_id,
                          pci_slot=device.pci_slot, serial=device.serial, vbios=device.vbios,
                          driver_version=device.driver_version, simulated=device.simulated)


def _counter_doc(before: ErrorCounters, after: ErrorCounters) -> v.CountersDoc:
    if not before.available and not after.available:
        return v.CountersDoc(available=False, source=before.source or after.source,
                             why=before.why or after.why or "not readable", counters=[])
    b, a = before.as_dict(), after.as_dict()
    names = list(dict.fromkeys([*b, *a]))
    docs = [v.CounterDoc(name=n, before=b.get(n), after=a.get(n),
                         change=a[n] - b[n] if n in a and n in b else None) for n in names]
    # a counter missing from either read (named unreadable, or the whole read failed): its change is unknown
    missing = {n for n in names if n not in a or n not in b}
    unreadable = sorted(set(before.unreadable) | set(after.unreadable) | missing)
    failed = [w for w in (before.why, after.why) if w]
    why = (f"not readable: {', '.join(unreadable)}" + "".join(f" ({w})" for w in failed)) if unreadable else None
    return v.CountersDoc(available=True, source=before.source or after.source, why=why, counters=docs)


def _risen(counters: v.CountersDoc) -> list[str]:
    """The uncorrectable counters that rose during the screen (one that fell, a pending remap done, is no rise)."""
    return [c.name for c in counters.counters
            if c.change is not None and c.change > 0 and any(m in c.name for m in UE_MARKERS)]


def _first_difference(run: at.RunSummary) -> v.FirstDifference | None:
    if run.outcome not in (at.FAULT, at.HARD):
        return None
    return v.FirstDifference(step=run.step, reference_step=run.reference_step, figure=run.figure,
                             kind=run.kind or "fault", detail=run.reason)


def _run_doc(run: at.RunSummary) -> v.RunDoc:
    return v.RunDoc(purpose=run.purpose, setting=run.setting, verdict=run.engine_verdict, kind=run.kind,
                    steps=run.steps, compared_steps=run.compared_steps, step=run.step, duration_s=run.duration_s,
                    reason=run.reason)


def _fired(runs: list[at.RunSummary], counters: v.CountersDoc) -> list[str]:
    fired = []
    for run in runs:
        if run.outcome in (at.FAULT, at.HARD):
            name = "kernel log" if run.kernel_lines else at.DETECTOR_OF.get(run.kind or "", run.kind or "fault")
            if name not in fired:
                fired.append(name)
    if _risen(counters):
        fired.append("error counters")
    return fired


def _detectors(outcome: StressOutcome | None, first: at.RunSummary, counters: v.CountersDoc,
               tolerance: bool) -> dict[str, str]:
    if outcome is None:  # no engine run (incomparable before starting, or refused)
        return {"reference": "not run", "kernel log": "not run",
                "error counters": "ok" if counters.available else f"n/a ({counters.why})"}
    fired_kind = first.kind if first.outcome in (at.FAULT, at.HARD) else None
    plan = outcome.reference
    states = {"reference": ("off (tolerance mode: held-out losses compared instead)" if tolerance
                            else "ok" if plan.compared else f"off ({plan.why})")}
    for name, kinds in (("reference", ("mismatch",)), ("canary", ("canary",)), ("gemm", ("gemm",)),
                        ("non-finite", ("nonfinite",)), ("device errors", ("device-error",)),
                        ("watchdog", ("hang",))):
        if fired_kind in kinds:
            states[name] = "fired"
        else:
            states.setdefault(name, "ok")
    kl = outcome.kernel_log
    states["kernel log"] = "fired" if outcome.kernel_events else ("ok" if kl == "ok" else kl.replace("OFF:", "off:"))
    states["error counters"] = ("ok" if counters.available else f"n/a ({counters.why})")
    if tolerance:
        states["held-out loss"] = "fired" if fired_kind == "held-out-loss" else "ok"
    return states


def _checks_off(outcome: StressOutcome | None, counters: v.CountersDoc) -> list[str]:
    off = [] if outcome is None else list(outcome.checks_off())
    if not counters.available or counters.why:  # none, or some not read before and after: a rise unknown
        off.append(f"hardware error counters: {counters.why}")
    return off


def _tolerance_doc(c: PairedComparison | None) -> v.ToleranceDoc | None:
    """The comparison's figures; null when there are none (no comparison, or losses that are not finite: JSON has
    no NaN or infinity, and the run's reason says which windows)."""
    if c is None or c.nonfinite:
        return None
    return v.ToleranceDoc(windows=c.windows, mean_difference_nats=c.mean_nats, ci95_nats=[c.low_nats, c.high_nats],
                          margin_nats=c.margin_nats)
