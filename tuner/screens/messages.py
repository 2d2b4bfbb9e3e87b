"""Messages thread workers post to the App. Past-tense events; payloads are immutable snapshots."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

from tuner.core.models import Knob, Telemetry

if TYPE_CHECKING:  # what the messages carry, for the type checker (the App imports the modules itself)
    from textual.notifications import SeverityLevel

    from tuner.actions.boot_service import BootServiceStatus
    from tuner.actions.doctor import Check
    from tuner.actions.keep_or_revert import PendingChange
    from tuner.actions.profile_apply import ProfileApply, RigChange
    from tuner.app.jobs import EarlierTrials
    from tuner.tuning.events import BisectEvent
    from tuner.tuning.job import BisectOutcome


class TelemetrySampled(Message):
    def __init__(self, samples: tuple[tuple[str, Telemetry, Knob], ...]) -> None:
        super().__init__()
        self.samples = samples


class BackendFailed(Message):
    """A backend or engine call raised; `error` is a TunerError (or anything with `one_line`) or an exception."""

    def __init__(self, what: str, error: BaseException) -> None:
        super().__init__()
        self.what, self.error = what, error


class Noted(Message):
    """Something a worker wants said (a warning from the core), one line."""

    def __init__(self, text: str, severity: SeverityLevel = "information") -> None:
        super().__init__()
        self.text, self.severity = text, severity


class ChangeApplied(Message):
    """A setting was written and read back; it now waits for keep-or-revert."""

    def __init__(self, pending: PendingChange | RigChange) -> None:
        super().__init__()
        self.pending = pending


class ChangeSettled(Message):
    """A pending change was kept or reverted (or the card was reset to stock): every card it touched (a rig: all of
    them), read back."""

    def __init__(self, knobs: dict[str, Knob], outcome: str) -> None:
        super().__init__()
        self.knobs, self.outcome = knobs, outcome


class StressEventReceived(Message):
    def __init__(self, event: object) -> None:
        super().__init__()
        self.event = event


class StressEnded(Message):
    def __init__(self, device_id: str, summary: str) -> None:
        super().__init__()
        self.device_id, self.summary = device_id, summary


class BisectEventReceived(Message):
    def __init__(self, event: BisectEvent | EarlierTrials) -> None:
        super().__init__()
        self.event = event


class BisectEnded(Message):
    """The App's bisect of these cards (one, or every card at once) ended: its summary and BisectOutcome.
    `accepted`: it got past its checks (False: refused before anything was touched)."""

    def __init__(self, device_ids: tuple[str, ...], summary: str, outcome: BisectOutcome | None = None, *,
                 accepted: bool = True) -> None:
        super().__init__()
        self.device_ids, self.summary, self.outcome, self.accepted = device_ids, summary, outcome, accepted


class ProfileChecked(Message):
    """tuner.actions.profile_apply allowed a profile (its ProfileApply plan): apply or verify it."""

    def __init__(self, plan: ProfileApply) -> None:
        super().__init__()
        self.plan = plan


class DoctorFinished(Message):
    def __init__(self, checks: list[Check]) -> None:
        super().__init__()
        self.checks = checks


class BootServiceRead(Message):
    """The apply-at-boot service's status (tuner.actions.boot_service.BootServiceStatus)."""

    def __init__(self, status: BootServiceStatus) -> None:
        super().__init__()
        self.status = status
