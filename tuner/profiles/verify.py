"""`tuner apply --verify DUR`: apply a profile's setting, prove it with a stress trial, revert if it fails.

A profile made on another card of the same model is a good starting point, not proof: silicon differs card to
card. The trial runs the same training workload as a bisect trial; anything but a pass (a fault, an error, an
interruption) puts the card back at the value it had before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tuner.backends.base import Backend
from tuner.errors import Unsupported
from tuner.keep_or_revert import PendingChange
from tuner.models import Knob, StressTarget

# (target, duration_s, on_line) -> (verdict "pass"|"fail"|"error", reason or None)
StressRunner = Callable[[StressTarget, float, Callable[[str], None]], tuple[str, str | None]]


@dataclass(frozen=True)
class VerifyOutcome:
    verdict: str  # "pass", "fail" or "error"
    reason: str | None
    previous: int  # the value before the trial (restored unless the trial passed)
    knob: Knob  # read back after the trial (and the revert, if any)

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
    run_stress: StressRunner | None = None,
    on_line: Callable[[str], None] = lambda line: None,
) -> VerifyOutcome:
    """Apply `value` (validated, read back), stress it for `duration_s`, keep it only on a pass.

    Ctrl-C or SIGTERM (`signals.Terminated`) during the trial also restores the previous value before the
    exception goes on.
    """
    run_stress = run_stress or stress_client_runner
    verdict, reason = "error", "interrupted before the trial finished"
    # PendingChange reverts on leaving the block unless kept: on a fail, an error, Ctrl-C or SIGTERM alike, with
    # further signals held back until the card is back.
    with PendingChange(backend, device_id, value) as change:
        target = backend.stress_target(device_id)  # after applying: a simulated card's faults follow the setting
        backend.note_load(device_id, True)
        try:
            verdict, reason = run_stress(target, duration_s, on_line)
        finally:
            backend.note_load(device_id, False)
        if verdict == "pass":
            change.keep()
    return VerifyOutcome(verdict, reason, change.previous, backend.knob(device_id))


def stress_client_runner(target: StressTarget, duration_s: float, on_line: Callable[[str], None]):
    """Run the stress engine through `tuner.stress_client` (owned by the stress work) and return its verdict."""
    try:
        from tuner import stress_client
    except ModuleNotFoundError as e:
        if e.name != "tuner.stress_client":
            raise
        raise Unsupported("--verify needs the stress engine, which is not built into this version",
                          "apply with --force instead, or update the tuner") from None
    config = stress_client.EngineConfig.for_target(target, duration_s=duration_s)
    run = stress_client.StressRun(config).start()
    try:
        for event in run.events():
            line = _event_line(event)
            if line:
                on_line(line)
    finally:
        run.stop()
    result = run.result()
    return result.verdict, getattr(result, "reason", None)


def _event_line(event) -> str | None:
    """A short progress line for the events worth showing (the engine emits many)."""
    kind = getattr(event, "kind", None) or (event.get("event") if isinstance(event, dict) else None)
    if kind in ("fault", "end", "error"):
        detail = getattr(event, "message", None) or (event.get("reason") if isinstance(event, dict) else None)
        return f"{kind}: {detail}" if detail else str(kind)
    return None
