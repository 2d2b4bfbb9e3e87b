"""The tolerance mode: where bits cannot match (another GPU model, driver or torch), a paired comparison of held-out
losses. The run trains the reference's steps on the same batches in the same order from the same initial weights,
then scores the same fixed held-out windows; the per-window differences (this card minus the reference) give a
mean and a 95 % confidence interval (Student's t over the windows). Labelled: the verdict's `mode` is
`tolerance` and its sensitivity reduced (bench/engine_detection.py, Part E, measures what it misses).

Decision (an equivalence test): pass when the whole interval lies within +/- `margin_nats`; fail when the whole
interval lies outside it (the losses differ by more than the margin); otherwise retest (the windows could not tell).
Pure.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# The healthy spread between two platforms could not be measured here (one CPU; other thread counts gave the same
# bits): 0.02 nats is ~30x the published cross-platform difference of a trained 325M model (-0.0001 +/- 0.0007),
# room for short runs of small models. Calibrate it per pair of platforms with --margin (docs/screen.md).
DEFAULT_MARGIN_NATS = 0.02

# Student's t, two-sided 95 % (0.975 quantile), by degrees of freedom; beyond the table the normal's 1.96 + a
# small-sample term (Cornish-Fisher, first order) is within 0.001 of the exact value.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042}


def t975(df: int) -> float:
    """Student's t 0.975 quantile for `df` degrees of freedom.

    >>> t975(7), round(t975(1000), 3)
    (2.365, 1.962)
    """
    if df < 1:
        raise ValueError("at least two windows")
    if df in _T975:
        return _T975[df]
    if df < 30:
        lo = max(k for k in _T975 if k < df)
        hi = min(k for k in _T975 if k > df)
        return _T975[lo] + (_T975[hi] - _T975[lo]) * (df - lo) / (hi - lo)
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df)


@dataclass(frozen=True)
class PairedComparison:
    windows: int
    mean_nats: float
    low_nats: float
    high_nats: float
    margin_nats: float
    nonfinite: int = 0  # windows whose loss difference is not a number (NaN or infinite): a fail, no interval

    @property
    def verdict(self) -> str:
        if -self.margin_nats <= self.low_nats and self.high_nats <= self.margin_nats:
            return "pass"
        if self.low_nats > self.margin_nats or self.high_nats < -self.margin_nats:
            return "fail"
        return "retest"

    def text(self) -> str:
        if self.nonfinite:
            return (f"held-out losses not finite here in {self.nonfinite} of {self.windows} windows (margin "
                    f"± {self.margin_nats:g})")
        half = (self.high_nats - self.low_nats) / 2
        return (f"held-out loss difference {self.mean_nats:+.4f} ± {half:.4f} nats (95 %, {self.windows} windows; "
                f"margin ± {self.margin_nats:g})")


def paired(reference: list[float] | tuple[float, ...], here: list[float] | tuple[float, ...],
           margin_nats: float = DEFAULT_MARGIN_NATS) -> PairedComparison:
    """The paired comparison of two runs' held-out losses, window by window.

    >>> c = paired([1.0, 2.0, 3.0], [1.001, 2.0, 2.999]); c.verdict, round(c.mean_nats, 6)
    ('pass', 0.0)
    >>> paired([1.0, 2.0, 3.0], [1.5, 2.6, 3.5]).verdict
    'fail'
    """
    if len(reference) != len(here) or len(here) < 2:
        raise ValueError(f"{len(here)} windows against {len(reference)}: the same windows, at least two")
    diffs = [b - a for a, b in zip(reference, here, strict=True)]
    if not all(math.isfinite(d) for d in diffs):
        return PairedComparison(len(diffs), math.inf, math.inf, math.inf, margin_nats,
                                nonfinite=sum(not math.isfinite(d) for d in diffs))
    mean = statistics.fmean(diffs)
    half = t975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return PairedComparison(len(diffs), mean, mean - half, mean + half, margin_nats)
