"""The dashboard's one row per card (a machine with 2+ cards): id, SIMULATED, setting with its unit and state,
power, temperature and what runs on it, all in words so nothing depends on colour; `▶` marks the card whose full
panel is shown below."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tuner.core.models import DeviceInfo, Knob, Telemetry

ROW_WIDTH = 78  # fits 80 columns with the widget's padding


def card_row(device: DeviceInfo, knob: Knob | None, sample: Telemetry | None, running: str, *, selected: bool) -> Text:
    """`▶ sim0 SIMULATED  -30 mV APPLIED   212 W  61 °C  BISECT trial 3 at -20 mV`"""
    power = "n/a W" if sample is None or sample.power_w is None else f"{sample.power_w:.0f} W"
    temp = "n/a °C" if sample is None or sample.temp_edge_c is None else f"{sample.temp_edge_c:.0f} °C"
    setting = "reading..." if knob is None else (
        f"{knob.current:+d} {knob.unit} {'STOCK' if knob.current == knob.stock else 'APPLIED'}")
    row = Text("▶ " if selected else "  ", style="bold" if selected else "")
    row.append(f"{device.id:<6}", style="bold" if selected else "")
    row.append(" SIMULATED" if device.simulated else "", style="reverse" if device.simulated else "")
    row.append(f"  {setting:<16} {power:>6} {temp:>7}  ")
    left = ROW_WIDTH - len(row.plain)
    job = running if len(running) <= left else running[: max(0, left - 1)] + "…"
    row.append(job, style="bold" if running != "idle" else "")
    return row


class CardRows(Static):
    DEFAULT_CSS = """
    CardRows { height: auto; padding: 0 1; }
    """

    def paint(self, rows: list[Text]) -> None:
        self.update(Text("\n").join(rows))
