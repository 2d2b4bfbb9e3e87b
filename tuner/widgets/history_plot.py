"""A plotext line plot of one figure against seconds (numeric x axis, newest sample at 0), or of several labelled
series against a shared x axis (tok/J and W against the setting).

Every axis has round ticks (1, 2 or 5 times a power of ten), whole numbers where the quantity is whole (steps,
settings in mV or MHz, seconds); several series are told apart by their marker (`•`, `x`, `+`, also in the legend),
not by colour alone, so the plot reads the same under NO_COLOR; an empty plot says so in words.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from textual_plotext import PlotextPlot

TICKS = 4  # y ticks on a plot a few rows high
SECONDS_WINDOW = 60.0  # the least span of a plot against seconds before now
MARKERS = ("•", "x", "+")  # one per series, in order; the legend shows each series' marker with its label
EMPTY_TEXT = "no data yet"


def nice_step(span: float, ticks: int = TICKS, *, integer: bool = False) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) that gives about `ticks` ticks over `span`; at least 1
    when the axis is `integer` (a step number or a setting has no 0.5)."""
    raw = max(span, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return max(1, round(step)) if integer else step


def nice_axis(values: list[float], min_span: float, *, integer: bool = False) -> tuple[float, float, list[float]]:
    """(low, high, ticks) covering `values` with at least `min_span` (a flat 15.0 W line is not drawn as noise
    filling the plot) and round tick values (whole ones for an `integer` axis)."""
    lo, hi = min(values), max(values)
    if hi - lo < min_span:
        mid = (lo + hi) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
    step = nice_step(hi - lo, integer=integer)
    lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
    n = round((hi - lo) / step)
    return lo, hi, [round(lo + i * step, 10) for i in range(n + 1)]


def least_span(values: list[float], min_span: float | None) -> float:
    """The span a flat line is drawn over when the caller gave none: a tenth of its size (a loss of 3.2: 0.32),
    else 1."""
    if min_span is not None:
        return min_span
    size = max(abs(v) for v in values)
    return size / 10 if size else 1.0


def finite_points(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """The points whose x and y are finite numbers (a NaN loss cannot be placed on an axis)."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=False) if math.isfinite(x) and math.isfinite(y)]
    return [x for x, _ in pairs], [y for _, y in pairs]


def is_whole(values: list[float]) -> bool:
    return all(float(v).is_integer() for v in values)


def tick_label(value: float) -> str:
    """`-40`, `0.5`, `12000`: no `.0` on a whole tick, no exponent on a large one."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


class HistoryPlot(PlotextPlot):
    DEFAULT_CSS = """
    HistoryPlot { height: 1fr; min-height: 6; }
    """

    def __init__(self, title: str, *, x_label: str = "s", id: str | None = None, min_span: float | None = None) -> None:
        super().__init__(id=id)
        self.title, self.x_label, self.min_span = title, x_label, min_span
        self._drawn: object = None

    def on_mount(self) -> None:
        super().on_mount()
        self.show([], [])

    def _begin(self, key: object, title: str | None) -> bool:
        """Start a redraw of `key` (False: it is what is drawn already): a blank figure with its title and x label."""
        if key == self._drawn:
            return False
        self._drawn = key
        self.plt.clear_data()
        self.plt.clear_figure()
        self.plt.title(title or self.title)
        self.plt.xlabel(self.x_label)
        return True

    def _empty(self) -> None:
        """No points: the axes without ticks and the words, in the middle (not a frame that looks broken)."""
        plt = self.plt
        plt.xlim(0, 1)
        plt.ylim(0, 1)
        plt.xticks([])
        plt.yticks([])
        plt.text(EMPTY_TEXT, 0.5, 0.5, alignment="center")

    def _x_axis(self, xs: list[float]) -> None:
        if self.x_label == "s":  # seconds before now: -100, -50, 0
            lo, _hi, ticks = nice_axis([*xs, 0.0], SECONDS_WINDOW, integer=True)
            ticks = [t for t in ticks if t <= 0]
            self.plt.xlim(lo, 0)
        else:  # a step number or a setting: whole ticks when the values are whole
            whole = is_whole(xs)
            lo, hi, ticks = nice_axis(xs, 1.0 if whole else least_span(xs, None), integer=whole)
            self.plt.xlim(lo, hi)
        self.plt.xticks(ticks, [tick_label(t) for t in ticks])

    def _y_axis(self, ys: list[float], side: str = "left") -> None:
        lo, hi, ticks = nice_axis(ys, least_span(ys, self.min_span), integer=is_whole(ys))
        self.plt.ylim(lo, hi, yside=side)  # type: ignore[arg-type]  # plotext's stub says a number; it takes left/right
        self.plt.yticks(ticks, [tick_label(t) for t in ticks], yside=side)  # type: ignore[arg-type]  # as ylim

    def show(self, xs: Sequence[float], ys: Sequence[float], *, title: str | None = None) -> None:
        """Redraw with these points; a no-op when nothing changed (the caller's timer sets the rate). A point that
        is not a finite number (a NaN loss) is not drawn: the detectors and the log say what it was."""
        if not self._begin((tuple(xs), tuple(ys), title), title):
            return
        xs, ys = finite_points(xs, ys)
        if xs:
            self.plt.plot(xs, ys, marker="braille")
            self._x_axis(xs)
            self._y_axis(ys)
        else:
            self._empty()
        self.refresh()

    def show_series(self, series: list[tuple[str, list, list, str]], *, title: str | None = None) -> None:
        """Several labelled series (label, xs, ys, "left" | "right" y axis) on one plot: tok/J and power against
        the setting share the x axis, each on its own scale and with its own marker."""
        if not self._begin((tuple((label, tuple(xs), tuple(ys), side) for label, xs, ys, side in series), title),
                           title):
            return
        plt = self.plt
        all_xs = [x for _label, xs, ys, _side in series for x in finite_points(xs, ys)[0]]
        for (label, all_x, all_y, side), marker in zip(series, itertools.cycle(MARKERS)):
            xs, ys = finite_points(all_x, all_y)
            if xs:  # plotext's legend draws each series' marker before its label
                plt.plot(xs, ys, marker=marker, label=label, yside=side)
                self._y_axis(ys, side)
        if all_xs:
            self._x_axis(all_xs)
        else:
            self._empty()
        self.refresh()
