"""Screen 3: auto-bisect (placeholder until tuner.bisect_job lands)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Static

from tuner.screens.base import TunerScreen


class BisectScreen(TunerScreen):
    TITLE = "Bisect"

    def compose_body(self) -> ComposeResult:
        yield Static("auto-bisect is not available yet in this build")
