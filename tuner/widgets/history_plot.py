"""A plotext line plot of one figure against seconds (numeric x axis, newest sample at 0)."""

from __future__ import annotations

from textual_plotext import PlotextPlot


class HistoryPlot(PlotextPlot):
    DEFAULT_CSS = """
    HistoryPlot { height: 1fr; min-height: 6; }
    """

    def __init__(self, title: str, *, x_label: str = "s", id: str | None = None) -> None:
        super().__init__(id=id)
        self.title, self.x_label = title, x_label
        self._drawn: tuple | None = None

    def on_mount(self) -> None:
        super().on_mount()
        self.show([], [])

    def show(self, xs: list[float], ys: list[float], *, title: str | None = None) -> None:
        """Redraw with these points; a no-op when nothing changed (the caller's timer sets the rate)."""
        key = (tuple(xs), tuple(ys), title)
        if key == self._drawn:
            return
        self._drawn = key
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title or self.title)
        plt.xlabel(self.x_label)
        if xs:
            plt.plot(xs, ys, marker="braille")
        else:
            plt.xlim(-60, 0)
        self.refresh()

    def show_series(self, series: list[tuple[str, list, list, str]], *, title: str | None = None) -> None:
        """Several labelled series (label, xs, ys, "left" | "right" y axis) on one plot: tok/J and power against
        the setting share the x axis, each on its own scale."""
        key = tuple((label, tuple(xs), tuple(ys), side) for label, xs, ys, side in series), title
        if key == self._drawn:
            return
        self._drawn = key
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title or self.title)
        plt.xlabel(self.x_label)
        drawn = False
        for label, xs, ys, side in series:
            if xs:
                plt.plot(xs, ys, marker="braille", label=label, yside=side)
                drawn = True
        if not drawn:
            plt.xlim(-60, 0)
        self.refresh()
