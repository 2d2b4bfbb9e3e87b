"""What every screen shares: the navigation bar, the key bar (every key, `q` included, wrapped not cut), a
repaint timer that stops while hidden, and the minimum terminal size.

Below the minimum (80x24, what the README promises works) a screen shows its nav bar (SIMULATED included) and one
line saying the terminal is too small, instead of a body cut in places nobody chose; its own keys do nothing until
the terminal is large enough again (the screen keys 1-6 and q still work)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual import events, getters, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.geometry import Size
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Static

from tuner.core.errors import TunerError
from tuner.screens.messages import FileWorkDone
from tuner.widgets.key_bar import KeyBar, footer_items
from tuner.widgets.nav_bar import NavBar

if TYPE_CHECKING:
    from tuner.app.tuner_app import TunerApp
    from tuner.core.models import Knob

MANY_CARD_ACTIONS = ("next_device", "next_table")
MIN_WIDTH, MIN_HEIGHT = 80, 24
REPAINT_INTERVAL_S = 0.5


def needs_cards(action: str, app: TunerApp) -> bool:
    """`d` (next card) and `c` (the next card's table) mean nothing with one card: not offered, and the keys do
    nothing."""
    return action in MANY_CARD_ACTIONS and len(app.devices) < 2


def too_small(size: Size) -> bool:
    return size.width < MIN_WIDTH or size.height < MIN_HEIGHT


class TunerScreen(Screen):
    """Subclasses set TITLE, compose their body in `compose_body` and draw app state in `repaint`."""

    if TYPE_CHECKING:  # the App these screens run in, for the type checker (textual's own idiom, tuner_app imports us)
        app = getters.app(TunerApp)

    TITLE = ""
    DEFAULT_CSS = """
    TunerScreen > #screen-body { height: 1fr; }
    TunerScreen > #too-small { display: none; height: auto; padding: 0 1; text-style: bold; }
    TunerScreen.-too-small > #screen-body, TunerScreen.-too-small > KeyBar { display: none; }
    TunerScreen.-too-small > #too-small { display: block; }
    """

    def compose(self) -> ComposeResult:
        yield NavBar(self.TITLE, simulated=self.app.simulated)
        yield Static(id="too-small")
        with Vertical(id="screen-body"):
            yield from self.compose_body()
        yield KeyBar(self.footer_bindings())

    def on_resize(self, event: events.Resize) -> None:
        """Below the minimum: the nav bar and one line, nothing focused (a hidden field must not take keys)."""
        size = event.size
        small = too_small(size)
        if small:  # one line at 60 columns
            self.query_one("#too-small", Static).update(
                f"terminal {size.width}x{size.height}: tuner needs {MIN_WIDTH}x{MIN_HEIGHT}; enlarge it (q quits)")
            if self.focused is not None:
                self._focus_before_small = self.focused
                self.set_focus(None)
        elif self.has_class("-too-small"):
            before = getattr(self, "_focus_before_small", None)
            if before is not None and before.is_attached:
                self.set_focus(before)
        self.set_class(small, "-too-small")
        self._place_notices(size)

    def _place_notices(self, size: Size) -> None:
        """Notices (Textual's toasts) sit just above the key bar: they never cover a key."""
        bar_lines = 0 if too_small(size) else len(self.query_one(KeyBar).lines(size.width))
        for rack in self.query("#textual-toastrack"):
            rack.styles.margin = (0, 0, bar_lines, 0)

    def footer_bindings(self) -> list[Binding]:
        """The keys this screen offers now (the key bar shows exactly these)."""
        return [b for b in type(self).BINDINGS if isinstance(b, Binding) and not needs_cards(b.action, self.app)
                and self.offers(b.action)]

    def offers(self, action: str) -> bool:
        """Whether the key bar offers `action` now (a screen hides a key whose action would only be refused, and
        says why on screen); the key itself still answers, with that reason."""
        return True

    def refresh_keys(self) -> None:
        """Lay the key bar out again after `offers` changed (the selection or a status read changed)."""
        bar = self.query_one(KeyBar)
        items = footer_items(self.footer_bindings())
        if items != bar.items:
            bar.items = items
            bar.refresh_items()
            self._place_notices(self.size)

    @work(thread=True, exit_on_error=False, group="screen-files")
    def _file_work(self, do: Callable[[], Message | None]) -> None:
        """A read or write of a file (the profile store, the form memory, a journal, the unsafe list, a report) off the
        UI thread (issue 21): the message `do` returns is handled back on it (None: nothing to say); a TunerError or
        OSError that stopped it is said (FileWorkDone)."""
        try:
            message = do()
        except (TunerError, OSError) as e:
            message = FileWorkDone(None, e)
        if message is not None:
            self.post_message(message)

    def _knob(self) -> Knob | None:
        """The selected card's knob as last read (None before the first read, or with no card)."""
        device_id = self.app.selected_device_id
        return self.app.histories[device_id].knob if device_id else None

    def action_next_device(self) -> None:
        """`d`: the next card (the repaint shows it; Tune's target then starts from that card's setting)."""
        self.app.select_device(1)
        self.repaint()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not needs_cards(action, self.app) and not self.has_class("-too-small")

    def compose_body(self) -> ComposeResult:
        yield from ()

    # Textual calls every class's handler, the subclass's first: a screen's own on_mount (on_resize, on_screen_resume)
    # adds to these and never calls them (a second call started a second timer, never paused while hidden)
    def on_mount(self) -> None:
        self._repaint_timer = self.set_interval(REPAINT_INTERVAL_S, self.repaint, name="repaint")
        self.call_after_refresh(self.repaint)

    def on_screen_suspend(self) -> None:
        self._repaint_timer.pause()

    def on_screen_resume(self) -> None:
        if hasattr(self, "_repaint_timer"):
            self._repaint_timer.resume()
            self.repaint()

    def repaint(self) -> None:
        """Read the App's state and update widgets (on a timer and when the App asks; never while hidden)."""
