"""The top line of every screen: where you are, how to go elsewhere, and a SIMULATED badge when it applies.

The badge is never dropped: when the line is too narrow the screen names shrink first (full, then four letters,
then the keys alone), and at the very least the badge and the current screen are shown."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tuner.app.words import SCREENS_IN_ORDER, short_title

SCREENS = tuple((key, short_title(title)) for key, _mode, title in SCREENS_IN_ORDER)
BADGE = " SIMULATED "
# how the screens other than the current one are named, from the widest to the narrowest
STYLES = ("full", "short", "keys")


class NavBar(Static):
    DEFAULT_CSS = """
    NavBar { height: 1; background: $panel; color: $text; }
    """

    def __init__(self, current: str, *, simulated: bool) -> None:
        super().__init__()
        self.current, self.simulated = current, simulated

    def on_mount(self) -> None:
        self.update(self.build(self.size.width or 80))

    def on_resize(self) -> None:
        self.update(self.build(self.size.width))

    def build(self, width: int) -> Text:
        """The widest form that fits `width`, badge included; the narrowest puts the badge first so a cut never
        takes it."""
        for style in STYLES:
            line = self._with_badge(self._screens(style), width)
            if len(line.plain) <= width:
                return line
        line = Text()
        if self.simulated:
            line.append(BADGE, style="bold reverse")
        key = next((key for key, title in SCREENS if title == self.current), "?")
        line.append(f" [{key} {self.current}]", style="reverse bold")
        return line

    def _screens(self, style: str) -> Text:
        """Full names when they fit (they do at 80 columns, badge included), else the first four letters, else the
        keys alone; the current screen always by its full name, in brackets (not by colour alone)."""
        text = Text(" tuner ", style="bold")
        for key, title in SCREENS:
            if title == self.current:
                text.append(f"[{key} {title}]", style="reverse bold")
            elif style == "keys":
                text.append(f" {key} ")
            else:
                text.append(f" {key} {title[:4] if style == 'short' else title} ")
        return text

    def _with_badge(self, text: Text, width: int) -> Text:
        if self.simulated:
            pad = max(1, width - len(text.plain) - len(BADGE))
            text.append(" " * pad)
            text.append(BADGE, style="bold reverse")
        return text
