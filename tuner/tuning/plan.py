"""The auto-bisect as a pure state machine: given the knob, the parameters and the results so far, say what to
test next or what to recommend. No I/O, no clock, no randomness; the driver (`bisect_job`) runs the trials.

Everything inside works in *steps from stock* (`k`, a count of the knob's own hardware steps in its aggressive
direction: 0 is stock, larger undervolts harder), so mV offsets (more negative is more aggressive) and NVIDIA
clock offsets (more positive is more aggressive) share one code path. `Knob.shifted` converts back.

Rules (docs/bisect.md): baseline at stock; coarse descent by `step` until a failure or the range end / floor;
bisection between the last pass and the first failure down to `resolution`; a failure at k fails every k' >= k
(never test beyond a failure; settings on the unsafe list count as failures and are never proposed); confirm the
lowest pass with a long run, stepping back one resolution step on failure (each value confirmed at most once);
recommend confirmed + margin (the edge margin when any trial hung or crashed); a non-finite, mismatch or canary
fault at the same step at two different settings is a software fault, not the voltage.

Repeatability (issue 12; both on when the driver asks, `PlanParams.replay_baseline` / `stock_control`): after the
baseline a `replay` at stock in a second engine process must reproduce the recording bit for bit, else the search
stops (`not-repeatable`) before any undervolt; a trial that fails only by `mismatch` or `canary` (not an injected
fault of the simulated card: that is the voltage by construction) is followed by one `control` trial at stock
against the same reference before its failure counts, at most one per setting; a control that fails too stops the
search (`not-repeatable`). Replays and controls never count as passes or failures of a setting.

The bound and trial sizing (issue 26; on when `PlanParams.bound_s` is set): every decision is sized by what it can
still tell us, in compared steps at the stock baseline's median step time. A trial at least one coarse step shallower
than every known failure is a *screen* (`--trial` / SCREEN_DIVISOR: far past the edge failures come early); one
nearer a failure *decides* between neighbours (one `--trial`); the confirmation runs exactly the steps the bound
still needs at the value it confirms after pooling every pass there or deeper (`tuner.tuning.bound`), never fewer
than two mixed-mode cycles. A passing confirmation that fell short of the bound (it ran fewer steps than asked) is
topped up at the same value. Every `Recommend` carries the pooled bound at the confirmed value and at the
recommended setting (which pools everything between them too), with where their steps came from. Reasoning and
figures: docs/bisect.md, "The bound and trial sizing".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tuner.core.errors import UsageError
from tuner.core.models import Knob, Phase, Verdict
from tuner.engine.options import EngineOptions
from tuner.tuning import bound as bounds
from tuner.tuning.bound import Bound
from tuner.tuning.evidence import MIN_COMPARED_STEPS, compared_steps

BASELINE, COARSE, REFINE, CONFIRM = Phase.BASELINE, Phase.COARSE, Phase.REFINE, Phase.CONFIRM
# at stock: the baseline replayed in a second process; a control after a fault
REPLAY, CONTROL = Phase.REPLAY, Phase.CONTROL
STOCK_PHASES = (BASELINE, REPLAY, CONTROL)  # runs at stock that test the platform, not a setting
PASS, FAIL, ERROR = Verdict.PASS, Verdict.FAIL, Verdict.ERROR
# Not evidence either way (too few compared steps, the tool died, the engine was killed from outside): the
# trial is recorded for the history but the plan ignores it, so the same value is proposed again.
INCONCLUSIVE = Verdict.INCONCLUSIVE
SOFTWARE_KINDS = ("nonfinite", "mismatch", "canary")
CONTROL_KINDS = ("mismatch", "canary")  # faults a platform that stopped repeating produces too
NOT_REPEATABLE = "not-repeatable"
NOT_REPEATABLE_HELP = ("likely causes: a kernel that is not deterministic on this platform (the engine's start event "
                       "lists the kernels chosen), or another process using the GPU (a display, a second job); "
                       "remedies: stop other GPU work and run again, update the driver and PyTorch, or opt in to the "
                       "weaker comparison with --tolerance (reduced sensitivity)")
EDGE_KINDS = ("hang", "system-reset", "device-lost", "gpu-reset", "fallen-off-bus", "vram-lost")

# Trial sizing (docs/bisect.md, "The bound and trial sizing").
SCREEN, DECIDE, BOUND = "screen", "decide", "bound"  # NextTrial.purpose
# A screen asks only "is this setting far past the edge?"; there failures come early (the R9700 at -65 mV: step
# 284, 24 s in, against the 5 min a failure near the edge may take), so a tenth of a deciding trial.
SCREEN_DIVISOR = 10
MAX_CONFIRM_PASSES = 3  # a passing confirmation that fell short of the bound is topped up at most this often
_MIXED = EngineOptions()
# The confirmation (mixed mode) runs at least two of the engine's mixed-mode cycles, so it always crosses idle->load:
# the load each cycle holds, full phase plus the duty-cycled partial one, in seconds of load.
MIXED_CYCLE_LOAD_S = _MIXED.mixed_full_s + _MIXED.mixed_partial_s * _MIXED.partial_duty
MIN_CONFIRM_LOAD_S = 2 * MIXED_CYCLE_LOAD_S
# The share of a mixed run's wall time that is load (144 of every 174 s): a confirmation's wall time is its
# `duration_s` over this, and `bound.check_reachable` takes it as `load_fraction`.
MIXED_LOAD_FRACTION = MIXED_CYCLE_LOAD_S / (_MIXED.mixed_full_s + _MIXED.mixed_partial_s + _MIXED.idle_gap_s)


@dataclass(frozen=True)
class PlanParams:
    """Search parameters in the knob's unit (mV or MHz). `floor` is the most aggressive value allowed."""

    step: int
    resolution: int
    margin: int
    edge_margin: int
    floor: int | None = None
    replay_baseline: bool = False  # replay the baseline at stock in a second process before any undervolt
    stock_control: bool = False  # a control at stock after a mismatch/canary failure
    # Trial sizing, on when `bound_s` is set: "at most one fault per bound_s of this load" at 95 % at the
    # recommendation; `trial_s` is one deciding trial (--trial).
    bound_s: float | None = None
    trial_s: float | None = None

    @classmethod
    def defaults_for(cls, knob: Knob, *, step: int | None = None, resolution: int | None = None,
                     margin: int | None = None, floor: int | None = None, replay_baseline: bool = False,
                     stock_control: bool = False, bound_s: float | None = None,
                     trial_s: float | None = None) -> PlanParams:
        """The documented defaults: 10/5/10 mV (edge 15) for mV knobs; 2/1/2 (edge 3) clock steps for MHz knobs.
        Trials are sized only when a bound is asked for (`bound_s`, with `trial_s`)."""
        if knob.unit == "mV":
            d_step, d_res, d_margin, d_edge = 10, 5, 10, 15
        else:
            d_step, d_res, d_margin, d_edge = 2 * knob.step, knob.step, 2 * knob.step, 3 * knob.step
        margin = d_margin if margin is None else margin
        return cls(step=d_step if step is None else step, resolution=d_res if resolution is None else resolution,
                   margin=margin, edge_margin=max(margin, d_edge), floor=floor, replay_baseline=replay_baseline,
                   stock_control=stock_control, bound_s=bound_s, trial_s=trial_s)


