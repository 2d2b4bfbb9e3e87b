"""Verify a setting with one stress trial, journalled; keep it only on a pass.

`tuner apply --verify DUR` and the Profiles screen's verify both come here. A profile made on another card of the
same model is a good starting point, not proof: silicon differs card to card. The trial is the bisect's own
(`tuner.tuning.trial.run_trial`: engine, kernel-log watch, telemetry, watchdog) with the profile's workload, and
it runs inside a durable guard file (`journal.guarded_trial`): if the machine freezes, the boot service applies
nothing and the next verify puts the value on the unsafe list. Afterwards the setting is re-applied on a pass,
and the previous value is put back on anything else (a fault, an error, a stop, Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from tuner.actions.keep_or_revert import signals_held
from tuner.backends.base import Backend
from tuner.core.card_lock import CardLock
from tuner.core.models import Knob, Mode, Phase, Verdict
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

    @classmethod
    def of_profile(cls, profile: Profile) -> Workload:
        t = profile.tuning
        return cls() if t is None else cls(preset=t.preset, mode=t.mode, dtype=t.dtype)


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

    @property
    def passed(self) -> bool:
        return self.verdict == Verdict.PASS

    def to_dict(self) -> dict:
        return {"verdict": str(self.verdict), "reason": self.reason, "previous": self.previous,
                "reverted": not self.passed, "knob": self.knob.to_dict()}


def verify_setting(
    backend: Backend,
    device_id: str,
    value: int,
    duration_s: float,
    *,
    workload: Workload = Workload(),
    run_trial: TrialRunner | None = None,
    on_line: Callable[[str], None] = lambda line: None,
    stop_event: threading.Event | None = None,
) -> VerifyOutcome:
    """Run one guarded trial at `value` (validated: never an overvolt); keep `value` only on a pass."""
    run_trial = run_trial or bisect_trial
    stop_event = stop_event or threading.Event()
    knob = backend.knob(device_id)
    knob.validate(value)
    previous = knob.current
    verdict: str = Verdict.ERROR
    reason: str | None = "interrupted before the trial finished"
    with CardLock(device_id, f"verify of {value:+d} {knob.unit}"), journal.guarded_trial(device_id, value,
                                                                                         unit=knob.unit):
        try:
            verdict, reason = run_trial(backend, device_id, value, duration_s, workload, on_line, stop_event)
        finally:
            with signals_held():  # a second Ctrl-C must not cut the restore short
                if verdict == Verdict.PASS:
                    backend.apply(device_id, value)
                    backend.keep(device_id)  # kept on a pass (through the root helper, it stops reverting)
                elif previous == knob.stock:
                    backend.reset(device_id)
                else:
                    backend.apply(device_id, previous, allow_overvolt=True)  # restoring is never a new overvolt
    return VerifyOutcome(verdict, reason, previous, backend.knob(device_id))


def bisect_trial(backend: Backend, device_id: str, value: int, duration_s: float, workload: Workload,
                 on_line: Callable[[str], None], stop_event: threading.Event) -> tuple[str, str | None]:
    """One `confirm`-phase trial through the bisect's trial runner; a hang or a lost card goes on the unsafe list."""
    from tuner.tuning.engine_client import default_preset
    from tuner.tuning.events import TrialWarning
    from tuner.tuning.trial import TrialParams, run_trial

    target = backend.stress_target(device_id)
    preset = workload.preset or default_preset(target)
    # A verify trial has no reference trajectory to compare steps against, so canary replays carry detection;
    # run one every VERIFY_CANARY_EVERY steps (a few % of throughput) so a short trial on a slow device still
    # checks many times instead of once every 100 steps.
    params = TrialParams(phase=Phase.CONFIRM, duration_s=duration_s, preset=preset,
                         mode=workload.mode or Mode.TRAIN, dtype=workload.dtype, canary_every=VERIFY_CANARY_EVERY)

    def on_event(event: object) -> None:
        if isinstance(event, TrialWarning):
            on_line(f"warning: {event.message}")

    result = run_trial(backend, {device_id: value}, params, on_event, stop_event).result
    # a hang or a lost device: never applied again automatically (the one rule, as in a bisect)
    journal.record_hard_failure(device_id, result, stock=backend.knob(device_id).stock)
    return result.verdict, result.reason or None
