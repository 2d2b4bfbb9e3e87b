"""Verify a setting with one stress trial, journalled; keep it only on a pass.

`tuner apply --verify DUR` and the Profiles screen's verify both come here. A profile made on another card of the
same model is a good starting point, not proof: silicon differs card to card. The trial is the bisect's own
(`tuner.tuning.trial.run_trial`: engine, kernel-log watch, telemetry, watchdog) with the profile's workload, and
it runs inside a durable guard file (`journal.guarded_trial`): if the machine freezes, the boot service applies
nothing and the next verify puts the value on the unsafe list. Afterwards the setting is re-applied on a pass,
and the previous value is put back on anything else (a fault, an error, a stop, Ctrl-C or SIGTERM).

Every step of the trial is compared with a stock reference (issue 25): the profile's bundled one
(`tuner.profiles.reference_bundle`, NAME.ref beside the profile) when its fingerprint matches this card (the
card's must-match fields here; the engine checks its own half when it starts), else one recorded on this card at
stock first (as long as the trial, at most REFERENCE_RECORD_S, the stress action's length; compared in a loop, as
the bisect does with its one-trial baseline), inside the same lock and guard. Which one, and why,
is said (`VerifyOutcome.reference`). A bundled reference the engine refuses (its torch or kernels differ) is
replaced by a recording, said too: never a trial without its comparison.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.actions.keep_or_revert import signals_held
from tuner.backends.base import Backend
from tuner.core.card_lock import CardLock
from tuner.core.durations import format_duration
from tuner.core.models import Knob, Mode, Phase, Verdict
from tuner.engine.reference import MISMATCH
from tuner.profiles import reference_bundle as rb
from tuner.profiles.schema import Profile
from tuner.tuning import journal

VERIFY_CANARY_EVERY = 10  # steps


@dataclass(frozen=True)
class Workload:
    """The stress workload of a verify: the profile's own, so the trial matches the one that proved it.
    None: the default (preset "tiny" on a CPU engine, else "nanochat"; mode train; the engine's dtype)."""

    preset: str | None = None
    mode: str | None = None
    dtype: str | None = None
    reference: Path | None = None  # compare every step with this stock trajectory (looped)
    record: Path | None = None  # this run is the stock recording: at stock, the trajectory written here

    @classmethod
    def of_profile(cls, profile: Profile) -> Workload:
        t = profile.tuning
        return cls() if t is None else cls(preset=t.preset, mode=t.mode, dtype=t.dtype)


@dataclass(frozen=True)
class ReferenceChoice:
    """Which stock reference a verify compares with: the profile's bundled one (`bundle`), or one recorded on this
    card first (`bundle` None), and why."""

    bundle: rb.Bundle | None
    why: str
    applies: bool = True  # False: the workload has no trajectory to compare (a GEMM burn)

    def said(self) -> str:
        if not self.applies:
            return f"no stock reference ({self.why})"
        if self.bundle is not None:
            return f"compared with the profile's bundled stock reference ({self.why})"
        return f"compared with a stock reference recorded on this card first ({self.why})"


def choose_reference(backend: Backend, device_id: str, workload: Workload,
                     bundled: tuple[rb.Bundle, Path, int] | None) -> ReferenceChoice:
    """The bundled reference when it fits this card and workload (bitwise), else a recording first."""
    if workload.mode == Mode.GEMM:
        return ReferenceChoice(None, "n/a: a GEMM burn has no training trajectory to compare", applies=False)
    if bundled is None:
        return ReferenceChoice(None, "the profile carries none")
    bundle, path = bundled[0], bundled[1]
    differences = rb.card_differences(bundle, backend.device(device_id))
    if differences:
        return ReferenceChoice(None, f"{path.name} was recorded on other hardware or software: "
                               + "; ".join(d.text() for d in differences))
    from tuner.tuning.engine_client import default_preset
    preset = workload.preset or default_preset(backend.stress_target(device_id))
    if bundle.preset != preset:
        return ReferenceChoice(None, f"{path.name} is for preset {bundle.preset}, this verify runs {preset}")
    if workload.dtype and bundle.engine_fingerprint.get("dtype") != workload.dtype:
        return ReferenceChoice(None, f"{path.name} is in {bundle.engine_fingerprint.get('dtype')}, this verify runs "
                               f"{workload.dtype}")
    return ReferenceChoice(bundle, f"{path.name}, sha256 {bundle.sha256[:12]}, fingerprint matches")


# (backend, device_id, value, duration_s, workload, on_line, stop_event) -> (verdict, reason); leaves the card at
# stock, and puts a value that hung or lost the card on the unsafe list
TrialRunner = Callable[[Backend, str, int, float, Workload, Callable[[str], None], threading.Event],
                       tuple[str, str | None]]


@dataclass(frozen=True)
class VerifyOutcome:
    verdict: str  # Verdict: pass, fail, error or stopped
    reason: str | None
    previous: int  # the value before the trial (restored unless the trial passed)
    knob: Knob  # read back at the end
    reference: str = ""  # which stock reference the trial was compared with, and why (ReferenceChoice.said)

    @property
    def passed(self) -> bool:
        return self.verdict == Verdict.PASS

    def to_dict(self) -> dict:
        return {"verdict": str(self.verdict), "reason": self.reason, "previous": self.previous,
                "reverted": not self.passed, "knob": self.knob.to_dict(), "reference": self.reference}


def verify_setting(
    backend: Backend,
    device_id: str,
    value: int,
    duration_s: float,
    *,
    workload: Workload = Workload(),
    bundled: tuple[rb.Bundle, Path, int] | None = None,
    run_trial: TrialRunner | None = None,
    on_line: Callable[[str], None] = lambda line: None,
    stop_event: threading.Event | None = None,
    lock_clock_mhz: int | None = None,
) -> VerifyOutcome:
    """Run one guarded trial at `value` (validated: never an overvolt), every step compared with a stock reference
    (`bundled`, the profile's, when it fits; else recorded on this card first); keep `value` only on a pass.
    `lock_clock_mhz`: NVIDIA, the max clock to lock to first (a profile's); anything but a pass puts back the lock
    the card had with its previous value."""
    from tuner.actions.stress import REFERENCE_RECORD_S

    run_trial = run_trial or bisect_trial
    stop_event = stop_event or threading.Event()
    knob = backend.knob(device_id)
    knob.validate(value)
    previous, previous_lock = knob.current, knob.lock_clock_mhz
    verdict: str = Verdict.ERROR
    reason: str | None = "interrupted before the trial finished"
    choice = choose_reference(backend, device_id, workload, bundled)
    with CardLock(device_id, f"verify of {value:+d} {knob.unit}"), journal.guarded_trial(device_id, value,
                                                                                         unit=knob.unit,
                                                                                         backend=backend), \
            tempfile.TemporaryDirectory(prefix="tuner-verify-") as work:
        try:
            if lock_clock_mhz is not None:
                backend.set_lock_clock(device_id, lock_clock_mhz)
            reference = None if choice.bundle is None else rb.materialize(choice.bundle, Path(work))
            record_s = min(duration_s, REFERENCE_RECORD_S)
            for _attempt in range(2):
                if reference is None and choice.applies:  # recorded first, at stock, as the stress action does
                    on_line(f"reference: {choice.why}: recording a stock reference on this card first "
                            f"({format_duration(record_s)})")
                    reference = Path(work) / "stock.json"
                    verdict, reason = run_trial(backend, device_id, knob.stock, record_s,
                                                replace(workload, record=reference), on_line, stop_event)
                    if verdict != Verdict.PASS or not reference.exists():
                        verdict = Verdict.ERROR if verdict == Verdict.PASS else verdict
                        reason = f"the stock recording on this card did not pass: {reason or verdict}"
                        break
                on_line(f"reference: {choice.said()}")
                verdict, reason = run_trial(backend, device_id, value, duration_s,
                                            replace(workload, reference=reference), on_line, stop_event)
                if choice.bundle is None or MISMATCH not in (reason or ""):
                    break
                # the engine refused the bundled trajectory (its own half of the fingerprint differs): record one
                choice = ReferenceChoice(None, f"the engine refused the bundled reference: {reason}")
                reference = None
        finally:
            with signals_held():  # a second Ctrl-C must not cut the restore short
                if verdict == Verdict.PASS:
                    backend.apply(device_id, value)
                    backend.keep(device_id)  # kept on a pass (through the root helper, it stops reverting)
                else:
                    if lock_clock_mhz is not None and previous_lock is not None:
                        # the lock first: restoring the value re-locks at it (a reset releases it)
                        backend.set_lock_clock(device_id, previous_lock)
                    if previous == knob.stock:
                        backend.reset(device_id)
                    else:
                        backend.apply(device_id, previous, allow_overvolt=True)  # never a new overvolt
    return VerifyOutcome(verdict, reason, previous, backend.knob(device_id), choice.said())


def bisect_trial(backend: Backend, device_id: str, value: int, duration_s: float, workload: Workload,
                 on_line: Callable[[str], None], stop_event: threading.Event) -> tuple[str, str | None]:
    """One `confirm`-phase trial through the bisect's trial runner, compared with `workload.reference` (or, with
    `workload.record`, the stock recording: a baseline trial at stock writing it); a hang or a lost card goes on the
    unsafe list."""
    from tuner.tuning.engine_client import default_preset
    from tuner.tuning.events import TrialWarning
    from tuner.tuning.trial import TrialParams, run_trial

    target = backend.stress_target(device_id)
    # the card's serial and stock, read before the trial (a lost card may answer nothing after it, and its hard
    # failure must still be listed): under the serial, which the root helper files an imported line by
    # (service._key_for), not whatever card is in the slot
    serial, stock = backend.device(device_id).serial, backend.knob(device_id).stock
    preset = workload.preset or default_preset(target)
    # canary replays every VERIFY_CANARY_EVERY steps besides the reference (a few % of throughput), so a short trial
    # on a slow device also checks the frozen weights often
    recording = workload.record is not None
    params = TrialParams(phase=Phase.BASELINE if recording else Phase.CONFIRM, duration_s=duration_s, preset=preset,
                         mode=Mode.TRAIN if recording else workload.mode or Mode.TRAIN, dtype=workload.dtype,
                         canary_every=VERIFY_CANARY_EVERY,
                         record_paths=None if workload.record is None else {device_id: workload.record},
                         reference_paths=None if workload.reference is None else {device_id: workload.reference})

    def on_event(event: object) -> None:
        if isinstance(event, TrialWarning):
            on_line(f"warning: {event.message}")

    result = run_trial(backend, {device_id: value}, params, on_event, stop_event).result
    # a hang or a lost device: never applied again automatically (the one rule, as in a bisect)
    journal.record_hard_failure(device_id, result, stock=stock, serial=serial, backend=backend)
    return result.verdict, result.reason or None
