"""A 1 Hz telemetry sampler for one device: a thread calling `backend.telemetry`, a ring buffer, a summary.

Energy comes from the device's counter when it has one (`Telemetry.energy_j`), else from integrating power.
A `DeviceLost` while sampling is remembered (`device_lost`) and ends sampling: the trial counts it as a failure.
"""

from __future__ import annotations

import itertools
import statistics
import threading
from collections import deque
from dataclasses import dataclass

from tuner.backends.base import Backend
from tuner.core.errors import DeviceLost, TunerError
from tuner.core.models import Telemetry


@dataclass(frozen=True)
class TelemetrySummary:
    mean_power_w: float | None
    max_temp_edge_c: float | None
    max_temp_hotspot_c: float | None
    max_temp_mem_c: float | None
    mean_voltage_mv: float | None
    energy_j: float | None
    median_core_clock_mhz: float | None = None  # the clock the card sustained (NVIDIA: the lock for a bisect)
    pstates: tuple[int, ...] = ()  # NVIDIA performance states seen, in order of first appearance
    p95_power_w: float | None = None  # 95th percentile of board power (how hard the load peaks)
    power_limit_w: float | None = None  # the enforced board power limit (the last reported)
    throttle_reasons: tuple[str, ...] = ()  # every clock-limit reason the driver reported, first seen first

    @property
    def max_temp_c(self) -> float | None:
        temps = [t for t in (self.max_temp_edge_c, self.max_temp_hotspot_c, self.max_temp_mem_c) if t is not None]
        return max(temps) if temps else None


def summarize(samples: list[Telemetry]) -> TelemetrySummary:
    def col(name: str) -> list[float]:
        return [getattr(s, name) for s in samples if getattr(s, name) is not None]

    counters = [(s.time_s, s.energy_j) for s in samples if s.energy_j is not None]
    energy_j: float | None = None
    if len(counters) > 1 and counters[-1][1] >= counters[0][1]:
        energy_j = counters[-1][1] - counters[0][1]
    else:
        powered = [(s.time_s, s.power_w) for s in samples if s.power_w is not None]
        if len(powered) > 1:
            energy_j = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(powered))
    power, volts, clocks = col("power_w"), col("voltage_mv"), col("core_clock_mhz")
    return TelemetrySummary(
        mean_power_w=statistics.fmean(power) if power else None,
        max_temp_edge_c=max(col("temp_edge_c"), default=None),
        max_temp_hotspot_c=max(col("temp_hotspot_c"), default=None),
        max_temp_mem_c=max(col("temp_mem_c"), default=None),
        mean_voltage_mv=statistics.fmean(volts) if volts else None,
        energy_j=energy_j,
        median_core_clock_mhz=statistics.median(clocks) if clocks else None,
        pstates=tuple(dict.fromkeys(int(p) for p in col("pstate"))),
        p95_power_w=percentile(power, 95),
        power_limit_w=col("power_limit_w")[-1] if col("power_limit_w") else None,
        throttle_reasons=tuple(dict.fromkeys(r for s in samples for r in s.throttle_reasons or ())),
    )


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile: `percentile([1, 2, 3, 4], 95) == 4`, `percentile([], 95) is None`."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def voltage_effect(
    asked_mv: int, baseline_mv: float | None, measured_mv: float | None
) -> tuple[float | None, bool | None]:
    """(measured drop in mV, effective?) for an undervolt of `asked_mv` (negative) against the stock baseline's
    voltage under load. "Not effective" when the card dropped less than half of what was asked: GCN voltage edits
    turn AVFS off (smu7_update_avfs), so a written offset may not be the voltage the card runs at.
    (None, None) when either reading is missing or nothing was asked.

    >>> voltage_effect(-100, 1100.0, 1010.0), voltage_effect(-100, 1100.0, 1080.0), voltage_effect(-50, None, 900.0)
    ((90.0, True), (20.0, False), (None, None))
    """
    if asked_mv >= 0 or baseline_mv is None or measured_mv is None:
        return None, None
    drop_mv = round(baseline_mv - measured_mv, 1)
    return drop_mv, drop_mv >= -asked_mv / 2


def pstate_problem(seen: tuple[int, ...], applied: tuple[int, ...] | None) -> str | None:
    """Why a trial proved nothing: the card ran in a performance state that had no offset applied (NVIDIA offsets
    are per pstate; CUDA work often runs in P2). None when every state seen had the offset, or nothing is known.

    >>> pstate_problem((2,), (0, 2)), pstate_problem((2, 3), (0, 2)), pstate_problem((5,), None)
    (None, 'the card ran in P3, which had no offset applied (applied at P0, P2)', None)
    """
    if applied is None:
        return None
    missing = [p for p in seen if p not in applied]
    if not missing:
        return None
    states = ", ".join(f"P{p}" for p in missing)
    return f"the card ran in {states}, which had no offset applied (applied at {', '.join(f'P{p}' for p in applied)})"


class TelemetrySampler:
    """Samples `backend.telemetry(device_id)` every `interval_s` in a daemon thread until `stop()`.

    `expected_setting`: the card must read this setting throughout (a trial, issue 28.5): each sample also reads
    it back (`backend.knob`), and the first other value is kept in `setting_changed` (a line naming it); the
    sampler goes on, the trial decides."""

    def __init__(self, backend: Backend, device_id: str, *, interval_s: float = 1.0,
                 expected_setting: int | None = None):
        self.backend, self.device_id, self.interval_s = backend, device_id, interval_s
        self.samples: deque[Telemetry] = deque(maxlen=4 * 3600)  # four hours at 1 Hz
        self.device_lost: str | None = None
        self.error: str | None = None
        self.expected_setting = expected_setting
        self.setting_changed: str | None = None
        self.read_back_problem: str | None = None  # a read-back that failed (the first): the trial warns
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)

    def start(self) -> TelemetrySampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            self.sample_once()
            if self.device_lost or self.error or self._stop.wait(self.interval_s):
                return

    def sample_once(self) -> None:
        try:
            sample = self.backend.telemetry(self.device_id)
        except DeviceLost as e:
            self.device_lost = e.message
            return
        except (TunerError, OSError) as e:
            self.error = getattr(e, "message", str(e))
            return
        with self._lock:
            self.samples.append(sample)
        self.check_setting()

    def check_setting(self) -> None:
        """Read the setting back now (each sample does; the trial once more as its load ends)."""
        expected = self.expected_setting
        if expected is None or self.setting_changed is not None:
            return
        try:
            knob = self.backend.knob(self.device_id)
        except DeviceLost as e:
            self.device_lost = e.message
            return
        except (TunerError, OSError) as e:  # said, never skipped quietly: the trial warns
            self.read_back_problem = self.read_back_problem or (
                f"the setting could not be read back during the trial: {getattr(e, 'message', str(e))}")
            return
        if knob.current != expected:
            self.setting_changed = (f"the card read {knob.current:+d} {knob.unit} during the trial, set "
                                    f"{expected:+d} {knob.unit}: changed outside this bisect")

    def stop(self) -> TelemetrySummary:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        with self._lock:
            return summarize(list(self.samples))

    def latest(self) -> Telemetry | None:
        with self._lock:
            return self.samples[-1] if self.samples else None
