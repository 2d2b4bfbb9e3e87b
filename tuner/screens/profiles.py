"""Screen 4: saved profiles. List and detail; export, import, apply (the CLI's identity rules), delete.

File operations go through tuner.profiles; applying goes through the App (keep-or-revert or --verify-style
trial, in thread workers).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from tuner.app.words import for_people
from tuner.core.errors import TunerError
from tuner.screens.base import TunerScreen
from tuner.screens.dialogs import ConfirmDialog, TextInputDialog


def _profiles_module():
    try:
        from tuner import profiles
    except ImportError:
        return None
    return profiles


KIND_WORDS = {"voltage_offset": "voltage offset", "clock_offset": "clock offset"}
SIMULATED_CAVEAT = "measured on a SIMULATED card: not a real measurement"


def _identity(device) -> str:
    """The card's identity in words, only the parts that are known."""
    parts = [f"{label} {value}" for label, value in (("PCI id", device.pci_id), ("slot", device.pci_slot),
                                                     ("serial", device.serial)) if value]
    return ", ".join(parts) or "no identity recorded"


def match_sentence(match, target_label: str) -> str:
    """What applying would do on the selected card, in one sentence."""
    from tuner.profiles.identity import Match

    if match.match == Match.SAME_CARD:
        return f"On {target_label}: {match.reason}. Press a to apply it, then keep or revert it within 15 s."
    if match.match == Match.SAME_MODEL:
        return (f"On {target_label}: {match.reason}. Press a to run a 5-minute stress trial first; the setting is "
                "kept only if it passes.")
    return f"On {target_label}: cannot be applied ({match.reason})."


def detail_text(profile, target_label: str, match) -> Text:
    """A profile as sentences a user reads once: what it sets, how it was found, what it would do here."""
    s, d = profile.setting, profile.device
    text = Text()
    text.append(f"{profile.name}\n", style="bold")
    text.append(f"Sets the {KIND_WORDS.get(s.kind, s.kind)} to {s.value:+d} {s.unit} on {d.label}.\n")
    text.append(f"Saved {profile.meta.created:%Y-%m-%d %H:%M} UTC. Card: {_identity(d)}.\n")
    t = profile.tuning
    if t is None:
        text.append("Not from an auto-bisect: no evidence recorded.\n")
    else:
        found = []
        if t.confirmed is not None:
            found.append(f"confirmed stable at {t.confirmed:+d} {s.unit}")
        if t.first_failure is not None:
            found.append(f"first failure at {t.first_failure:+d} {s.unit}")
        if t.margin is not None:
            found.append(f"a {t.margin} {s.unit} safety margin")
        text.append("Found by an auto-bisect" + (f": {', '.join(found)}" if found else "") +
                    f" ({len(t.trials or ())} trials).\n")
        if t.baseline_tok_per_j is not None and t.tuned_tok_per_j is not None:
            gain = f" ({t.efficiency_gain_pct:+.1f} %)" if t.efficiency_gain_pct is not None else ""
            text.append(f"Efficiency {t.baseline_tok_per_j:.2f} tok/J at stock, {t.tuned_tok_per_j:.2f} tok/J at "
                        f"{s.value:+d} {s.unit}{gain}")
            text.append(f"; {SIMULATED_CAVEAT}.\n" if d.simulated else ".\n")
    if match is not None:
        text.append(match_sentence(match, target_label) + "\n")
        for warning in match.warnings:
            text.append(f"Note: {warning}\n")
    return text


