"""`tuner apply --verify DUR`: prove a profile's setting on this card with one stress trial; revert on failure.

A profile made on another card of the same model is a good starting point, not proof: silicon differs card to
card. The trial is the bisect's own (`tuner.tuning.trial.run_trial`: engine, kernel-log watch, telemetry, watchdog),
which leaves the card at stock; afterwards the setting is re-applied on a pass, and the previous value is put
back on anything else (a fault, an error, Ctrl-C or SIGTERM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tuner.backends.base import Backend
from tuner.actions.keep_or_revert import signals_held
from tuner.core.models import Knob, StressTarget

VERIFY_CANARY_EVERY = 10  # steps

# (target, duration_s, on_line) -> (verdict, reason): just the engine on an already-applied setting (the TUI's job)
StressRunner = Callable[[StressTarget, float, Callable[[str], None]], tuple[str, str | None]]
# (backend, device_id, value, duration_s, workload, on_line) -> (verdict, reason); leaves the card at stock
TrialRunner = Callable[[Backend, str, int, float, dict, Callable[[str], None]], tuple[str, str | None]]


@dataclass(frozen=True)
class VerifyOutcome:
    verdict: str  # "pass", "fail", "error" (or "stopped")
    reason: str | None
    previous: int  # the value before the trial (restored unless the trial passed)
    knob: Knob  # read back at the end

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "previous": self.previous,
                "reverted": not self.passed, "knob": self.knob.to_dict()}


def verify_setting(
    backend: Backend,
    device_id: str,
    value: int,
    duration_s: float,
    *,
    workload: dict | None = None,
    run_trial: TrialRunner | None = None,
    run_stress: StressRunner | None = None,
    on_line: Callable[[str], None] = lambda line: None,
) -> VerifyOutcome:
    """Run one trial at `value` (validated and read back by the backend); keep `value` only on a pass.

    `workload` may carry the profile's `preset`, `mode` and `dtype`, so the trial matches the one that proved it.
    `run_stress` runs only the engine (the TUI's stress job) where the default is the bisect's full trial.
    """
    run_trial = run_trial or (_engine_only(run_stress) if run_stress else bisect_trial)
    knob = backend.knob(device_id)
    previous = knob.current
    verdict, reason = "error", "interrupted before the trial finished"
    try:
        verdict, reason = run_trial(backend, device_id, value, duration_s, workload or {}, on_line)
    finally:
        with signals_held():  # a second Ctrl-C must not cut the restore short
            if verdict == "pass":
                backend.apply(device_id, value)
            elif previous == knob.stock:
                backend.reset(device_id)
            else:
                backend.apply(device_id, previous, allow_overvolt=True)  # restoring is never a new overvolt
    return VerifyOutcome(verdict, reason, previous, backend.knob(device_id))


def _engine_only(run_stress: StressRunner) -> TrialRunner:
    """A TrialRunner around a bare engine runner: apply, run on the device's stress target, back to stock."""

    def run(backend, device_id, value, duration_s, workload, on_line):
        backend.apply(device_id, value)
        try:
            return run_stress(backend.stress_target(device_id), duration_s, on_line)
        finally:
            backend.reset(device_id)

    return run


def bisect_trial(backend: Backend, device_id: str, value: int, duration_s: float, workload: dict,
                 on_line: Callable[[str], None]) -> tuple[str, str | None]:
    """One `confirm`-phase trial through the bisect's trial runner."""
    from tuner.tuning import journal, kernel_log
    from tuner.tuning.engine_client import default_preset
    from tuner.tuning.events import TrialWarning
    from tuner.tuning.trial import TrialParams, run_trial

    target = backend.stress_target(device_id)
    preset = workload.get("preset") or default_preset(target)
    # A verify trial has no reference trajectory to compare steps against, so canary replays carry detection;
    # run one every VERIFY_CANARY_EVERY steps (a few % of throughput) so a short trial on a slow device still
    # checks many times instead of once every 100 steps.
    params = TrialParams(phase="confirm", duration_s=duration_s, preset=preset,
                         mode=workload.get("mode") or "train", dtype=workload.get("dtype"),
                         canary_every=VERIFY_CANARY_EVERY)
    watcher = kernel_log.NullWatcher() if target.simulated else None  # a simulated card has no kernel log

    def on_event(event) -> None:
        if isinstance(event, TrialWarning):
            on_line(f"warning: {event.message}")

    unit = backend.knob(device_id).unit
    with journal.guarded_trial(device_id, value, unit=unit):
        result = run_trial(backend, device_id, value, params, on_event, kernel_watcher=watcher)
    if result.verdict == "fail" and result.edge:  # a hang or a lost device: never applied again automatically
        journal.add_unsafe(device_id, value, unit=unit, kind=result.kind or "hang", reason=result.reason,
                           edge=True, kernel_log=list(result.kernel_log))
    return result.verdict, result.reason or None
