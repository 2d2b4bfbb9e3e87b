"""The auto-bisect as a pure state machine: given the knob, the parameters and the results so far, say what to
test next or what to recommend. No I/O, no clock, no randomness; the driver (`bisect_job`) runs the trials.

Everything inside works in *steps from stock* (`k`, a count of the knob's own hardware steps in its aggressive
direction: 0 is stock, larger undervolts harder), so mV offsets (more negative is more aggressive) and NVIDIA
clock offsets (more positive is more aggressive) share one code path. `Knob.shifted` converts back.

Rules (docs/bisect.md): baseline at stock; coarse descent by `step` until a failure or the range end / floor;
bisection between the last pass and the first failure down to `resolution`; a failure at k fails every k' >= k
(never test beyond a failure; settings on the unsafe list count as failures and are never proposed); confirm the
lowest pass with a long run, stepping back one resolution step on failure (each value confirmed at most once);
recommend confirmed + margin (the edge margin when any trial hung or crashed); a non-finite or mismatch at the
same step at two different settings is a software fault, not the voltage.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tuner.core.errors import UsageError
from tuner.core.models import Knob

BASELINE, COARSE, REFINE, CONFIRM = "baseline", "coarse", "refine", "confirm"
PHASES = (BASELINE, COARSE, REFINE, CONFIRM)
PASS, FAIL, ERROR = "pass", "fail", "error"
# Not evidence either way (too few compared steps, the tool died, the engine was killed from outside): the
# trial is recorded for the history but the plan ignores it, so the same value is proposed again.
INCONCLUSIVE = "inconclusive"
SOFTWARE_KINDS = ("nonfinite", "mismatch")
EDGE_KINDS = ("hang", "system-reset", "device-lost", "gpu-reset", "fallen-off-bus", "vram-lost")


@dataclass(frozen=True)
class PlanParams:
    """Search parameters in the knob's unit (mV or MHz). `floor` is the most aggressive value allowed."""

    step: int
    resolution: int
    margin: int
    edge_margin: int
    floor: int | None = None

    @classmethod
    def defaults_for(cls, knob: Knob, *, step: int | None = None, resolution: int | None = None,
                     margin: int | None = None, floor: int | None = None) -> PlanParams:
        """The documented defaults: 10/5/10 mV (edge 15) for mV knobs; 2/1/2 (edge 3) clock steps for MHz knobs."""
        if knob.unit == "mV":
            d_step, d_res, d_margin, d_edge = 10, 5, 10, 15
        else:
            d_step, d_res, d_margin, d_edge = 2 * knob.step, knob.step, 2 * knob.step, 3 * knob.step
        margin = d_margin if margin is None else margin
        return cls(step=d_step if step is None else step, resolution=d_res if resolution is None else resolution,
                   margin=margin, edge_margin=max(margin, d_edge), floor=floor)


@dataclass(frozen=True)
class PlanResult:
    """What the plan needs to know about one finished trial."""

    setting: int
    phase: str
    verdict: str  # pass | fail | error | inconclusive (ignored)
    kind: str | None = None  # failure kind: mismatch, nonfinite, hang, canary, kernel, system-reset, ...
    fault_step: int | None = None  # the same-step rule's key: the step within the reference (see from_record)
    edge: bool = False  # the trial hung or crashed the machine

    @classmethod
    def from_record(cls, record: dict) -> PlanResult:
        """The trial record's step is the *reference step*: trials compare against a looped reference, so step
        N + k of a run repeats step k's batch from the same weights; the same computation failing at two
        settings is what points at the software. (Records without one were capped at the reference's length,
        where the two agree.) A simulated card's injected faults are not evidence of a software bug: the rule
        ignores them."""
        step = record.get("reference_step")
        if step is None:
            step = record.get("fault_step")
        fault_step = None if record.get("injected") else step
        return cls(setting=record["setting"], phase=record["phase"], verdict=record["verdict"],
                   kind=record.get("kind"), fault_step=fault_step, edge=bool(record.get("edge")))


# --- decisions ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NextTrial:
    setting: int
    phase: str


@dataclass(frozen=True)
class Recommend:
    setting: int  # what to use: confirmed + margin (never past stock)
    confirmed: int | None  # the value that passed the long run (None when no undervolt step passed)
    lowest_pass: int | None  # the most aggressive value that passed a short trial
    first_failure: int | None  # the least aggressive value known to fail (trial or unsafe list)
    margin: int
    edge: bool  # the edge margin was used


