"""The command palette (ctrl+p): every screen and every action of every screen, by name, from any screen, each
with its key (`Tune: Apply (a)`), as Help promises. Choosing an action of another screen goes there first, then
runs it as its key would (the same `check_action`: a key a screen does not offer now, the palette does not run).

`d` (next card) and `c` (a card's table) are listed only with two or more cards, as the key bar offers them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

from rich.text import Text
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider

from tuner.app.tuner_app import TunerApp, screen_class
from tuner.app.words import SCREENS_IN_ORDER
from tuner.screens.base import needs_cards
from tuner.widgets.key_bar import KEY_NAMES


@dataclass(frozen=True)
class PaletteEntry:
    title: str  # "Tune: Apply (a)": where, what, and the key that does it
    help: str
    run: Callable[[], object]


def screen_entries(app: TunerApp, mode: str, key: str, title: str, current_mode: str | None) -> Iterator[PaletteEntry]:
    """`mode`'s actions, each by its first key."""
    seen: set[str] = set()
    for binding in vars(screen_class(mode)).get("BINDINGS", []):  # the screen's own, not Textual's tab keys
        # a binding with an id is a public (remappable) action; one without is an alias (x for Del) or a key
        # of a form's own (Esc leaves it)
        if not isinstance(binding, Binding) or not binding.id or binding.action in seen:
            continue
        seen.add(binding.action)
        if needs_cards(binding.action, app):
            continue
        name = binding.tooltip or binding.description  # the tooltip is the longer name (-1 step, +1 step)
        press = KEY_NAMES.get(binding.key, binding.key)
        where = "on this screen" if mode == current_mode else f"on the {title} screen ({key}, then {press})"
        yield PaletteEntry(f"{title}: {name} ({press})", f"key {press} {where}",
                           partial(app.run_on_screen, mode, binding.action))


def entries(app: TunerApp, current_mode: str | None) -> Iterator[PaletteEntry]:
    """This screen's actions first, then the screens, every other screen's actions, and Quit."""
    for key, mode, title in SCREENS_IN_ORDER:
        if mode == current_mode:
            yield from screen_entries(app, mode, key, title, current_mode)
    for key, mode, title in SCREENS_IN_ORDER:
        yield PaletteEntry(f"Screen: {title} ({key})", f"key {key} goes to the {title} screen",
                           partial(app.run_on_screen, None, f"switch_mode('{mode}')"))
    for key, mode, title in SCREENS_IN_ORDER:
        if mode != current_mode:
            yield from screen_entries(app, mode, key, title, current_mode)
    yield PaletteEntry("Quit (q)", "key q: asks first if a job runs or a setting is unconfirmed; resets the card",
                       partial(app.run_on_screen, None, "request_quit"))


class TunerCommands(Provider):
    def _entries(self) -> list[PaletteEntry]:
        app = self.app
        assert isinstance(app, TunerApp)
        return list(entries(app, app.current_mode))

    async def discover(self) -> Hits:
        for entry in self._entries():
            yield DiscoveryHit(Text(entry.title), entry.run, text=entry.title, help=entry.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for entry in self._entries():
            score = matcher.match(entry.title)
            if score > 0:
                yield Hit(score, matcher.highlight(entry.title), entry.run, text=entry.title, help=entry.help)
