"""The top line of every screen: where you are, how to go elsewhere, and a SIMULATED badge when it applies."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

SCREENS = (("1", "Dashboard"), ("2", "Tune"), ("3", "Bisect"), ("4", "Profiles"), ("5", "Doctor"), ("6", "Help"))


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
        full = self._build(width, short=False)
        return full if len(full.plain.rstrip()) <= width else self._build(width, short=True)

    def _build(self, width: int, *, short: bool) -> Text:
        """Full names when they fit (they do at 80 columns, badge included), else the first four letters."""
        text = Text(" tuner ", style="bold")
        for key, title in SCREENS:
            label = title[:4] if short and title != self.current else title
            if title == self.current:
                text.append(f"[{key} {label}]", style="reverse bold")  # brackets: not by colour alone
            else:
                text.append(f" {key} {label} ")
        if self.simulated:
            badge = " SIMULATED "
            pad = max(1, width - len(text.plain) - len(badge))
            text.append(" " * pad)
            text.append(badge, style="bold reverse")
        return text
