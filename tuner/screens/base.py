"""What every screen shares: the navigation bar, the key bar (every key, `q` included, wrapped not cut), and a
repaint timer that stops while hidden."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import Screen

from tuner.widgets.key_bar import KeyBar
from tuner.widgets.nav_bar import NavBar


class TunerScreen(Screen):
    """Subclasses set TITLE, compose their body in `compose_body` and draw app state in `repaint`."""

    TITLE = ""

    def compose(self) -> ComposeResult:
        yield NavBar(self.TITLE, simulated=self.app.simulated)
        yield from self.compose_body()
        yield KeyBar(type(self).BINDINGS)

    def compose_body(self) -> ComposeResult:
        yield from ()

    def on_mount(self) -> None:
        self._repaint_timer = self.set_interval(self.app.repaint_interval_s, self.repaint, name="repaint")
        self.call_after_refresh(self.repaint)

    def on_screen_suspend(self) -> None:
        self._repaint_timer.pause()

    def on_screen_resume(self) -> None:
        if hasattr(self, "_repaint_timer"):
            self._repaint_timer.resume()
            self.repaint()

    def repaint(self) -> None:
        """Read the App's state and update widgets (called at most 4 times a second, never while hidden)."""
