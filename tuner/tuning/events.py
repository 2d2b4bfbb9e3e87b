"""What a trial and a bisect report while they run: frozen dataclasses with `to_json()` (the `--json` lines and
the TUI's messages). Plus `TrialResult`, the measured outcome of one trial. No I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from tuner.core.json_values import finite
from tuner.core.models import Verdict


@dataclass(frozen=True)
class TrialResult:
    """One trial, measured. Verdict pass | fail | error | inconclusive (no evidence either way: run again) |
    stopped (stopped on request; not a result)."""

    setting: int
    unit: str
    phase: str
    verdict: str
    kind: str | None = None  # failure kind: mismatch, nonfinite, canary, gemm, hang, crash, device-error, kernel
    reason: str = ""
    fault_step: int | None = None
    reference_step: int | None = None  # the reference step the failing step was compared with (within the pass)
    steps: int | None = None
    warmup_steps: int | None = None  # the engine's warm-up (not compared); None when it did not say
    duration_s: float | None = None
    tok_s: float | None = None  # median engine throughput
    power_w: float | None = None  # mean board power from 1 Hz telemetry
    max_temp_c: float | None = None
    max_temp_edge_c: float | None = None
    max_temp_hotspot_c: float | None = None
    max_temp_mem_c: float | None = None
    energy_j: float | None = None
    j_per_tok: float | None = None
    tok_per_j: float | None = None
    efficiency_vs_stock: float | None = None  # tok_per_j / the baseline's tok_per_j
    edge: bool = False  # hang, machine reset, device lost: the recommendation keeps the edge margin
    injected: bool = False  # faults were injected by the simulated card (the software-fault rule ignores them)
    sensitivity: str | None = None  # the engine's "full" (bitwise) or "reduced" (tolerance mode)
    kernel_log: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    started_at: float | None = None
    simulated: bool = False
    voltage_mv: float | None = None  # mean core voltage under load (hwmon in0_input), where readable
    voltage_drop_mv: float | None = None  # the stock baseline's voltage under load minus this trial's
    effective: bool | None = None  # False: the measured drop is under half of the asked undervolt
    median_core_clock_mhz: float | None = None  # the clock sustained under load (the baseline's sets NVIDIA's lock)
    pstates: tuple[int, ...] = ()  # NVIDIA performance states seen under load
    p95_power_w: float | None = None  # 95th percentile of board power under load
    power_limit_w: float | None = None  # the board power limit the driver enforced, where it says
    throttle_reasons: tuple[str, ...] = ()  # clock-limit reasons the driver reported under load
    load_note: str | None = None  # baseline: "load X W of the card's Y W limit (Z %)"
    median_step_ms: float | None = None  # the engine's median step time (its end event): "hours of this load"

    @property
    def passed(self) -> bool:
        return self.verdict == Verdict.PASS

    def to_record(self) -> dict:
        return finite(asdict(self))

    @classmethod
    def from_record(cls, record: dict) -> TrialResult:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in record.items() if k in names}
        for key in ("kernel_log", "warnings", "pstates", "throttle_reasons"):
            kw[key] = tuple(kw.get(key) or ())
        return cls(**kw)

    def profile_trial(self) -> dict:
        """The `[[tuning.trials]]` entry of a profile (TOML has no null: unknowns are left out)."""
        d = {"setting": self.setting, "phase": self.phase, "verdict": self.verdict, "reason": self.reason or self.kind,
             "duration_s": self.duration_s, "tok_s": self.tok_s, "power_w": self.power_w,
             "tok_per_j": self.tok_per_j, "max_temp_c": self.max_temp_c, "fault_step": self.fault_step,
             "voltage_mv": self.voltage_mv, "voltage_drop_mv": self.voltage_drop_mv,
             "effective": self.effective, "pstates": list(self.pstates) or None,
             "clamped": [w.removeprefix("clamped: ") for w in self.warnings if w.startswith("clamped: ")] or None,
             "sensitivity": self.sensitivity}
        return {k: v for k, v in finite(d).items() if v is not None}


class _Event:
    event = "event"

    def to_json(self) -> dict:
        # Every concrete event is a dataclass; this base is not, so asdict() cannot be proven to accept self.
        return {"event": self.event, **finite(asdict(self))}  # type: ignore[call-overload]


@dataclass(frozen=True)
class SessionStarted(_Event):
    session: str
    device: str
    label: str
    unit: str
    stock: int
    resumed: bool
    params: dict = field(default_factory=dict)
    unsafe: tuple[int, ...] = ()
    event = "session_started"


@dataclass(frozen=True)
class TrialRecovered(_Event):
    """A trial left open by a dead tool or an earlier boot, now counted as a failure."""

    result: TrialResult
    device: str = ""  # the card it is about ("": not set; filled by the bisect driver)
    event = "trial_recovered"


@dataclass(frozen=True)
class TrialStarted(_Event):
    index: int
    setting: int
    unit: str
    phase: str
    duration_s: float
    started_at: float
    expected_trials: int | None = None  # a running estimate of the session's trial count (it grows while descending)
    device: str = ""  # the card it is about ("": not set; filled by the bisect driver)
    event = "trial_started"


FINISHING = "finishing"  # what a front end says of a trial past its time (TrialProgress.finishing)


def of_about(total: int | None) -> str:
    """' of ≤24': the plan's count is an upper bound (a descent to the range end or floor); it holds while trials
    pass and drops when a failure closes the bracket (tuner.tuning.plan.BisectPlan.remaining_estimate)."""
    return f" of ≤{total}" if total else ""


@dataclass(frozen=True)
class TrialProgress(_Event):
    setting: int
    phase: str
    elapsed_s: float
    duration_s: float
    eta_s: float  # this trial
    step: int | None = None
    tok_s: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    eta_total_s: float | None = None  # the whole bisect, a rough guess (filled by the driver)
    device: str = ""  # the card it is about ("": not set; filled by the bisect driver)
    event = "trial_progress"

    @property
    def finishing(self) -> bool:
        """Past its time: the engine ends at the next step boundary (a slow step; in a rig, the peers' steps)."""
        return bool(self.duration_s) and self.elapsed_s > self.duration_s


@dataclass(frozen=True)
class TrialWarning(_Event):
    message: str
    device: str = ""  # the card it is about ("": not set; filled by the bisect driver)
    event = "warning"


@dataclass(frozen=True)
class TrialFinished(_Event):
    index: int
    result: TrialResult
    device: str = ""  # the card it is about ("": not set; filled by the bisect driver)
    # a pass: the bound the evidence so far supports at its setting (issue 26; `bound.Bound.to_dict()` and `.text()`,
    # pooled over every pass there or deeper); None for a failure, a run at stock, or no compared steps
    bound: dict | None = None
    bound_text: str | None = None
    event = "trial_finished"


@dataclass(frozen=True)
class Recommendation(_Event):
    device: str
    unit: str
    setting: int
    confirmed: int | None
    lowest_pass: int | None
    first_failure: int | None
    margin: int
    edge: bool
    baseline_tok_s: float | None = None
    baseline_power_w: float | None = None
    baseline_tok_per_j: float | None = None
    tuned_tok_s: float | None = None
    tuned_power_w: float | None = None
    tuned_tok_per_j: float | None = None
    measured_at: int | None = None  # the setting the tuned figures were measured at
    efficiency_gain_pct: float | None = None
    sensitivity: str = "full"  # "reduced" when the user opted in to --tolerance
    # issue 26: the bound asked for (--bound; None: none), the pooled bound at the recommended setting and at the
    # confirmed value (`bound.Bound.to_dict()`), whether the confirmed value reached the one asked for, and the
    # one-line account `profile show` prints (`bound_line`)
    bound_s: float | None = None
    bound: dict | None = None
    confirmed_bound: dict | None = None
    bound_met: bool | None = None
    event = "recommendation"


@dataclass(frozen=True)
class BisectFailed(_Event):
    kind: str  # baseline-failed, not-repeatable, software-fault, error, device-lost, not-applied
    reason: str
    exit_code: int
    device: str = ""  # the card it is about ("": not set; filled by the bisect driver)
    event = "bisect_failed"


@dataclass(frozen=True)
class BisectStopped(_Event):
    reason: str
    resumable: bool = True
    device: str = ""  # the card it is about ("": not set; filled by the bisect driver)
    event = "bisect_stopped"


@dataclass(frozen=True)
class RigConfirmStarted(_Event):
    """A whole-rig run begins: every card at `settings` at once, one data-parallel job. `phase` "rig-baseline" is
    the recording at stock (attempt 0), "rig-confirm" a confirmation attempt (1, 2, ...)."""

    settings: dict[str, int]
    unit_by_device: dict[str, str]
    duration_s: float
    attempt: int
    phase: str = "rig-confirm"
    device: str = "rig"
    event = "rig_confirm_started"


@dataclass(frozen=True)
class RigConfirmFinished(_Event):
    """A whole-rig run ended. After a failure `backed_off` holds the next attempt's settings (every card);
    `reasons` says per card what went wrong (only the cards that failed)."""

    attempt: int
    passed: bool
    pinned: tuple[str, ...]
    machine_event: str | None
    backed_off: dict[str, int]
    reasons: dict[str, str] = field(default_factory=dict)
    phase: str = "rig-confirm"
    device: str = "rig"
    event = "rig_confirm_finished"


@dataclass(frozen=True)
class RigRecommendation(_Event):
    """The rig's final settings (cards that got a recommendation), with each card's own recommendation."""

    settings: dict[str, int]
    per_card: dict[str, Recommendation]
    device: str = "rig"
    event = "rig_recommendation"


TrialEvent = TrialStarted | TrialProgress | TrialWarning | TrialFinished
BisectEvent = (SessionStarted | TrialRecovered | TrialStarted | TrialProgress | TrialWarning | TrialFinished
               | Recommendation | BisectFailed | BisectStopped | RigConfirmStarted | RigConfirmFinished
               | RigRecommendation)