@dataclass(frozen=True)
class PlanResult:
    """What the plan needs to know about one finished trial."""

    setting: int
    phase: str
    verdict: str  # pass | fail | error | inconclusive (ignored)
    kind: str | None = None  # failure kind: mismatch, nonfinite, hang, canary, kernel, system-reset, ...
    fault_step: int | None = None  # the same-step rule's key: the step within the reference (see from_record)
    edge: bool = False  # the trial hung or crashed the machine
    injected: bool = False  # the simulated card injected faults at this setting
    reason: str = ""
    steps: int | None = None  # steps compared with the reference (after the warm-up); None: not known
    step_s: float | None = None  # the engine's median step time (the baseline's sets "hours of this load")

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
        # Only the engine's median step time: a trial's duration over its steps counts the start-up and the
        # compile, which would overstate the bound in hours.
        step_ms = record.get("median_step_ms")
        if isinstance(step_ms, bool) or not isinstance(step_ms, (int, float)) or not step_ms > 0:
            step_ms = None
        return cls(setting=record["setting"], phase=record["phase"], verdict=record["verdict"],
                   kind=record.get("kind"), fault_step=fault_step, edge=bool(record.get("edge")),
                   injected=bool(record.get("injected")), reason=record.get("reason") or "",
                   steps=compared_steps(record.get("steps"), record.get("warmup_steps")),
                   step_s=step_ms / 1000.0 if step_ms else None)


