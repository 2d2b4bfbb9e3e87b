"""The Textual UI (placeholder until the TUI issue lands). Imported only when `tuner` runs without a command."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Footer, Header, Static

from tuner import exit_codes


class TunerApp(App):
    BINDINGS = [("q", "quit", "Quit")]

    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx

    def compose(self) -> ComposeResult:
        yield Header()
        lines = [f"{d.id}  {d.label}" for d in self.ctx.backend.devices()]
        yield Static("\n".join(lines))
        yield Footer()


def run_app(ctx) -> int:
    TunerApp(ctx).run()
    return exit_codes.OK
