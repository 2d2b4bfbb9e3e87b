"""What the UI remembers between frames: telemetry ring buffers and the state of the App's long jobs.

Plain Python, no textual. The job states are frozen snapshots: the App's message handlers (on the event loop) swap
in a new one per event, screens read whichever is current on their repaint timers. Worker threads never touch
them; they post messages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tuner.core.models import Knob, Mode, Telemetry
from tuner.tuning.events import of_about

if TYPE_CHECKING:
    from tuner.tuning.events import Recommendation
    from tuner.tuning.job import BisectOutcome

HISTORY_SAMPLES = 300  # five minutes at 1 Hz
LOG_LINES = 500
BISECT_WARNINGS = 20

PLOTTED_FIELDS = ("power_w", "temp_edge_c")  # the dashboard's two plots


@dataclass
class DeviceHistory:
    """The last HISTORY_SAMPLES telemetry samples of one device, one deque per plotted figure."""

    time_s: deque = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))
    series: dict[str, deque] = field(default_factory=lambda: {f: deque(maxlen=HISTORY_SAMPLES) for f in PLOTTED_FIELDS})
    latest: Telemetry | None = None
    knob: Knob | None = None
    version: int = 0  # bumped on every change, so a screen repaints only when something changed

    def add(self, sample: Telemetry) -> None:
        self.time_s.append(sample.time_s)
        for name, values in self.series.items():
            values.append(getattr(sample, name))
        self.latest = sample
        self.version += 1

    def set_knob(self, knob: Knob) -> None:
        if knob != self.knob:
            self.knob = knob
            self.version += 1

    def points(self, name: str) -> tuple[list[float], list[float]]:
        """(seconds relative to the newest sample, values), skipping samples the device did not report."""
        kept = [(round(t_s - self.time_s[-1], 1), value)
                for t_s, value in zip(self.time_s, self.series[name], strict=True) if value is not None]
        return [x for x, _ in kept], [y for _, y in kept]


def appended(items: tuple, *new: object, limit: int) -> tuple:
    """`items` plus `new`, keeping the last `limit` (a snapshot's bounded log or series)."""
    out = items + new
    return out[-limit:] if len(out) > limit else out


@dataclass(frozen=True)
class StressState:
    """The App's stress run (at most one at a time), as the Tune screen shows it: an immutable snapshot that the
    App swaps (`dataclasses.replace`) on every event; screens only read it."""

    device_id: str | None = None
    running: bool = False
    preset: str = "tiny"
    mode: str = Mode.TRAIN
    run: int = 0  # which run this is: a screen starts its log afresh when it changes
    steps: tuple[tuple[int, float, float], ...] = ()  # (step, loss, tok_s), the last HISTORY_SAMPLES
    detectors: tuple[tuple[str, str], ...] = ()  # (detector name, "ok" | "FAULT ..." | "off")
    log: tuple[str, ...] = ()  # the last LOG_LINES lines
    log_written: int = 0  # lines ever logged; the screen flushes the ones it has not shown yet
    verdict: str | None = None
    stopping: bool = False  # the user pressed stop: the engine's "interrupted by SIGTERM" is their stop

    def detector(self, name: str, default: str = "-") -> str:
        return dict(self.detectors).get(name, default)

    def with_detector(self, name: str, value: str) -> StressState:
        return replace(self, detectors=tuple({**dict(self.detectors), name: value}.items()))

    def written(self, *lines: str) -> StressState:
        return replace(self, log=appended(self.log, *lines, limit=LOG_LINES), log_written=self.log_written + len(lines))


@dataclass(frozen=True)
class CardState:
    """One card's search in the App's auto-bisect: an immutable snapshot, swapped by the App."""

    device_id: str | None = None
    running: bool = False
    trials: tuple[Mapping[str, Any], ...] = ()  # one row per started trial, replaced when it finishes
    current: Mapping[str, Any] | None = None  # the running trial: setting, progress 0..1, eta_s, index, total
    recommendation: Recommendation | None = None
    failure: str | None = None
    unit: str = ""
    session: str | None = None
    warnings: tuple[str, ...] = ()  # the last BISECT_WARNINGS
    trial_started_s: float | None = None  # monotonic start of the running trial (for the measured ETA)
    trial_nominal_s: float | None = None  # its nominal duration
    measured: tuple[tuple[float, float], ...] = ()  # (wall seconds start to next start, nominal seconds) per trial


@dataclass(frozen=True)
class BisectState:
    """The App's auto-bisect (at most one at a time), of one card or of every card at once
    (tuner.tuning.job.BisectJob): one CardState per card (its own search, folded from the events that name it), then
    with several cards the whole-rig confirmation. An immutable snapshot, swapped by the App."""

    device_ids: tuple[str, ...] = ()
    running: bool = False
    cards: Mapping[str, CardState] = field(default_factory=dict)
    current: Mapping[str, Any] | None = None  # the rig run in progress: attempt, phase, settings, duration_s
    attempts: tuple[Mapping[str, Any], ...] = ()  # one row per rig run: attempt, phase, settings, verdict...
    units: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, int] | None = None  # the final settings (confirmed together, with several cards)
    outcome: BisectOutcome | None = None  # when it ended
    failure: str | None = None
    warnings: tuple[str, ...] = ()
    unfinished: str | None = None  # a card's unfinished session, shown before anything ran (jobs.unfinished_session)

    @classmethod
    def started(cls, device_ids: tuple[str, ...]) -> BisectState:
        return cls(device_ids=device_ids, running=True, cards={d: CardState(d, running=True) for d in device_ids})

    def card(self, device_id: str | None) -> CardState:
        return self.cards.get(device_id or "") or CardState(device_id=device_id)

    def unit(self, device_id: str) -> str:
        return self.units.get(device_id) or self.card(device_id).unit


def trial_text(cur: Mapping[str, Any], unit: str, *, compact: bool = False) -> str:
    """A card's running trial (CardState.current): `trial 3 of ≤9 (descend) at -20 mV`; compact: `trial 3 at -20 mV`."""
    total_and_phase = "" if compact else f"{of_about(cur.get('total'))} ({cur.get('phase')})"
    return f"trial {cur.get('index')}{total_and_phase} at {cur.get('setting'):+d} {unit}"


def bisect_card_label(bisect: BisectState, device_id: str, *, compact: bool = False) -> str:
    """What the bisect does on one of its cards, in words."""
    if bisect.current is not None:
        setting = (bisect.current.get("settings") or {}).get(device_id)
        if setting is None:
            return "RIG waiting (not in this run)"
        where = f"at {setting:+d} {bisect.unit(device_id)}"
        if bisect.current.get("phase") == "rig-baseline":
            return f"RIG recording {where} (stock)"
        return f"RIG confirm {bisect.current.get('attempt')} {where}"
    card = bisect.card(device_id)
    if card.current is not None and card.running:
        return f"BISECT {trial_text(card.current, card.unit, compact=compact)}"
    if card.recommendation is not None or card.failure:
        return "BISECT waiting for the other cards" if len(bisect.device_ids) > 1 else "BISECT finishing"
    return "BISECT starting"


def running_label(stress: StressState, bisect: BisectState, device_id: str, *, compact: bool = False) -> str:
    """What is running on a device, in words (never by colour alone). `compact`: a dashboard row's short form."""
    if bisect.running and device_id in bisect.device_ids:
        return bisect_card_label(bisect, device_id, compact=compact)
    if stress.running and stress.device_id == device_id:
        return f"STRESS {stress.preset}/{stress.mode}"
    return "idle"
