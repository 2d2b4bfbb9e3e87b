"""From a card's engine runs to its verdict: pass, fail, retest or incomparable, with the attribution of a fault and
the action a scheduler should take. Pure: the runs are summaries (`RunSummary`), the rules are here and only here.

Fault attribution (docs/screen.md): a fault in the screen run is re-run from the same state on the same card (the
same seed and batches from the initial weights: the engine is deterministic, so the state at every step is the
one the fault met, rebuilt bit for bit), ending at the first fault. How long: three times the load the first fault
took to appear, and at least the tier's (`attribution_load_s`): a persistent fault at the rate the first one
suggests (one per that load) then shows again with probability 1 - e^-3 = 95 %, so "it did not repeat" means
something; the stock run gets the same load, so "at stock it matched" does too.
- it does not come back: **transient** -> `retest` (a fault that did not repeat);
- it comes back and the card is at stock: **persistent at stock** -> `fail`, `drain` (a bad card at any setting);
- it comes back off stock: the same steps run at stock. A fault there too: **persistent at stock** (`drain`);
  none: **persistent at this setting** (`raise voltage`: the undervolt is too deep, the card is good at stock);
  the stock run could not be made (no write access, an error): still persistent, `reset to stock` (the safe
  side until stock is proven).
A hang, a lost card or a GPU reset is never re-run (it may take the machine down again): `fail`, not attributed,
`reset to stock` (or `drain` at stock). A fault whose repeat could not run is treated as persistent (the safe side).
A run that could not compare any step (setup error, stopped, too short) is never a pass: `retest`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.actions.screen.verdict import (
    SEVERITY,
    VERDICT_EXIT,
    Action,
    Attribution,
    RunPurpose,
    Severity,
    TierName,
    VerdictName,
)
from tuner.tuning.plan import EDGE_KINDS

# how a run ended, as the attribution needs it
PASS, FAULT, HARD, ERROR, INCOMPARABLE, STOPPED, NOT_RUN = (
    "pass", "fault", "hard", "error", "incomparable", "stopped", "not-run")

# detector per fault kind (evidence.detectors_fired)
DETECTOR_OF = {"mismatch": "reference", "not-repeatable": "reference", "canary": "canary", "gemm": "gemm",
               "nonfinite": "non-finite", "device-error": "device errors", "hang": "watchdog", "crash": "crash",
               "ecc": "error counters"}


@dataclass(frozen=True)
class Tier:
    """A screen's length, named like DCGM's diagnostic levels (dcgmi diag -r 1/2/3: quick, medium, long)."""

    name: TierName
    load_s: float
    dcgm_level: int | None


TIERS = {"quick": Tier("quick", 30.0, 1), "standard": Tier("standard", 120.0, 2), "long": Tier("long", 900.0, 3)}
TIER_ALIASES = {"1": "quick", "2": "standard", "3": "long", "r1": "quick", "r2": "standard", "r3": "long",
                "medium": "standard"}


def tier_named(text: str) -> Tier:
    name = TIER_ALIASES.get(text.strip().lower(), text.strip().lower())
    if name not in TIERS:
        raise ValueError(f"unknown tier {text!r}: quick (30 s, DCGM level 1), standard (2 min, level 2) or long "
                         "(15 min, level 3)")
    return TIERS[name]


def reference_tier(recording_tier: str, load_s: float) -> Tier:
    """The tolerance mode's tier: each run is the reference's steps, whatever tier was asked for, so the tier said
    is the reference's recording (its tier, or `custom`, and the load it was recorded for)."""
    tier = TIERS.get(recording_tier)
    if tier is not None and tier.load_s == load_s:
        return tier
    return Tier("custom", load_s, None)


def attribution_load_s(tier_load_s: float, first_fault_after_s: float | None) -> float:
    """The load of the repeat and the stock run: 3 x the time the first fault took (at least the tier's load).

    >>> attribution_load_s(30.0, 2.0), attribution_load_s(30.0, 25.0), attribution_load_s(30.0, None)
    (30.0, 75.0, 30.0)
    """
    if first_fault_after_s is None or not first_fault_after_s > 0:
        return tier_load_s
    return max(tier_load_s, 3.0 * first_fault_after_s)


@dataclass(frozen=True)
class RunSummary:
    """One engine run as the verdict needs it."""

    purpose: RunPurpose
    setting: int
    outcome: str  # PASS, FAULT, HARD, ERROR, INCOMPARABLE, STOPPED, NOT_RUN
    reason: str
    kind: str | None = None
    engine_verdict: str = "error"
    steps: int = 0
    compared_steps: int = 0
    step: int | None = None
    reference_step: int | None = None
    figure: str | None = None
    duration_s: float | None = None
    median_step_ms: float | None = None
    reference_steps: int = 0
    segments: int = 0
    keys: tuple[str, ...] = ()  # INCOMPARABLE: the engine fingerprint keys that differ
    kernel_lines: tuple[str, ...] = ()


