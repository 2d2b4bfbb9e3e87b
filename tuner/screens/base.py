"""What every screen shares: the navigation bar, the key bar (every key, `q` included, wrapped not cut), and a
repaint timer that stops while hidden."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen

from tuner.widgets.key_bar import KeyBar
from tuner.widgets.nav_bar import NavBar

MANY_CARD_ACTIONS = ("next_device", "next_table")


class TunerScreen(Screen):
    """Subclasses set TITLE, compose their body in `compose_body` and draw app state in `repaint`."""

    TITLE = ""

    def compose(self) -> ComposeResult:
        yield NavBar(self.TITLE, simulated=self.app.simulated)
        yield from self.compose_body()
        yield KeyBar(self.footer_bindings())

    def footer_bindings(self) -> list[Binding]:
        """The keys this screen offers in this session (the key bar shows exactly these)."""
        return [b for b in type(self).BINDINGS if isinstance(b, Binding) and not self._needs_cards(b.action)]

    def _needs_cards(self, action: str) -> bool:
        """`d` (next card) and `c` (the next card's table) mean nothing with one card: not shown, and the keys do
        nothing."""
        return action in MANY_CARD_ACTIONS and len(self.app.devices) < 2

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not self._needs_cards(action)

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
