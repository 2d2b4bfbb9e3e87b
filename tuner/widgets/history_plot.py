"""A plotext line plot of one figure against seconds (numeric x axis, newest sample at 0)."""

from __future__ import annotations

import math

from textual_plotext import PlotextPlot

TICKS = 4  # y ticks on a plot a few rows high


def nice_step(span: float, ticks: int = TICKS) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) that gives about `ticks` ticks over `span`."""
    raw = max(span, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def nice_axis(values: list[float], min_span: float) -> tuple[float, float, list[float]]:
    """(low, high, ticks) covering `values` with at least `min_span` (a flat 15.0 W line is not drawn as noise
    filling the plot) and round tick values."""
    lo, hi = min(values), max(values)
    if hi - lo < min_span:
        mid = (lo + hi) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
    step = nice_step(hi - lo)
    lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
    n = round((hi - lo) / step)
    return lo, hi, [round(lo + i * step, 10) for i in range(n + 1)]


class HistoryPlot(PlotextPlot):
    DEFAULT_CSS = """
    HistoryPlot { height: 1fr; min-height: 6; }
    """

    def __init__(self, title: str, *, x_label: str = "s", id: str | None = None, min_span: float | None = None) -> None:
        super().__init__(id=id)
        self.title, self.x_label, self.min_span = title, x_label, min_span
        self._drawn: tuple | None = None

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

    def show(self, xs: list[float], ys: list[float], *, title: str | None = None) -> None:
        """Redraw with these points; a no-op when nothing changed (the caller's timer sets the rate)."""
        if not self._begin((tuple(xs), tuple(ys), title), title):
            return
        plt = self.plt
        if xs:
            plt.plot(xs, ys, marker="braille")
            if self.min_span is not None:
                lo, hi, ticks = nice_axis(ys, self.min_span)
                plt.ylim(lo, hi)
                plt.yticks(ticks, [f"{t:g}" for t in ticks])
                x_lo, _hi, x_ticks = nice_axis([*xs, 0.0], 60.0)  # seconds before now: -100, -50, 0
                x_ticks = [t for t in x_ticks if t <= 0]
                plt.xlim(x_lo, 0)
                plt.xticks(x_ticks, [f"{t:g}" for t in x_ticks])
        else:
            plt.xlim(-60, 0)
        self.refresh()

    def show_series(self, series: list[tuple[str, list, list, str]], *, title: str | None = None) -> None:
        """Several labelled series (label, xs, ys, "left" | "right" y axis) on one plot: tok/J and power against
        the setting share the x axis, each on its own scale."""
        if not self._begin((tuple((label, tuple(xs), tuple(ys), side) for label, xs, ys, side in series), title),
                           title):
            return
        plt = self.plt
        drawn = False
        for label, xs, ys, side in series:
            if xs:
                plt.plot(xs, ys, marker="braille", label=label, yside=side)
                drawn = True
        if not drawn:
            plt.xlim(-60, 0)
        self.refresh()