# --- decisions ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NextTrial:
    """Run `setting` in `phase`. Sized (a bound was asked for; else all None and the driver uses its own
    lengths): `steps` compared steps (the warm-up comes on top), `duration_s` the same in seconds of load at the
    baseline's step time (a mixed confirmation takes longer by its idle and partial phases), `purpose` screen,
    decide or bound; a confirmation also says the bound it aims for at the value it confirms (`bound_s`;
    `bound_steps`, the pooled steps that takes) and the steps already pooled there (`pooled_steps`)."""

    setting: int
    phase: str
    steps: int | None = None
    duration_s: float | None = None
    purpose: str | None = None
    bound_s: float | None = None
    bound_steps: int | None = None
    pooled_steps: int | None = None


@dataclass(frozen=True)
class Recommend:
    setting: int  # what to use: confirmed + margin (never past stock)
    confirmed: int | None  # the value that passed the long run (None when no undervolt step passed)
    lowest_pass: int | None  # the most aggressive value that passed a short trial
    first_failure: int | None  # the least aggressive value known to fail (trial or unsafe list)
    margin: int
    edge: bool  # the edge margin was used
    # The pooled bound at `setting` (every pass there or deeper, shallower than the first failure; what a profile
    # states) and at `confirmed` (what the confirmation proved), with where their steps came from; None when no
    # compared steps count. `bound_s`: what was asked for (None: no bound was asked for).
    bound: Bound | None = None
    confirmed_bound: Bound | None = None
    bound_s: float | None = None

    @property
    def bound_met(self) -> bool | None:
        """Whether the confirmed value reached the bound asked for (None: none was asked for; False when no
        undervolt was confirmed)."""
        if self.bound_s is None:
            return None
        return self.confirmed_bound is not None and self.confirmed_bound.reaches(self.bound_s)


@dataclass(frozen=True)
class Stop:
    """The search cannot go on: `kind` is baseline-failed, not-repeatable, software-fault or error."""

    kind: str
    reason: str


Decision = NextTrial | Recommend | Stop


def check_params(knob: Knob, p: PlanParams) -> None:
    """Raise UsageError when `p` cannot drive a search on `knob` (steps off the card's grid, a floor outside
    its range or not an undervolt). Front ends call it before starting anything."""
    unit = knob.unit
    for name, v in (("--step", p.step), ("--resolution", p.resolution)):
        if v <= 0 or v % knob.step:
            raise UsageError(f"{name} {v} {unit} is not a positive multiple of this card's {knob.step} {unit} "
                             "step", f"use a multiple of {knob.step}")
    for name, v in (("--margin", p.margin), ("edge margin", p.edge_margin)):
        if v < 0 or v % knob.step:
            raise UsageError(f"{name} {v} {unit} is not a multiple of this card's {knob.step} {unit} step",
                             f"use a multiple of {knob.step} (0 is allowed)")
    if p.bound_s is not None:
        if not (p.bound_s > 0 and math.isfinite(p.bound_s)):
            raise UsageError(f"--bound of {p.bound_s:g} s is not a positive duration", "e.g. --bound 10m or 2h")
        if p.trial_s is None or not p.trial_s >= 1:
            raise UsageError("a bound needs the length of a deciding trial (--trial) of at least 1 s",
                             "give --trial, e.g. 5m")
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


