"""docs/tui.md: Help (6) is the key map. Every key a screen's key bar can offer is in it, on that screen's lines
(Profiles' l reload and d next card, Doctor's r run again were missing)."""

from __future__ import annotations

import re

from tuner.screens.help import HELP_TEXT

SCREENS = {  # the Help text's label -> the screen's module and class
    "Dashboard": ("tuner.screens.dashboard", "DashboardScreen"),
    "Tune": ("tuner.screens.tune", "TuneScreen"),
    "Bisect": ("tuner.screens.bisect", "BisectScreen"),
    "Profiles": ("tuner.screens.profiles", "ProfilesScreen"),
    "Doctor": ("tuner.screens.doctor", "DoctorScreen"),
}
SPOKEN = {"left": "left/right", "right": "left/right", "pagedown": "pgup/pgdn", "pageup": "pgup/pgdn",
          "delete": "del"}


def _sections() -> dict[str, str]:
    """Each screen's lines of the key map: its label's line and the indented lines under it."""
    sections: dict[str, str] = {}
    label = None
    for line in HELP_TEXT.split("[b]Safety model[/b]")[0].splitlines():
        first = re.match(r"(\w+)\s", line)
        if first and first.group(1) in SCREENS:
            label = first.group(1)
            sections[label] = line[len(label):]
        elif label and line.startswith(" "):
            sections[label] += " " + line
        else:
            label = None
    return sections


def test_the_help_key_map_names_every_key_each_screen_offers():
    import importlib

    sections = _sections()
    missing = []
    for label, (module, name) in SCREENS.items():
        screen = getattr(importlib.import_module(module), name)
        text = " ".join(sections.get(label, "").split())
        for binding in screen.BINDINGS:
            if not getattr(binding, "show", True) or binding.action == "leave_form":
                continue
            key = SPOKEN.get(binding.key, binding.key)
            if not re.search(rf"(^|[ ,(]){re.escape(key)}( |$)", text):
                missing.append(f"{label}: {binding.key} ({binding.description})")
    assert not missing, missing
