"""Screen 4: profiles (placeholder until tuner.profiles lands)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Static

from tuner.screens.base import TunerScreen


class ProfilesScreen(TunerScreen):
    TITLE = "Profiles"

    def compose_body(self) -> ComposeResult:
        yield Static("profiles are not available yet in this build")
