"""What a run with no fault proves: a stated upper bound on the per-step fault rate, in steps and in hours of load.

Zero faults in n compared steps supports "the per-step fault rate is below p" at 95 % confidence, where p is the
exact one-sided Clopper-Pearson bound 1 - 0.05^(1/n): the rule of three (p ~ 3/n) with the small-n case exact
(n = 1: 0.95; n = 10: 0.259, not 0.3). With k faults the bound is the p at which k or fewer faults in n steps has
probability 5 % (`fault_rate_upper`). Turned around, "at most one fault per D of this load" at a step time of
`step_s` needs the bound below step_s / D: about 3 D of load with no fault (`steps_for_bound`).

Pooling (monotonicity, docs/bisect.md "The bound"): failures are monotone in depth, so the fault rate at a setting is
at most the rate at any deeper one. Zero faults in n steps at a deeper setting is then evidence of the same strength
for every shallower setting, and steps add up: the bound at depth d counts every passing step at depths in
[d, first failure). Nothing at or beyond a known failure counts (a failure is never overruled by a deeper pass), and
a setting at or beyond it has no bound at all. `Bound.contributions` says which trials gave how many steps.

Pure functions; no I/O. The requested bound's parser (`parse_bound_s`) and the check that it can be reached in the
time allowed (`check_reachable`) raise `UsageError` (one line, exit 2, nothing changed).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from tuner.core.durations import MIN_DURATION_S, format_duration, parse_duration_s
from tuner.core.errors import UsageError

CONFIDENCE = 0.95
DEFAULT_BOUND_S = 600.0  # 10 min of load: today's 30 min mixed confirmation alone gives 8.3 min (docs/bisect.md)
_BISECT_ITERATIONS = 200  # the k > 0 bound by bisection on [0, 1]: far below float resolution


def fault_rate_upper(steps: int, faults: int = 0, confidence: float = CONFIDENCE) -> float:
    """The one-sided Clopper-Pearson upper bound on the per-step fault rate after `faults` in `steps` steps.

    >>> round(fault_rate_upper(1), 3), round(fault_rate_upper(10), 4), round(fault_rate_upper(3000) * 3000, 3)
    (0.95, 0.2589, 2.994)
    >>> round(fault_rate_upper(10, 1), 4), fault_rate_upper(0), fault_rate_upper(5, 5)
    (0.3942, 1.0, 1.0)
    """
    if steps < 0 or not 0 <= faults <= max(steps, 0):
        raise ValueError(f"{faults} faults in {steps} steps")
    alpha = 1.0 - confidence
    if steps == 0 or faults == steps:
        return 1.0
    if faults == 0:
        return -math.expm1(math.log(alpha) / steps)  # 1 - alpha^(1/n), exact and accurate for large n
    lo, hi = 0.0, 1.0  # P(X <= faults) falls as the rate rises: the rate where it crosses alpha
    for _ in range(_BISECT_ITERATIONS):
        mid = (lo + hi) / 2
        if binomial_cdf(faults, steps, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in logs (n may be millions of steps)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
             for i in range(min(k, n) + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * math.fsum(math.exp(t - top) for t in terms))


def steps_for_rate(rate: float, confidence: float = CONFIDENCE) -> int:
    """The fewest steps with no fault that bound the per-step fault rate at or below `rate`.

    >>> steps_for_rate(0.05), steps_for_rate(0.5), steps_for_rate(0.001)
    (59, 5, 2995)
    """
    if not rate > 0:
        raise ValueError(f"a rate bound must be positive, not {rate}")
    if rate >= 1.0:
        return 1
    n = max(1, math.ceil(math.log(1.0 - confidence) / math.log1p(-rate)))
    while n > 1 and fault_rate_upper(n - 1, confidence=confidence) <= rate:  # float rounding at the boundary
        n -= 1
    while fault_rate_upper(n, confidence=confidence) > rate:
        n += 1
    return n


def steps_for_bound(bound_s: float, step_s: float, confidence: float = CONFIDENCE) -> int:
    """Steps with no fault needed for "at most one fault per `bound_s` of this load" at `step_s` per step."""
    if not (bound_s > 0 and step_s > 0):
        raise ValueError(f"bound {bound_s} s at {step_s} s/step")
    return steps_for_rate(step_s / bound_s, confidence)


def load_needed_s(bound_s: float, confidence: float = CONFIDENCE) -> float:
    """Seconds of this load with no fault that reach `bound_s`, whatever the step time: -ln(0.05) = 3.0 x the
    bound (never less than what `steps_for_bound` asks at any step time, so it is safe to quote up front)."""
    return -math.log(1.0 - confidence) * bound_s


@dataclass(frozen=True)
class Contribution:
    """Steps with no fault from the trials of one setting and phase that count toward a bound."""

    setting: int
    phase: str
    steps: int


@dataclass(frozen=True)
class Bound:
    """What `steps` compared steps with `faults` faults support: the per-step fault rate is below `rate` at 95 %;
    with `step_s` (the stock baseline's median step time), at most one fault per `duration_s` of this load."""

    steps: int
    faults: int = 0
    step_s: float | None = None
    contributions: tuple[Contribution, ...] = ()
    confidence: float = CONFIDENCE

    @property
    def rate(self) -> float:
        return fault_rate_upper(self.steps, self.faults, self.confidence)

    @property
    def steps_per_fault(self) -> float:
        """At most one fault per this many steps (the rule of three: about steps / 3)."""
        return math.inf if self.rate == 0 else 1.0 / self.rate

    @property
    def duration_s(self) -> float | None:
        """At most one fault per this many seconds of this load (None: the step time is unknown)."""
        if self.step_s is None:
            return None
        return self.steps_per_fault * self.step_s

    def reaches(self, bound_s: float) -> bool:
        """Whether this evidence supports "at most one fault per `bound_s` of this load" (no steps: nothing)."""
        return self.steps > 0 and self.step_s is not None and self.rate <= self.step_s / bound_s  # as steps_for_bound

    def text(self) -> str:
        """'at most one fault per 10m02s of this load (95 %; 21,180 steps with no fault)'."""
        per = (f"{format_duration(self.duration_s)} of this load" if self.duration_s is not None
               else f"{self.steps_per_fault:,.0f} steps")
        faults = "no fault" if self.faults == 0 else f"{self.faults} fault{'s' * (self.faults > 1)}"
        return f"at most one fault per {per} ({self.confidence:.0%}; {self.steps:,} steps with {faults})"

    def provenance(self, unit: str) -> str:
        """'-50 mV confirm 17,650 + -50 mV refine 3,530 + -40 mV coarse 350': where the steps came from."""
        return " + ".join(f"{c.setting:+d} {unit} {c.phase} {c.steps:,}" for c in self.contributions) or "none"

    @classmethod
    def from_dict(cls, d: dict) -> Bound:
        """Back from `to_dict` (a profile's `[tuning] bound`, a journal's recommendation); the derived figures are
        recomputed from the counts, never trusted."""
        parts = tuple(Contribution(int(c["setting"]), str(c["phase"]), int(c["steps"]))
                      for c in d.get("contributions") or ())
        step_s = d.get("step_s")
        return cls(steps=int(d["steps"]), faults=int(d.get("faults") or 0),
                   step_s=float(step_s) if step_s else None, contributions=parts,
                   confidence=float(d.get("confidence") or CONFIDENCE))

    def to_dict(self) -> dict:
        """For a profile's `[tuning]` table and `--json` (TOML has no null: an unknown duration is left out)."""
        d: dict = {"confidence": self.confidence, "steps": self.steps, "faults": self.faults,
                   "rate_per_step": self.rate, "steps_per_fault": round(self.steps_per_fault, 1),
                   "contributions": [asdict(c) for c in self.contributions]}
        if self.duration_s is not None:
            d["duration_s"] = round(self.duration_s, 1)
            d["hours"] = round(self.duration_s / 3600.0, 3)
            d["step_s"] = self.step_s
        return d


def describe(bound: dict | None, confirmed_bound: dict | None, setting: int, confirmed: int | None, unit: str,
             bound_s: float | None) -> str | None:
    """The one-line account the bisect's report and `profile show` print (each from `Bound.to_dict()` forms):
    'at most one fault per 10m12s of this load (95%; 21,498 steps with no fault) at -40 mV: -50 mV confirm 20,792 +
    -40 mV coarse 353; -50 mV confirmed to 10m00s (asked 10m00s: reached)'. None when no pass counts."""
    if bound is None:
        return None
    b = Bound.from_dict(bound)
    line = f"{b.text()} at {setting:+d} {unit}: {b.provenance(unit)}"
    if confirmed_bound is not None and confirmed is not None:
        c = Bound.from_dict(confirmed_bound)
        per = format_duration(c.duration_s) if c.duration_s is not None else f"{c.steps_per_fault:,.0f} steps"
        line += f"; {confirmed:+d} {unit} confirmed to {per}"
        if bound_s is not None:
            line += f" (asked {format_duration(bound_s)}: {'reached' if c.reaches(bound_s) else 'NOT reached'})"
    elif bound_s is not None:
        line += f" (asked {format_duration(bound_s)}: NOT reached, nothing confirmed)"
    return line


@dataclass(frozen=True)
class Evidence:
    """One finished trial as evidence: its depth (steps from stock; deeper undervolts harder), whether it passed,
    and its compared steps (None: not known)."""

    depth: int
    setting: int
    phase: str
    passed: bool
    steps: int | None


def pooled(evidence: Iterable[Evidence], depth: int, fail_depth: int | None, step_s: float | None) -> Bound | None:
    """The bound at `depth` from every pass at depths in [depth, fail_depth): None when `depth` is at or beyond
    the shallowest known failure (it fails; no pass can say otherwise)."""
    if fail_depth is not None and depth >= fail_depth:
        return None
    by_trial: dict[tuple[int, int, str], int] = {}  # (depth, setting, phase) -> steps, in the order first seen
    for e in evidence:
        if not e.passed or not e.steps or e.depth < depth or (fail_depth is not None and e.depth >= fail_depth):
            continue
        key = (e.depth, e.setting, e.phase)
        by_trial[key] = by_trial.get(key, 0) + e.steps
    parts = tuple(Contribution(s, ph, n) for (_d, s, ph), n in sorted(by_trial.items(), key=lambda t: -t[0][0]))
    return Bound(steps=sum(c.steps for c in parts), step_s=step_s, contributions=parts)


# --- what the user asks for ---------------------------------------------------------------------------------------
_ZERO = re.compile(r"(?:0+(?:\.0+)?[hms])+")
_HINT = "give the load per fault you need, with a unit, e.g. --bound 10m or --bound 2h"


def parse_bound_s(text: str) -> float:
    """`--bound DURATION`: "at most one fault per DURATION of this load" (95 %), in seconds.

    >>> parse_bound_s("2h"), parse_bound_s("10m"), parse_bound_s("1h30m")
    (7200.0, 600.0, 5400.0)
    """
    t = str(text).strip().lower()
    if t.startswith("-"):
        raise UsageError(f"--bound {text}: a bound cannot be negative", _HINT)
    if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", t):
        raise UsageError(f"--bound {text}: no unit (seconds, minutes or hours?)", _HINT)
    if _ZERO.fullmatch(t):
        raise UsageError(f"--bound {text}: a bound of zero asks for no fault ever, which no test can show", _HINT)
    try:
        return parse_duration_s(t)
    except UsageError as e:  # the bound's own words ("use seconds" would be wrong here)
        what = "out of range (1s to 7 days)" if "out of range" in e.message else "not a duration"
        raise UsageError(f"--bound {text or repr(text)}: {what}", _HINT) from None


def check_reachable(bound_s: float, allowed_s: float, allowed_by: str, *, load_fraction: float = 1.0) -> None:
    """Before starting: refuse a bound whose evidence cannot fit in the time allowed (`allowed_by`, e.g.
    "--confirm 30m"). `load_fraction`: the share of wall time that is load (the mixed confirmation's idle gaps and
    partial load make it about 0.83). Quotes the time it would take."""
    need_s = load_needed_s(bound_s) / load_fraction
    if need_s > allowed_s:
        under_s = bound_s * allowed_s / need_s  # a bound under 1 s is no --bound anyone can give: not suggested
        smaller = f" or ask for a bound under {format_duration(under_s)}" if under_s >= MIN_DURATION_S + 0.5 else ""
        raise UsageError(f"--bound {format_duration(bound_s)} needs about {format_duration(need_s)} of running with "
                         f"no fault ({CONFIDENCE:.0%}: about 3x the bound), more than {allowed_by} allows",
                         f"allow at least {format_duration(need_s)}{smaller}")
