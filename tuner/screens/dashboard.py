"""Screen 1: every device at a glance."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll

from tuner.app.state import running_label
from tuner.screens.base import TunerScreen
from tuner.widgets.device_panel import DevicePanel


class DashboardScreen(TunerScreen):
    TITLE = "Dashboard"

    def compose_body(self) -> ComposeResult:
        with VerticalScroll():
            for device in self.app.devices:
                yield DevicePanel(device)

    def repaint(self) -> None:
        app = self.app
        for panel in self.query(DevicePanel):
            device_id = panel.device.id
            panel.paint(app.histories[device_id], running_label(app.stress, app.bisect, device_id))
