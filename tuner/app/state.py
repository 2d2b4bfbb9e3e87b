"""What the UI remembers between frames: telemetry ring buffers and the state of the App's long jobs.

Plain Python, no textual: the App's message handlers write it (on the event loop), screens read it on their
repaint timers. Worker threads never touch it; they post messages.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tuner.core.models import Knob, Telemetry

HISTORY_SAMPLES = 300  # five minutes at 1 Hz
LOG_LINES = 500

PLOTTED_FIELDS = ("power_w", "temp_edge_c", "temp_hotspot_c", "core_clock_mhz", "voltage_mv", "util_pct")


def of_about(total: int | None) -> str:
    """' of ~9' while the trial count is an estimate (the coarse descent's length is unknowable up front)."""
    return f" of ~{total}" if total else ""


@dataclass
class DeviceHistory:
    """The last `maxlen` telemetry samples of one device, one deque per plotted figure."""

    maxlen: int = HISTORY_SAMPLES
    time_s: deque = field(init=False)
    series: dict[str, deque] = field(init=False)
    latest: Telemetry | None = None
    knob: Knob | None = None
    version: int = 0  # bumped on every change, so a screen repaints only when something changed

    def __post_init__(self) -> None:
        self.time_s = deque(maxlen=self.maxlen)
        self.series = {name: deque(maxlen=self.maxlen) for name in PLOTTED_FIELDS}

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
        if not self.time_s:
            return [], []
        newest_s = self.time_s[-1]
        xs, ys = [], []
        for t_s, value in zip(self.time_s, self.series[name]):
            if value is not None:
                xs.append(round(t_s - newest_s, 1))
                ys.append(value)
        return xs, ys


@dataclass
class StressState:
    """The App's stress run (at most one at a time), as the Tune screen shows it."""

    device_id: str | None = None
    running: bool = False
    setting: int | None = None
    preset: str = "tiny"
    mode: str = "train"
    steps: deque = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))  # (step, loss, tok_s)
    detectors: dict[str, str] = field(default_factory=dict)  # detector name -> "ok" | "FAULT ..." | "n/a"
    log: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    log_written: int = 0  # lines ever logged; the screen flushes the ones it has not shown yet
    verdict: str | None = None
    version: int = 0

    def write(self, line: str) -> None:
        self.log.append(line)
        self.log_written += 1
        self.version += 1


@dataclass
class BisectState:
    """The App's auto-bisect (at most one at a time)."""

    device_id: str | None = None
    running: bool = False
    trials: list[dict] = field(default_factory=list)  # one row per started trial, updated when it finishes
    current: dict | None = None  # the running trial: setting, progress 0..1, eta_s, index, total
    recommendation: object | None = None
    outcome: object | None = None  # tuner.tuning.job.BisectOutcome when it ended
    failure: str | None = None
    unit: str = ""
    session: str | None = None
    warnings: deque = field(default_factory=lambda: deque(maxlen=20))
    version: int = 0


def running_label(stress: StressState, bisect: BisectState, device_id: str) -> str:
    """What is running on a device, in words (never by colour alone)."""
    if bisect.running and bisect.device_id == device_id:
        cur = bisect.current or {}
        k = cur.get("index")
        if k is None:
            return "BISECT starting"
        setting = cur.get("setting")
        where = f" at {setting:+d} {bisect.unit}" if isinstance(setting, int) else ""
        return f"BISECT trial {k}{of_about(cur.get('total'))} ({cur.get('phase')}){where}"
    if stress.running and stress.device_id == device_id:
        return f"STRESS {stress.preset}/{stress.mode}"
    return "idle"