@dataclass(frozen=True)
class Stop:
    """The search cannot go on: `kind` is baseline-failed, software-fault or error."""

    kind: str
    reason: str


Decision = NextTrial | Recommend | Stop


class BisectPlan:
    def __init__(self, knob: Knob, params: PlanParams, unsafe: Iterable[int] = (), unsafe_edge: bool = False):
        self.knob, self.params = knob, params
        self.validate()
        self.coarse_k = params.step // knob.step
        self.res_k = params.resolution // knob.step
        self.k_max = self._k_limit()
        self.unsafe_k = sorted({k for k in (self.k_of(v) for v in unsafe) if k is not None and k > 0})
        self.unsafe_edge = unsafe_edge

    # --- conversions ------------------------------------------------------------------------------------------
    def value(self, k: int) -> int:
        return self.knob.shifted(self.knob.stock, k)

    def k_of(self, value: int) -> int | None:
        """Steps from stock of `value`, rounded toward stock when off-grid; None for an overvolt."""
        delta = (value - self.knob.stock) * self.knob.aggressive_direction
        if delta < 0:
            return None
        return delta // self.knob.step

    def _k_limit(self) -> int:
        end = self.knob.min if self.knob.aggressive_direction < 0 else self.knob.max
        k_end = (end - self.knob.stock) * self.knob.aggressive_direction // self.knob.step
        if self.params.floor is None:
            return max(0, k_end)
        return max(0, min(k_end, self.k_of(self.params.floor) or 0))

    def validate(self) -> None:
        knob, p, unit = self.knob, self.params, self.knob.unit
        for name, v in (("--step", p.step), ("--resolution", p.resolution)):
            if v <= 0 or v % knob.step:
                raise UsageError(f"{name} {v} {unit} is not a positive multiple of this card's {knob.step} {unit} "
                                 "step", f"use a multiple of {knob.step}")
        for name, v in (("--margin", p.margin), ("edge margin", p.edge_margin)):
            if v < 0 or v % knob.step:
                raise UsageError(f"{name} {v} {unit} is not a multiple of this card's {knob.step} {unit} step",
                                 f"use a multiple of {knob.step} (0 is allowed)")
        if p.step % p.resolution:
            raise UsageError(f"--step {p.step} is not a multiple of --resolution {p.resolution}",
                             "e.g. --step 10 --resolution 5")
        if p.floor is not None:
            if not knob.min <= p.floor <= knob.max:
                raise UsageError(f"--floor {p.floor:+d} {unit} is outside this card's range "
                                 f"{knob.min:+d}..{knob.max:+d} {unit}", "pick a floor inside the range")
            if not knob.more_aggressive(p.floor, knob.stock):
                raise UsageError(f"--floor {p.floor:+d} {unit} is not an undervolt",
                                 f"give a value beyond stock ({knob.stock:+d}) in the undervolt direction")

    # --- the state machine ------------------------------------------------------------------------------------
    def decide(self, results: Sequence[PlanResult]) -> Decision:
        results = [r for r in results if r.verdict != INCONCLUSIVE]
        baseline = [r for r in results if r.phase == BASELINE]
        if not baseline:
            return NextTrial(self.value(0), BASELINE)
        last_baseline = baseline[-1]
        if last_baseline.verdict == ERROR:
            return Stop("error", "the baseline at stock could not run (a setup problem, not the voltage)")
        if last_baseline.verdict != PASS:
            return Stop("baseline-failed", f"the baseline at stock failed ({last_baseline.kind or 'fault'}): the "
                        "card or the software is unstable before any undervolt")
        trials = [r for r in results if r.phase != BASELINE]
        for r in trials:
            if r.verdict == ERROR:
                return Stop("error", f"the trial at {self._fmt(r.setting)} could not run (a setup problem, not "
                            "the voltage)")
        software = self._software_fault(trials)
        if software:
            return software

        fails_k = [self.k_of(r.setting) for r in trials if r.verdict == FAIL]
        fail_k = min([k for k in fails_k if k is not None] + self.unsafe_k, default=None)
        passes_k = [k for k in (self.k_of(r.setting) for r in trials if r.verdict == PASS) if k is not None]
        lo = max([0] + [k for k in passes_k if fail_k is None or k < fail_k])
        hi = fail_k if fail_k is not None and fail_k <= self.k_max else None  # the bracket's failing end

        # coarse descent
        if hi is None and lo < self.k_max:
            return NextTrial(self.value(min(lo + self.coarse_k, self.k_max)), COARSE)
        if hi is not None and not any(r.phase in (REFINE, CONFIRM) for r in trials):
            candidate = lo + self.coarse_k
            if candidate < hi and candidate <= self.k_max:
                return NextTrial(self.value(candidate), COARSE)
        # refine (bisection on the resolution grid above the last pass)
        confirms = [r for r in trials if r.phase == CONFIRM]
        if hi is not None and not confirms:
            gaps = (hi - lo - 1) // self.res_k  # resolution steps strictly between lo and hi
            if gaps >= 1:
                return NextTrial(self.value(lo + ((gaps + 1) // 2) * self.res_k), REFINE)
        # confirm
        confirmed_ok = [self.k_of(r.setting) for r in confirms if r.verdict == PASS]
        if confirmed_ok:
            return self._recommend(confirmed_ok[-1], results)
        tried = {self.k_of(r.setting) for r in confirms}
        if not confirms:
            c = lo
        else:
            c = min(k for k in tried if k is not None) - self.res_k
        while c > 0 and (c in tried or (fail_k is not None and c >= fail_k)):
            c -= self.res_k
        if c <= 0:
            return self._recommend(None, results)
        return NextTrial(self.value(c), CONFIRM)

    def _software_fault(self, trials: Sequence[PlanResult]) -> Stop | None:
        seen: dict[int, int] = {}
        for r in trials:
            if r.verdict == FAIL and r.kind in SOFTWARE_KINDS and r.fault_step is not None:
                key = r.fault_step
                if key in seen and seen[key] != r.setting:
                    return Stop("software-fault", f"{r.kind} at step {r.fault_step} at both "
                                f"{self._fmt(seen[key])} and {self._fmt(r.setting)}: the same step failing at two "
                                "settings is a software problem, not the voltage")
                seen.setdefault(key, r.setting)
        return None

    def _recommend(self, confirmed_k: int | None, results: Sequence[PlanResult]) -> Recommend:
        trials = [r for r in results if r.phase != BASELINE]
        edge = self.unsafe_edge or any(r.edge or r.kind in EDGE_KINDS for r in trials if r.verdict == FAIL)
        margin = self.params.edge_margin if edge else self.params.margin
        fails_k = [k for k in (self.k_of(r.setting) for r in trials if r.verdict == FAIL) if k is not None]
        fail_k = min(fails_k + self.unsafe_k, default=None)
        passes_k = [k for k in (self.k_of(r.setting) for r in trials if r.verdict == PASS and r.phase != CONFIRM)
                    if k is not None and (fail_k is None or k < fail_k)]
        if confirmed_k is None:
            rec_k = 0
        else:
            rec_k = max(0, confirmed_k - margin // self.knob.step)
        return Recommend(
            setting=self.value(rec_k),
            confirmed=None if confirmed_k is None else self.value(confirmed_k),
            lowest_pass=self.value(max(passes_k)) if passes_k else None,
            first_failure=None if fail_k is None else self.value(fail_k),
            margin=margin,
            edge=edge,
        )

    def _fmt(self, value: int) -> str:
        return f"{value:+d} {self.knob.unit}"

    # --- estimates (for ETAs; never used to decide) --------------------------------------------------------------
    def remaining_estimate(self, results: Sequence[PlanResult]) -> tuple[int, int]:
        """(short trials, confirm runs) still expected if the next short trials pass until the bracket closes.

        A rough guess: the coarse descent's length is unknowable, so one more coarse trial is assumed."""
        decision = self.decide(results)
        if not isinstance(decision, NextTrial):
            return 0, 0
        refine = max(0, (self.coarse_k // self.res_k - 1).bit_length())
        if decision.phase == BASELINE:
            return 2 + refine, 1
        if decision.phase == COARSE:
            return 1 + refine, 1
        if decision.phase == REFINE:
            return 1 + refine // 2, 1
        return 0, 1
