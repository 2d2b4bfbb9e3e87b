"""Issue 24: charts with whole-number axes where the quantity is whole (steps, settings), series told apart
without colour (NO_COLOR), and words on an empty chart."""

from __future__ import annotations

import re

import pytest
from textual.app import App

from tests.tui.helpers import screen_text, until
from tuner.app.state import StressState
from tuner.widgets.history_plot import HistoryPlot, nice_axis


class OnePlot(App):
    def __init__(self, plot: HistoryPlot) -> None:
        super().__init__()
        self.plot = plot

    def compose(self):
        yield self.plot


def _tick_line(text: str) -> str:
    """The x axis' tick labels: the line under the plot's bottom border."""
    lines = text.splitlines()
    bottom = next(i for i, line in enumerate(lines) if "└" in line)
    return lines[bottom + 1]


def test_a_whole_axis_has_whole_ticks():
    assert nice_axis([311, 385], 1.0, integer=True)[2] == [300, 320, 340, 360, 380, 400]
    assert nice_axis([-50, -45], 1.0, integer=True)[2] == [-50, -48, -46, -44]
    assert nice_axis([3, 3], 1.0, integer=True)[2] == [2, 3, 4]  # never a 0.5 step


async def test_the_tune_screens_step_axis_has_whole_ticks(app):
    """The stress plots' x axis is the step number: `311.0 385.8` was what plotext chose by itself."""
    steps = tuple((step, 3.0 - step / 1000, 9000.0 + step % 7) for step in range(311, 386))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        app.stress = StressState(device_id="sim0", steps=steps)
        plot = app.screen.query_one("#plot-loss", HistoryPlot)
        await until(pilot, lambda: plot._drawn is not None and len(plot._drawn[0]) == len(steps))
        await pilot.pause()  # the frame with those points
        labels = _tick_line(screen_text(app)).split()
        assert labels and all(re.fullmatch(r"-?\d+", label) for label in labels), labels


async def test_an_empty_chart_says_so(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")  # no stress run yet: the loss and tok/s plots are empty
        await until(pilot, lambda: screen_text(app).count("no data yet") == 2)


@pytest.mark.parametrize("no_color", [False, True], ids=["colour", "NO_COLOR"])
async def test_two_series_are_told_apart_by_their_marker_not_their_colour(monkeypatch, no_color):
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    plot = HistoryPlot("tok/J and W vs setting", x_label="setting")
    app = OnePlot(plot)
    async with app.run_test(size=(60, 16)) as pilot:
        settings = [-50, -40, -30, -20, -10, 0]
        plot.show_series([("tok/J", settings, [25.0, 24.5, 24.0, 23.6, 23.2, 23.0], "left"),
                          ("W", settings, [200.0, 210.0, 220.0, 230.0, 240.0, 250.0], "right")])
        await until(pilot, lambda: "tok/J" in screen_text(app) and " W" in screen_text(app))
        text = screen_text(app)
        assert app.no_color is no_color
        legend = [line for line in text.splitlines() if "tok/J" in line or re.search(r" W\b", line)]
        assert any("•• tok/J" in line for line in legend) and any("xx W" in line for line in legend), text
        body = text.split("xx W", 1)[1]
        assert "•" in body and "x" in body  # both lines are drawn, each with its own marker
        assert all(re.fullmatch(r"-?\d+", label) for label in _tick_line(text).split())  # settings: whole mV