def classify(verdict: str, kind: str | None, *, compared_steps: int, edge: bool = False,
             incomparable_keys: tuple[str, ...] = ()) -> str:
    """A run's outcome from its verdict and kind (and, for a pass, whether it compared any step)."""
    if incomparable_keys:
        return INCOMPARABLE
    if verdict == "fail":
        return HARD if edge or kind in EDGE_KINDS else FAULT
    if verdict == "pass":
        return PASS if compared_steps > 0 else ERROR
    if verdict == "stopped" or kind in ("interrupted", "stopped"):
        return STOPPED
    return ERROR


@dataclass(frozen=True)
class Decision:
    verdict: VerdictName
    action: Action
    attribution: Attribution | None
    reason: str

    @property
    def severity(self) -> Severity:
        return SEVERITY[self.verdict]

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]


def needs_repeat(first: RunSummary) -> bool:
    return first.outcome == FAULT


def needs_stock(first: RunSummary, repeat: RunSummary | None, at_stock: bool) -> bool:
    """A fault that repeated off stock: run at stock. Not after a repeat that hung, lost the card or reset it:
    nothing more is written to that card or run on it (it may take the machine down again)."""
    return first.outcome == FAULT and not at_stock and repeat is not None and repeat.outcome == FAULT


def decide(first: RunSummary, repeat: RunSummary | None = None, stock: RunSummary | None = None, *,
           at_stock: bool, unit: str = "", tolerance: bool = False) -> Decision:
    """The verdict of one card from its screen run and, after a fault, the repeat and the stock run. `tolerance`:
    the runs were judged by their held-out losses (their reasons say the comparison), not bit for bit."""
    o = first.outcome
    if o == INCOMPARABLE:
        return Decision("incomparable", "retest", None, first.reason)
    if o == PASS and tolerance:  # never worded as the bitwise pass: the tolerance mode is much weaker
        return Decision("pass", "ok", None, "tolerance mode (reduced sensitivity: held-out losses compared, not "
                        f"bits): {first.reason}, within the margin")
    if o == PASS:
        return Decision("pass", "ok", None, f"{first.compared_steps:,} steps compared bit for bit, no difference")
    if o in (ERROR, STOPPED, NOT_RUN):
        return Decision("retest", "retest", None, f"the screen could not compare its steps: {first.reason}")
    what = _fault_text(first)
    if o == HARD:
        return Decision("fail", "drain" if at_stock else "reset to stock", "not attributed",
                        f"{what}; not re-run (a hang, lost card or reset may take the machine down again)")
    # a fault: did it repeat?
    if repeat is None or repeat.outcome in (ERROR, STOPPED, NOT_RUN):
        why = "it was not re-run" if repeat is None else f"the re-run could not finish ({repeat.reason})"
        return Decision("fail", "drain" if at_stock else "reset to stock", "not attributed",
                        f"{what}; {why}: treated as persistent")
    if repeat.outcome == INCOMPARABLE:  # cannot happen with one reference; said plainly if it does
        return Decision("fail", "drain" if at_stock else "reset to stock", "not attributed",
                        f"{what}; the re-run was refused ({repeat.reason})")
    if repeat.outcome == PASS:
        return Decision("retest", "retest", "transient",
                        f"{what}; it did not repeat in {repeat.compared_steps:,} steps of the same load (transient)")
    again = _fault_text(repeat, "again")
    if at_stock:
        return Decision("fail", "drain", "persistent at stock",
                        f"{what}; {again}, at stock: the card miscomputes at any setting")
    if stock is None or stock.outcome in (ERROR, STOPPED, NOT_RUN, INCOMPARABLE):
        why = ("not run after a hang, lost card or reset" if stock is None and repeat.outcome == HARD
               else "not run" if stock is None else stock.reason)
        return Decision("fail", "reset to stock", "persistent at this setting",
                        f"{what}; {again}; the stock run could not be made ({why}): reset to stock and screen again")
    if stock.outcome in (FAULT, HARD):
        return Decision("fail", "drain", "persistent at stock",
                        f"{what}; {again}; {_fault_text(stock, 'at stock too')}: the card miscomputes at any setting")
    return Decision("fail", "raise voltage", "persistent at this setting",
                    f"{what}; {again}; at stock {stock.compared_steps:,} steps matched: this setting is too deep "
                    f"({first.setting:+d} {unit})".rstrip())


def _fault_text(run: RunSummary, when: str = "") -> str:
    at = f" at step {run.step}" if run.step is not None else ""
    figure = f" ({run.figure})" if run.figure else ""
    head = f"{run.kind or 'fault'}{at}{figure}"
    return f"{head} {when}".strip() if when else f"{head}: {run.reason}"
