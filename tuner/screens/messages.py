"""Messages thread workers post to the App. Past-tense events; payloads are immutable snapshots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

from tuner.core.models import Knob, Telemetry

if TYPE_CHECKING:  # what the messages carry, for the type checker (the App imports the modules itself)
    from collections.abc import Callable

    from textual.notifications import SeverityLevel

    from tuner.actions.boot_service import BootServiceStatus
    from tuner.actions.doctor import Check
    from tuner.actions.keep_or_revert import PendingChange
    from tuner.actions.profile_apply import ProfileApply, RigChange
    from tuner.app.jobs import EarlierTrials
    from tuner.tuning.events import BisectEvent
    from tuner.tuning.job import BisectOutcome


@dataclass
class TelemetrySampled(Message):
    samples: tuple[tuple[str, Telemetry, Knob], ...]


@dataclass
class BackendFailed(Message):
    """A backend or engine call raised; `error` is a TunerError (or anything with `one_line`) or an exception."""

    what: str
    error: BaseException


@dataclass
class Noted(Message):
    """Something a worker wants said (a warning from the core), one line."""

    text: str
    severity: SeverityLevel = "information"


@dataclass
class ChangeApplied(Message):
    """A setting was written and read back; it now waits for keep-or-revert. `on_kept`: what the apply asked to
    run once it is kept (the Bisect screen's offer to save it as a profile)."""

    pending: PendingChange | RigChange
    on_kept: Callable[[], None] | None = None


@dataclass
class ChangeSettled(Message):
    """A pending change was kept or reverted (or the card was reset to stock): every card it touched (a rig: all of
    them), read back."""

    knobs: dict[str, Knob]
    outcome: str


@dataclass
class StressEventReceived(Message):
    event: object


@dataclass
class StressEnded(Message):
    device_id: str
    summary: str


@dataclass
class BisectEventReceived(Message):
    event: BisectEvent | EarlierTrials


@dataclass
class BisectEnded(Message):
    """The App's bisect of these cards (one, or every card at once) ended: its summary and BisectOutcome.
    `accepted`: it got past its checks (False: refused before anything was touched)."""

    device_ids: tuple[str, ...]
    summary: str
    outcome: BisectOutcome | None
    accepted: bool


@dataclass
class ProfileChecked(Message):
    """tuner.actions.profile_apply allowed a profile (its ProfileApply plan): apply or verify it."""

    plan: ProfileApply


@dataclass
class DoctorFinished(Message):
    checks: list[Check]


@dataclass
class BootServiceRead(Message):
    """The apply-at-boot service's status (tuner.actions.boot_service.BootServiceStatus)."""

    status: BootServiceStatus


@dataclass
class FileWorkDone(Message):
    """A file worker finished (the App's profile save; a screen's export, import or delete, which bubbles up to the
    App): what to say, or the error that stopped it; `reload`: the profile list changed (`select`: its row then)."""

    said: str | None
    error: Exception | None
    reload: bool = False
    select: str | None = None
