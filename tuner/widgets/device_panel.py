"""One device on the dashboard: identity, setting vs stock, live figures, plots, and what runs on it."""

from __future__ import annotations

import re

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from tuner.app.state import DeviceHistory
from tuner.core.models import DeviceInfo, Knob, Telemetry
from tuner.core.telemetry_text import fan_text, fmt, limits_text, vram_text
from tuner.widgets.history_plot import HistoryPlot


def setting_text(knob: Knob | None) -> str:
    """`-50 mV (stock 0 mV, MODIFIED)`: words, not colour, say whether the card is at stock."""
    if knob is None:
        return "setting: reading..."
    state = "STOCK" if knob.current == knob.stock else "MODIFIED"
    return f"setting {knob.current:+d} {knob.unit} (stock {knob.stock:+d} {knob.unit}, {state})"


def figures_text(sample: Telemetry | None) -> str:
    if sample is None:
        return "no sample yet"
    power = fmt(sample.power_w, "W", 1) + (f" of {sample.power_limit_w:.0f} W" if sample.power_limit_w else "")
    limits = limits_text(sample.throttle_reasons)
    return (
        f"power {power}  edge {fmt(sample.temp_edge_c, '°C')}  "
        f"hotspot {fmt(sample.temp_hotspot_c, '°C')}  mem {fmt(sample.temp_mem_c, '°C')}\n"
        f"core {fmt(sample.core_clock_mhz, 'MHz')}  mem {fmt(sample.mem_clock_mhz, 'MHz')}  "
        f"vddgfx {fmt(sample.voltage_mv, 'mV')}  util {fmt(sample.util_pct, '%')}\n"
        f"fan {fan_text(sample)}  VRAM {vram_text(sample)}  limits: {limits}"
    )


class DevicePanel(Vertical):
    DEFAULT_CSS = """
    DevicePanel { height: 1fr; min-height: 12; border: round $primary; padding: 0 1; }
    DevicePanel .figures { height: 3; }
    DevicePanel Horizontal { height: 1fr; }
    """

    def __init__(self, device: DeviceInfo) -> None:
        # a real card's id is its PCI slot (0000:03:00.0): ':' and '.' are not allowed in a widget id
        super().__init__(id="panel-" + re.sub(r"[^A-Za-z0-9_-]", "-", device.id))
        self.device = device
        self.border_title = Text(f"{device.id} · {device.vendor} · {device.label}")
        self._painted_version = -1

    def compose(self) -> ComposeResult:
        yield Static(id="setting")
        yield Static(classes="figures", id="figures")
        with Horizontal():
            yield HistoryPlot("power W", id="plot-power", min_span=20.0)
            yield HistoryPlot("edge °C", id="plot-temp", min_span=10.0)

    def paint(self, history: DeviceHistory, running: str, running_short: str) -> None:
        """`running` in full on the border; `running_short` on the setting line, so it fits 80 columns."""
        line = Text(setting_text(history.knob))
        line.append(" · ")
        line.append(running_short, style="bold" if running_short != "idle" else "")
        self.query_one("#setting", Static).update(line)
        self.border_subtitle = running
        if history.version == self._painted_version:
            return
        self._painted_version = history.version
        self.query_one("#figures", Static).update(figures_text(history.latest))
        self.query_one("#plot-power", HistoryPlot).show(*history.points("power_w"))
        self.query_one("#plot-temp", HistoryPlot).show(*history.points("temp_edge_c"))