class BisectPlan:
    def __init__(self, knob: Knob, params: PlanParams, unsafe: Iterable[int] = (), unsafe_edge: bool = False):
        self.knob, self.params = knob, params
        check_params(knob, params)
        self.coarse_k = params.step // knob.step
        self.res_k = params.resolution // knob.step
        self.k_max = self._k_limit()
        # a listed value blocks every grid point at or beyond it (tuner.core.unsafe_rule), so the first blocked one
        # is its depth rounded away from stock: k_of's rounding toward stock dropped a value between stock and the
        # first step (-3 mV listed, the search went on to -10)
        listed = {v: (v - knob.stock) * knob.aggressive_direction for v in unsafe}
        self.unsafe_k = sorted({-(-d // knob.step) for d in listed.values() if d > 0})
        # stock listed, or an overvolt: every setting of the card, stock included, is at or beyond it
        self.unsafe_stock = next((v for v, d in sorted(listed.items(), key=lambda vd: vd[1]) if d <= 0), None)
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

    # --- the state machine ------------------------------------------------------------------------------------
    def decide(self, results: Sequence[PlanResult]) -> Decision:
        results = [r for r in results if r.verdict != INCONCLUSIVE]
        decision = self._decide(results)
        if isinstance(decision, NextTrial) and self.params.bound_s is not None:
            return self._sized(decision, results)
        return decision

    def _decide(self, results: list[PlanResult]) -> Decision:
        if self.unsafe_stock is not None:  # not even the baseline may run
            return Stop("error", f"{self._fmt(self.unsafe_stock)} is on this card's unsafe list, so every setting "
                        f"is at or beyond it, stock ({self._fmt(self.knob.stock)}) included: nothing can be "
                        "searched; if that entry is wrong, remove it with `tuner unsafe clear`")
        at = max((i for i, r in enumerate(results) if r.phase == BASELINE), default=None)  # the last baseline
        if at is None:
            return NextTrial(self.value(0), BASELINE)
        last_baseline = results[at]
        if last_baseline.kind == NOT_REPEATABLE:
            return self._not_repeatable(last_baseline, "the baseline's start-up check")
        if last_baseline.verdict == ERROR:
            return Stop("error", "the baseline at stock could not run (a setup problem, not the voltage)")
        if last_baseline.verdict != PASS:
            return Stop("baseline-failed", f"the baseline at stock failed ({last_baseline.kind or 'fault'}): the "
                        "card or the software is unstable before any undervolt")
        if self.params.replay_baseline:
            replay = next((r for r in results[at + 1:] if r.phase == REPLAY), None)
            if replay is None:
                return NextTrial(self.value(0), REPLAY)
            if replay.verdict == FAIL and self._is_edge(replay):
                return self._unstable_at_stock(replay)
            if replay.verdict == FAIL or replay.kind == NOT_REPEATABLE:
                return self._not_repeatable(replay, "a replay of the baseline in a second process")
            if replay.verdict == ERROR:
                return Stop("error", "the baseline's replay at stock could not run (a setup problem, not the "
                            "voltage)")
        trials = [r for r in results if r.phase not in STOCK_PHASES]
        if (error := next((r for r in trials if r.verdict == ERROR), None)) is not None:
            return Stop("error", f"the trial at {self._fmt(error.setting)} could not run (a setup problem, not "
                        "the voltage)")
        due = self._software_fault(trials) or (self._control(results) if self.params.stock_control else None)
        if due is not None:  # a software fault stops the search; a control at stock runs before anything else
            return due

        lo, fail_k = self._bracket(trials)
        hi = fail_k if fail_k is not None and fail_k <= self.k_max else None  # the bracket's failing end

        # coarse descent
        if hi is None and lo < self.k_max:
            return NextTrial(self.value(min(lo + self.coarse_k, self.k_max)), COARSE)
        if hi is not None and lo + self.coarse_k < hi and not any(r.phase in (REFINE, CONFIRM) for r in trials):
            return NextTrial(self.value(lo + self.coarse_k), COARSE)  # short of the failure (so of the range end)
        # refine (bisection on the resolution grid above the last pass)
        confirms = [r for r in trials if r.phase == CONFIRM]
        if hi is not None and not confirms:
            gaps = (hi - lo - 1) // self.res_k  # resolution steps strictly between lo and hi
            if gaps >= 1:
                return NextTrial(self.value(lo + ((gaps + 1) // 2) * self.res_k), REFINE)
        # confirm (a value at or beyond a failure is never the confirmed one, whatever passed there before)
        confirmed_ok = self._passes_k(confirms, fail_k)
        if confirmed_ok:
            c_k = confirmed_ok[-1]
            if self._top_up(c_k, confirms, results):
                return NextTrial(self.value(c_k), CONFIRM)
            return self._recommend(c_k, results)
        tried = {self.k_of(r.setting) for r in confirms}
        c = lo if not confirms else min(k for k in tried if k is not None) - self.res_k
        while c > 0 and (c in tried or (fail_k is not None and c >= fail_k)):
            c -= self.res_k
        if c <= 0:
            return self._recommend(None, results)
        return NextTrial(self.value(c), CONFIRM)

    def _not_repeatable(self, r: PlanResult, what: str) -> Stop:
        where = f"first differing step {r.fault_step}" if r.fault_step is not None else "no step recorded"
        if r.fault_step == 0:
            where = "it differed in the start-up check (step 0)"
        detail = f": {r.reason}" if r.reason else ""
        return Stop(NOT_REPEATABLE, f"this platform does not repeat bit for bit at stock ({what}, {where}){detail}. "
                    f"{NOT_REPEATABLE_HELP}")

    def _control(self, results: Sequence[PlanResult]) -> Decision | None:
        """A failure only by mismatch/canary needs a control at stock right after it (once per setting); a
        control that failed too means the platform stopped repeating."""
        controlled: set[int] = set()
        for i, r in enumerate(results):
            if r.phase in STOCK_PHASES or r.verdict != FAIL or r.kind not in CONTROL_KINDS or r.injected:
                continue
            if r.setting in controlled:
                continue
            nxt = results[i + 1] if i + 1 < len(results) else None
            if nxt is None:
                return NextTrial(self.value(0), CONTROL)
            if nxt.phase != CONTROL:
                continue  # recorded before controls existed
            controlled.add(r.setting)
            if nxt.verdict == FAIL and self._is_edge(nxt):
                return self._unstable_at_stock(nxt)
            if nxt.verdict != PASS:
                return self._not_repeatable(nxt, f"a control at stock after {r.kind} at {self._fmt(r.setting)}")
        return None

    def _software_fault(self, trials: Sequence[PlanResult]) -> Stop | None:
        seen: dict[int, int] = {}
        for r in trials:
            # step 0 is the start-up check every run begins with: the stock control (which runs it too) is the
            # judge there, so two settings failing it are not evidence of a software bug
            if r.verdict == FAIL and r.kind in SOFTWARE_KINDS and r.fault_step:
                key = r.fault_step
                if key in seen and seen[key] != r.setting:
                    return Stop("software-fault", f"{r.kind} at step {r.fault_step} at both "
                                f"{self._fmt(seen[key])} and {self._fmt(r.setting)}: the same step failing at two "
                                "settings is a software problem, not the voltage")
                seen.setdefault(key, r.setting)
        return None

    @staticmethod
    def _is_edge(r: PlanResult) -> bool:
        """The trial hung, reset the machine or lost the card (not a comparison that differed)."""
        return r.edge or r.kind in EDGE_KINDS

    def _edge(self, trials: Sequence[PlanResult]) -> bool:
        return self.unsafe_edge or any(self._is_edge(r) for r in trials if r.verdict == FAIL)

    @staticmethod
    def _unstable_at_stock(r: PlanResult) -> Stop:
        """A run at stock (the replay, a control) that hung or reset: nothing differed, so it says nothing about
        repeatability (and --tolerance would not help): the card or the machine is unstable before any undervolt."""
        detail = f": {r.reason}" if r.reason else ""
        return Stop("baseline-failed", f"the {r.phase} at stock failed ({r.kind or 'hang'}{detail}): the card or the "
                    "machine is unstable before any undervolt")

    def _ks(self, trials: Sequence[PlanResult], verdict: str) -> list[int]:
        """Steps from stock of the trials with `verdict` (overvolts left out)."""
        return [k for k in (self.k_of(r.setting) for r in trials if r.verdict == verdict) if k is not None]

    def _fail_k(self, trials: Sequence[PlanResult]) -> int | None:
        return min(self._ks(trials, FAIL) + self.unsafe_k, default=None)

    def _bracket(self, trials: Sequence[PlanResult]) -> tuple[int, int | None]:
        """(the deepest pass shallower than the first failure, or stock; the first failure, trial or unsafe list)."""
        fail_k = self._fail_k(trials)
        return max([0, *self._passes_k(trials, fail_k)]), fail_k

    def _passes_k(self, trials: Sequence[PlanResult], fail_k: int | None) -> list[int]:
        """Steps from stock of the passes shallower than `fail_k` (a value at or beyond a failure never counts)."""
        return [k for k in self._ks(trials, PASS) if fail_k is None or k < fail_k]

    def _recommend(self, confirmed_k: int | None, results: Sequence[PlanResult]) -> Recommend:
        trials = [r for r in results if r.phase not in STOCK_PHASES]
        edge = self._edge(trials)
        margin = self.params.edge_margin if edge else self.params.margin
        fail_k = self._fail_k(trials)
        passes_k = self._passes_k([r for r in trials if r.phase != CONFIRM], fail_k)
        rec_k = 0 if confirmed_k is None else max(0, confirmed_k - margin // self.knob.step)
        return Recommend(
            setting=self.value(rec_k),
            confirmed=None if confirmed_k is None else self.value(confirmed_k),
            lowest_pass=self.value(max(passes_k)) if passes_k else None,
            first_failure=None if fail_k is None else self.value(fail_k),
            margin=margin,
            edge=edge,
            bound=self.bound_at(self.value(rec_k), results),
            confirmed_bound=None if confirmed_k is None else self.bound_at(self.value(confirmed_k), results),
            bound_s=self.params.bound_s,
        )

    # --- the bound and trial sizing (docs/bisect.md, "The bound and trial sizing") -------------------------------
    def bound_at(self, value: int, results: Sequence[PlanResult]) -> Bound | None:
        """The pooled bound at `value`: every passing step at `value` or deeper, shallower than the first failure
        (trial or unsafe list). None at or beyond a failure, for an overvolt, or when no compared step counts.
        Stock runs (baseline, replay, controls) test the platform, not a setting: they do not count."""
        k = self.k_of(value)
        if k is None:
            return None
        results = [r for r in results if r.verdict != INCONCLUSIVE]
        trials = [r for r in results if r.phase not in STOCK_PHASES]
        evidence = [bounds.Evidence(depth, r.setting, r.phase, r.verdict == PASS, r.steps)
                    for r in trials if (depth := self.k_of(r.setting)) is not None]
        b = bounds.pooled(evidence, k, self._fail_k(trials), self._step_s(results))
        return b if b is not None and b.steps > 0 else None

    @staticmethod
    def _step_s(results: Sequence[PlanResult]) -> float | None:
        """The stock baseline's median step time: what "an hour of this load" is in steps."""
        baseline = next((r for r in reversed(results) if r.phase == BASELINE and r.verdict == PASS), None)
        return baseline.step_s if baseline is not None else None

    def _top_up(self, c_k: int, confirms: Sequence[PlanResult], results: Sequence[PlanResult]) -> bool:
        """A passing confirmation that fell short of the bound asked for (it ran fewer steps than asked) runs on
        at the same value, while each pass added steps, at most MAX_CONFIRM_PASSES passes."""
        if self.params.bound_s is None:
            return False
        passes = [r for r in confirms if r.verdict == PASS and self.k_of(r.setting) == c_k]
        if not passes[-1].steps or len(passes) >= MAX_CONFIRM_PASSES:
            return False
        have = self.bound_at(self.value(c_k), results)
        return have is not None and not have.reaches(self.params.bound_s)

    def _sized(self, d: NextTrial, results: Sequence[PlanResult]) -> Decision:
        """`d` with its length: a pure function of the results so far (the rule is in the module docstring)."""
        p = self.params
        if d.phase in STOCK_PHASES or p.bound_s is None or p.trial_s is None:
            return d  # the baseline is one --trial long; the replay and controls are sized by the driver
        step_s = self._step_s(results)
        if step_s is None or not step_s > 0:
            return Stop("error", "the stock baseline reported no median step time, so the bound asked for (load "
                        "time per fault) cannot be turned into steps: the engine is too old or its end event was "
                        "lost; run the baseline again (--restart)")
        trials = [r for r in results if r.phase not in STOCK_PHASES]
        k = self.k_of(d.setting)
        assert k is not None  # the plan proposes only settings on the undervolt side
        trial_steps = max(MIN_COMPARED_STEPS, round(p.trial_s / step_s))
        if d.phase == CONFIRM:
            need = bounds.steps_for_bound(p.bound_s, step_s)
            pooled = self.bound_at(d.setting, results)  # the confirmed value's own: "the bound at the answer"
            have = pooled.steps if pooled is not None else 0
            again = any(r.phase == CONFIRM and r.verdict == PASS and r.setting == d.setting for r in trials)
            least = MIN_COMPARED_STEPS if again else max(MIN_COMPARED_STEPS, math.ceil(MIN_CONFIRM_LOAD_S / step_s))
            steps = max(need - have, least)
            return NextTrial(d.setting, d.phase, steps=steps, duration_s=round(steps * step_s, 3), purpose=BOUND,
                             bound_s=p.bound_s, bound_steps=need, pooled_steps=have)
        fail_k = self._fail_k(trials)
        if fail_k is not None and fail_k - k < self.coarse_k:
            steps, purpose = trial_steps, DECIDE  # within one coarse step of a failure: deciding between neighbours
        else:
            steps, purpose = max(MIN_COMPARED_STEPS, math.ceil(trial_steps / SCREEN_DIVISOR)), SCREEN
        return NextTrial(d.setting, d.phase, steps=steps, duration_s=round(steps * step_s, 3), purpose=purpose)

    def _fmt(self, value: int) -> str:
        return f"{value:+d} {self.knob.unit}"

    # --- estimates (for ETAs; never used to decide) --------------------------------------------------------------
    def remaining_estimate(self, results: Sequence[PlanResult]) -> tuple[int, int]:
        """(short trials, confirm runs) still expected, this one included, if the short trials pass until the
        bracket closes: an upper bound that assumes the coarse descent runs to the bracket's end (the range end or
        floor, or just above a failure). Each passing coarse trial then uses up one of its own trials, so the
        session's total (trials done + this) stays put while the bound does, and drops only when a failure moves
        it; "one more coarse trial" made the count grow with every pass (~4, ~5, ... ~9)."""
        decision = self.decide(results)
        if not isinstance(decision, NextTrial):
            return 0, 0
        lo, fail_k = self._bracket([r for r in results if r.verdict != INCONCLUSIVE and r.phase not in STOCK_PHASES])
        if decision.phase == REFINE:  # bisecting n grid points takes at most n.bit_length() trials, this one included
            assert fail_k is not None  # a refine trial lies between a pass (or stock) and a failure
            return ((fail_k - lo - 1) // self.res_k).bit_length(), 1
        if decision.phase == CONFIRM:
            return 0, 1
        # the bracket a descent leaves is at most one coarse step wide, and no wider than the range (or floor)
        refine = max(0, (min(self.coarse_k, self.k_max) - 1) // self.res_k).bit_length()
        end_k = self.k_max if fail_k is None else min(self.k_max, fail_k - 1)
        coarse = max(1, -(-(end_k - lo) // self.coarse_k))  # ceil: coarse trials left down to the bound
        if decision.phase == COARSE:
            return coarse + refine, 1
        stock = 2 if decision.phase == BASELINE and self.params.replay_baseline else 1
        return stock + coarse + refine, 1
