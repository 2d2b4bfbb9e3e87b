"""Screen 1: every device at a glance. One card: its full panel. Two or more: one compact row per card (setting,
power, temperature, what runs on it), then the selected card's full panel and plots (d selects the next card)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll

from tuner.app.state import running_label
from tuner.screens.base import TunerScreen
from tuner.widgets.card_rows import CardRows, card_row
from tuner.widgets.device_panel import DevicePanel


class DashboardScreen(TunerScreen):
    TITLE = "Dashboard"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "next_device", "Next card", id="dashboard.device"),
    ]

    def compose_body(self) -> ComposeResult:
        devices = self.app.devices
        if len(devices) > 1:
            yield CardRows(id="card-rows")
        with VerticalScroll():
            for device in devices:
                yield DevicePanel(device)

    def repaint(self) -> None:
        app = self.app
        many = len(app.devices) > 1
        if many:
            self.query_one("#card-rows", CardRows).paint([
                card_row(d, app.histories[d.id].knob, app.histories[d.id].latest,
                         running_label(app.stress, app.bisect, d.id, compact=True),
                         selected=d.id == app.selected_device_id)
                for d in app.devices])
        for panel in self.query(DevicePanel):
            device_id = panel.device.id
            panel.display = not many or device_id == app.selected_device_id
            if panel.display:
                panel.paint(app.histories[device_id], running_label(app.stress, app.bisect, device_id),
                            running_label(app.stress, app.bisect, device_id, compact=True))
