"""The footer: every key of the current screen, then `q quit` and `^p palette`, wrapped onto a second line
rather than cut. Textual's Footer drops keys past the right edge at 80 columns (`q` first), so this one lays out
whole items and never splits one.

The screen keys are the nav bar's (1-6), so they are not repeated here.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.binding import Binding
from textual.widgets import Static

KEY_NAMES = {"left": "←", "right": "→", "up": "↑", "down": "↓", "pageup": "PgUp", "pagedown": "PgDn",
             "delete": "Del", "escape": "Esc", "enter": "Enter", "ctrl+p": "^p", "ctrl+q": "^q"}
ALWAYS = (("q", "Quit"), ("^p", "Palette"))
SEPARATOR = "  "


def footer_items(bindings: Iterable[Binding]) -> list[tuple[str, str]]:
    """(key, label) for each shown binding, the way a user reads them, then the keys every screen has."""
    items = [(b.key_display or KEY_NAMES.get(b.key, b.key), b.description) for b in bindings
             if isinstance(b, Binding) and b.show and b.description]
    return [*items, *ALWAYS]


def layout(items: list[tuple[str, str]], width: int) -> list[Text]:
    """Whole items per line, as many lines as needed (two at 80 columns for the busiest screen)."""
    lines: list[Text] = [Text(" ")]
    for key, label in items:
        piece_len = len(key) + 1 + len(label)
        line = lines[-1]
        if len(line.plain) > 1 and len(line.plain) + len(SEPARATOR) + piece_len > width:
            line = Text(" ")
            lines.append(line)
        elif len(line.plain) > 1:
            line.append(SEPARATOR)
        line.append(key, style="bold reverse")
        line.append(f" {label}")
    return lines


class KeyBar(Static):
    DEFAULT_CSS = """
    KeyBar { dock: bottom; height: auto; max-height: 3; background: $panel; color: $text; }
    """

    def __init__(self, bindings: Iterable[Binding]) -> None:
        super().__init__(id="key-bar")
        self.items = footer_items(bindings)

    def on_resize(self) -> None:
        self._draw(self.size.width)

    def refresh_items(self) -> None:
        """Draw `items` again (the screen changed what it offers)."""
        self._draw(self.size.width or self.app.size.width)

    on_mount = refresh_items

    def lines(self, width: int) -> list[Text]:
        """The key bar's lines at `width` columns (the screen keeps its notices above them)."""
        return layout(self.items, max(20, width))

    def _draw(self, width: int) -> None:
        self.update(Text("\n").join(self.lines(width)))

    @property
    def plain(self) -> str:
        return "\n".join(line.plain for line in self.lines(self.size.width or 80))
