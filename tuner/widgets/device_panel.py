"""One device on the dashboard: identity, setting vs stock, live figures, plots, and what runs on it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from tuner.app.state import DeviceHistory
from tuner.core.models import DeviceInfo, Knob, Telemetry
from tuner.widgets.history_plot import HistoryPlot


def setting_text(knob: Knob | None) -> str:
    """`-50 mV (stock 0 mV, MODIFIED)`: words, not colour, say whether the card is at stock."""
    if knob is None:
        return "setting: reading..."
    state = "STOCK" if knob.current == knob.stock else "MODIFIED"
    return f"setting {knob.current:+d} {knob.unit} (stock {knob.stock:+d}, {state})"


def _fmt(value: float | None, unit: str, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f} {unit}"


def figures_text(sample: Telemetry | None) -> str:
    if sample is None:
        return "no sample yet"
    return (
        f"power {_fmt(sample.power_w, 'W', 1)}  edge {_fmt(sample.temp_edge_c, '°C')}  "
        f"hotspot {_fmt(sample.temp_hotspot_c, '°C')}  mem {_fmt(sample.temp_mem_c, '°C')}\n"
        f"core {_fmt(sample.core_clock_mhz, 'MHz')}  mem {_fmt(sample.mem_clock_mhz, 'MHz')}  "
        f"vddgfx {_fmt(sample.voltage_mv, 'mV')}  util {_fmt(sample.util_pct, '%')}"
    )


class DevicePanel(Vertical):
    DEFAULT_CSS = """
    DevicePanel { height: 1fr; min-height: 12; border: round $primary; padding: 0 1; }
    DevicePanel .figures { height: 2; }
    DevicePanel Horizontal { height: 1fr; }
    """

    def __init__(self, device: DeviceInfo) -> None:
        super().__init__(id=f"panel-{device.id}")
        self.device = device
        self.border_title = Text(f"{device.id} · {device.vendor} · {device.label}")
        self._painted_version = -1

    def compose(self) -> ComposeResult:
        yield Static(id="setting")
        yield Static(classes="figures", id="figures")
        with Horizontal():
            yield HistoryPlot("power W", id="plot-power")
            yield HistoryPlot("edge °C", id="plot-temp")

    def paint(self, history: DeviceHistory, running: str) -> None:
        line = Text(setting_text(history.knob))
        line.append(" · ")
        line.append(running, style="bold" if running != "idle" else "")
        self.query_one("#setting", Static).update(line)
        self.border_subtitle = running
        if history.version == self._painted_version:
            return
        self._painted_version = history.version
        self.query_one("#figures", Static).update(figures_text(history.latest))
        self.query_one("#plot-power", HistoryPlot).show(*history.points("power_w"))
        self.query_one("#plot-temp", HistoryPlot).show(*history.points("temp_edge_c"))
