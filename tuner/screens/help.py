"""Screen 6: the key map and the safety model in a few lines."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from tuner.actions.keep_or_revert import DEFAULT_TIMEOUT_S as KEEP_S
from tuner.screens.base import TunerScreen

HELP_TEXT = f"""\
[b]Keys[/b] 1 Dashboard 2 Tune 3 Auto-bisect 4 Profiles 5 Doctor 6 Help
     q quit   ctrl+p command palette (every action, by name)
Dashboard d next card (2+ cards: a row per card, the selected one below)
Tune      left/right one step, pgup/pgdn five, a apply, r reset to stock,
          s start/stop stress, m mode, p preset, d next device
Bisect    f edit the form (tab between fields, enter starts, esc leaves),
          b start, x stop, u resume, n restart, a apply the result,
          v save it as a profile, g plot/table, e export the trials,
          d next card, then ALL CARDS (every card at once; c switches
          the card table; a applies every card, v saves a rig profile)
Profiles  up/down select, a apply (a rig profile: every card at once),
          e export, i import, del delete, l reload, d next card,
          b apply at boot (install/remove)
Doctor    r run the checks again
Dialogs   enter = the highlighted button; escape = the safe choice

[b]Safety model[/b]
- Every write is checked against the card's range, applied, read back.
- A manual setting must be kept within {KEEP_S:.0f} s, or it reverts by itself.
- Stress and bisect runs keep going while you switch screens. Quitting
  asks, then stops them and resets every card they changed to stock;
  an SSH hang-up does the same without asking.
- Overvolting is never offered here.
- Profiles apply only to the card they were proven on; another card of
  the same model needs a passing stress trial first. A rig profile or
  an ALL CARDS result is kept or reverted as one: every card together.
- State is written in words (STOCK, MODIFIED, PASS, FAIL, RUNNING),
  never by colour alone; NO_COLOR is honoured.
"""


class HelpScreen(TunerScreen):
    TITLE = "Help"

    def compose_body(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(HELP_TEXT, id="help-text")