class ProfilesScreen(TunerScreen):
    TITLE = "Profiles"
    DEFAULT_CSS = """
    ProfilesScreen #profiles-main { height: 1fr; }
    ProfilesScreen #profiles-table { width: 1fr; min-width: 30; }
    ProfilesScreen #profiles-detail { width: 2fr; padding: 0 1; border-left: solid $primary; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "apply", "Apply", id="profiles.apply"),
        Binding("e", "export", "Export", id="profiles.export"),
        Binding("i", "import_profile", "Import", id="profiles.import"),
        Binding("delete", "delete", "Delete", id="profiles.delete"),
        Binding("x", "delete", "Delete", show=False),
        Binding("l", "reload", "Reload", id="profiles.reload"),
        Binding("d", "next_device", "Next card", id="profiles.device"),
    ]

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="profiles-main"):
            table = DataTable(id="profiles-table", cursor_type="row")
            table.add_columns("name", "setting", "card")
            yield table
            with VerticalScroll(id="profiles-detail"):
                yield Static(id="profile-detail")

    def on_mount(self) -> None:
        super().on_mount()
        self.profiles: list = []
        self.action_reload()
        self.query_one("#profiles-table", DataTable).focus()

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.action_reload()

    # --- helpers -------------------------------------------------------------------------------------------------
    def selected(self):
        table = self.query_one("#profiles-table", DataTable)
        if not self.profiles or table.cursor_row is None or table.cursor_row >= len(self.profiles):
            return None
        return self.profiles[table.cursor_row]

    def _error(self, e: Exception) -> None:
        text = for_people(e.one_line()) if isinstance(e, TunerError) else f"{type(e).__name__}: {e}"
        self.notify(text, severity="error", timeout=10)

    # --- actions -------------------------------------------------------------------------------------------------
    def action_reload(self, select: str | None = None) -> None:
        module = _profiles_module()
        table = self.query_one("#profiles-table", DataTable)
        table.clear()
        if module is None:
            self.profiles = []
            self.query_one("#profile-detail", Static).update("profiles are not available yet in this build")
            return
        try:
            self.profiles = module.list_profiles()
        except TunerError as e:
            self.profiles = []
            self._error(e)
        for profile in self.profiles:
            table.add_row(profile.name, f"{profile.setting.value:+d} {profile.setting.unit}", profile.device.name)
        if select:
            names = [p.name for p in self.profiles]
            if select in names:
                table.move_cursor(row=names.index(select))
        self.show_detail()

    def on_data_table_row_highlighted(self) -> None:
        self.show_detail()

    def show_detail(self) -> None:
        profile = self.selected()
        widget = self.query_one("#profile-detail", Static)
        if profile is None:
            widget.update("no profiles yet: save one from a finished bisect (3, then v), or import one (i)")
            return
        device_id = self.app.selected_device_id
        match = None
        if device_id and self.app.histories[device_id].knob is not None:
            from tuner.profiles.identity import match_device

            match = match_device(profile, self.app.device(device_id), self.app.histories[device_id].knob)
        widget.update(detail_text(profile, device_id or "-", match))

    def action_next_device(self) -> None:
        self.app.select_device(1)
        self.show_detail()

    def action_apply(self) -> None:
        profile = self.selected()
        if profile is not None and self.app.selected_device_id:
            self.app.apply_profile(profile, self.app.selected_device_id)

    def action_export(self) -> None:
        profile = self.selected()
        if profile is None:
            return
        self.app.push_screen(
            TextInputDialog(f"Export {profile.name!r} to path:", value=f"{profile.name}.toml"),
            lambda path: self._export(profile, path),
        )

    def _export(self, profile, path: str | None) -> None:
        if not path:
            return
        from tuner.profiles.store import write_profile_file

        try:
            written = write_profile_file(profile, Path(path).expanduser())
        except (TunerError, OSError) as e:
            self._error(e)
            return
        self.notify(f"exported {profile.name} to {written}")

    def action_import_profile(self) -> None:
        self.app.push_screen(TextInputDialog("Import a profile from path:", placeholder="~/r9700.toml"),
                             self._import)

    def _import(self, path: str | None) -> None:
        if not path:
            return
        module = _profiles_module()
        from tuner.profiles.store import read_profile_file

        try:
            profile = read_profile_file(Path(path).expanduser())  # validated before it is stored
            module.save_profile(profile)
        except (TunerError, OSError) as e:
            self._error(e)
            return
        self.notify(f"imported {profile.name}")
        self.action_reload(select=profile.name)

    def action_delete(self) -> None:
        profile = self.selected()
        if profile is None:
            return
        self.app.push_screen(
            ConfirmDialog(f"Delete profile {profile.name!r}? This cannot be undone.", yes="Delete", no="Keep"),
            lambda yes: self._delete(profile, yes),
        )

    def _delete(self, profile, yes: bool | None) -> None:
        if not yes:
            return
        try:
            _profiles_module().delete_profile(profile.name)
        except TunerError as e:
            self._error(e)
            return
        self.notify(f"deleted {profile.name}")
        self.action_reload()
