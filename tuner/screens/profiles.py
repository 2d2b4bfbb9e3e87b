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

from tuner.core.errors import TunerError
from tuner.screens.base import TunerScreen
from tuner.screens.dialogs import ConfirmDialog, TextInputDialog


def _profiles_module():
    try:
        from tuner import profiles
    except ImportError:
        return None
    return profiles


def detail_text(profile, target_label: str, match) -> Text:
    from tuner.profiles.identity import fingerprint

    s = profile.setting
    text = Text()
    text.append(f"{profile.name}\n", style="bold")
    text.append(f"setting     {s.value:+d} {s.unit} ({s.kind})\n")
    text.append(f"card        {profile.device.name}\n")
    text.append(f"fingerprint {fingerprint(profile.device)}\n")
    text.append(f"created     {profile.meta.created:%Y-%m-%d %H:%M} UTC\n")
    tuning = profile.tuning
    if tuning is not None:
        parts = []
        for attr, label in (("confirmed_value", "confirmed"), ("margin", "margin"), ("first_failure", "first fail"),
                            ("efficiency_gain_pct", "gain %"), ("baseline_tok_per_j", "base tok/J"),
                            ("tuned_tok_per_j", "tuned tok/J")):
            value = getattr(tuning, attr, None)
            if value is not None:
                parts.append(f"{label} {value}")
        text.append("evidence    " + (", ".join(parts) or "-") + "\n")
        text.append(f"trials      {len(tuning.trials or ())}\n")
    else:
        text.append("evidence    none (not from a bisect)\n")
    if match is not None:
        text.append(f"on {target_label}: {match.match.value.replace('_', ' ').upper()}: {match.reason}\n")
        for warning in match.warnings:
            text.append(f"  warning: {warning}\n")
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
        text = e.one_line() if isinstance(e, TunerError) else f"{type(e).__name__}: {e}"
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
