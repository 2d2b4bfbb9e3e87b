"""Screen 4: saved profiles. List and detail; export, import, apply (the CLI's identity rules), delete.

File operations go through tuner.actions.profile_store, in this screen's thread workers (the UI thread never
reads or writes a file: a slow disk or a hung network home never freezes it); applying goes through the App
(keep-or-revert or --verify-style trial, in thread workers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Static

from tuner.actions import profile_store
from tuner.actions.keep_or_revert import DEFAULT_TIMEOUT_S as KEEP_S
from tuner.app.words import describe_error, for_people
from tuner.core.durations import duration_text
from tuner.core.errors import TunerError
from tuner.core.models import DeviceInfo, Knob
from tuner.profiles import evidence
from tuner.profiles.schema import Profile, ProfileDevice, RigEvidence, Tuning
from tuner.screens.base import TunerScreen, too_small
from tuner.screens.dialogs import ConfirmDialog, TextInputDialog, default_path, if_answered
from tuner.screens.messages import FileWorkDone

if TYPE_CHECKING:
    from tuner.actions.boot_service import BootServiceStatus
    from tuner.profiles.identity import MatchResult


@dataclass
class ProfilesListed(Message):
    """The worker read the store: the profiles (or the error that stopped it), and the row to select."""

    profiles: list[Profile]
    error: Exception | None
    select: str | None


KIND_WORDS = {"voltage_offset": "voltage offset", "clock_offset": "clock offset"}
WIDE_COLUMNS = 100  # from this width the table has a card column
SIMULATED_CAVEAT = "measured on a SIMULATED card: not a real measurement"
WIDE_SHARE, NARROW_SHARE = 0.65, 0.6  # the table's max-width (DEFAULT_CSS), as a share of the screen
_COLUMNS = {True: ("name", "setting", "card"), False: ("name", "setting", "")}


def _row(profile: Profile, wide: bool) -> tuple[str, str, str | Text]:
    """A profile's row: name, setting and, from 100 columns, the card (a rig: how many); below, SIMULATED or
    nothing. The card's name is any text the profile file holds: a cell of plain text, never markup."""
    simulated = any(part.device.simulated for part in profile.parts)
    if profile.is_rig:
        setting, card = "rig", f"{len(profile.parts)} cards" + (" [SIMULATED]" if simulated else "")
    else:
        setting, card = f"{profile.setting.value:+d} {profile.setting.unit}", profile.device.label
    return profile.name, setting, (Text(card) if wide else ("SIMULATED" if simulated else ""))


def _identity(device: ProfileDevice) -> str:
    """The card's identity in words, only the parts that are known."""
    parts = [f"{label} {value}" for label, value in (("PCI id", device.pci_id), ("slot", device.pci_slot),
                                                     ("serial", device.serial)) if value]
    return ", ".join(parts) or "no identity recorded"


def match_sentence(match: MatchResult, target_label: str) -> str:
    """What applying would do on the selected card, in one sentence."""
    from tuner.profiles.identity import Match

    if match.match == Match.SAME_CARD:
        return f"On {target_label}: {match.reason}. Press a to apply it, then keep or revert it within {KEEP_S:.0f} s."
    if match.match == Match.SAME_MODEL:
        return (f"On {target_label}: {match.reason}. Press a to run a 5-minute stress trial first; the setting is "
                "kept only if it passes.")
    return f"On {target_label}: cannot be applied ({match.reason})."


def measured_at(tuning: Tuning, value: int) -> int | None:
    """The setting the tuned efficiency was measured at: the passing trial with exactly that tok/J, the one nearest
    the saved value (the bisect measures near its recommendation, not always at it). None: not in the trials."""
    hits = [t.setting for t in tuning.trials if t.verdict == "pass" and t.tok_per_j == tuning.tuned_tok_per_j]
    return min(hits, key=lambda setting: abs(setting - value)) if hits else None


def efficiency_text(tuning: Tuning | None, value: int, unit: str, *, simulated: bool) -> str:
    """`Efficiency: tok/J 25.1 at -50 mV (+5.5 % vs stock, 23.8)`: rounded, labelled, with the setting it was
    measured at; on a simulated card, the caveat. Empty when the bisect recorded no efficiency."""
    if tuning is None or tuning.tuned_tok_per_j is None:
        return ""
    at = measured_at(tuning, value)
    where = f"at {at:+d} {unit}" if at is not None else f"near {value:+d} {unit}"
    text = f"Efficiency: tok/J {tuning.tuned_tok_per_j:.1f} {where}"
    if tuning.efficiency_gain_pct is not None and tuning.baseline_tok_per_j is not None:
        text += f" ({tuning.efficiency_gain_pct:+.1f} % vs stock, {tuning.baseline_tok_per_j:.1f})"
    elif tuning.baseline_tok_per_j is not None:
        text += f" (stock {tuning.baseline_tok_per_j:.1f})"
    return text + (f"; {SIMULATED_CAVEAT}" if simulated else "")


def rig_evidence_text(rig: RigEvidence | None) -> str:
    """The whole-rig confirmation in sentences (tuner.profiles.schema.RigEvidence)."""
    if rig is None:
        return "No whole-rig confirmation was recorded: each card's setting was proven alone."
    how = ", ".join(x for x in (rig.mode and f"{rig.mode} load", rig.preset and f"preset {rig.preset}",
                              rig.dtype and f"dtype {rig.dtype}") if x)
    sentence = "Confirmed together: every card at its setting at once"
    if rig.confirm_duration_s:
        sentence += f" for {duration_text(rig.confirm_duration_s)}"
    if how or rig.backend:
        sentence += " (" + ", ".join(x for x in (how, rig.backend and f"{rig.backend} collectives") if x) + ")"
    if rig.attempts:
        sentence += (", passing on the first attempt" if rig.attempts == 1 else
                     f", passing on attempt {rig.attempts} (each failed attempt backed the failing cards off)")
    sentence += "."
    figures = [f for f in (rig.tok_s and f"{rig.tok_s:,.0f} tok/s", rig.power_w and f"{rig.power_w:.0f} W",
                           rig.tok_per_j and f"tok/J {rig.tok_per_j:.1f}") if f]
    if figures:
        sentence += f" The whole rig: {', '.join(figures)}."
    return sentence


def rig_detail_text(profile: Profile, devices: Sequence[DeviceInfo], knobs: Mapping[str, Knob]) -> Text:
    """A rig profile: what it sets on each card (with that card's own efficiency), how the rig was confirmed,
    and where each part would go on this machine. `knobs`: each card's last read knob (no hardware read here)."""
    from tuner.actions.profile_apply import find_part_card
    from tuner.profiles.identity import Match, match_device

    parts = profile.parts
    text = Text()
    text.append(f"{profile.name}\n", style="bold")
    text.append(f"A rig profile: {len(parts)} cards, applied together with one keep-or-revert for the whole rig. "
                f"Saved {profile.meta.created:%Y-%m-%d %H:%M} UTC.\n")
    text.append(rig_evidence_text(profile.rig) + "\n")
    here, refused = [], []
    for index, part in enumerate(parts):
        s, d = part.setting, part.device
        # the setting first: at the start of its line, "-40 mV" is never split across two lines by the wrap
        text.append(f"card[{index}]: {s.value:+d} {s.unit} on {d.label} ({_identity(d)})")
        efficiency = efficiency_text(part.tuning, s.value, s.unit, simulated=d.simulated)
        strength = evidence.strength(part)
        text.append("".join(f"; {x}" for x in (efficiency, strength) if x) + ".\n")
        device, _found_by = find_part_card(part, list(devices))
        if device is None:
            refused.append(f"card[{index}]'s card is not in this machine")
            continue
        knob = knobs.get(device.id)  # not read yet: the card found is shown, the apply checks it
        match = match_device(part, device, knob) if knob is not None else None
        if match is not None and match.match is not Match.SAME_CARD:
            refused.append(f"card[{index}] → {device.id}: {match.reason}")
        else:
            here.append(f"card[{index}] → {device.id}")
    if refused:
        text.append(f"On this machine: cannot be applied ({'; '.join(refused)}).\n")
    else:
        text.append(f"On this machine: {', '.join(here)}. Press a to apply every card, then keep or revert them "
                    f"all within {KEEP_S:.0f} s.\n")
    return text


def boot_status_text(status: BootServiceStatus | None, profile_name: str | None, refusal: str | None = None) -> str:
    """The apply-at-boot service in sentences (tuner.actions.boot_service.status), for the selected profile.
    `refusal`: why `b` cannot install it for this profile here (it is then not offered, and this says why)."""
    if status is None:
        return "Apply at boot: reading the boot service's status..."
    offer = (f" b is not offered for this profile here: {refusal}." if refusal else
             " b installs it for this profile instead." if profile_name else "")
    if not status.installed:
        line = "Apply at boot: the boot service is not installed" + (
            f"; b is not offered for this profile here: {refusal}." if refusal else
            "; b installs it for this profile (needs root).")
    else:
        applies = f"applies {status.profile!r}" if status.profile else "applies every system profile"
        state = ", ".join(x for x in (status.enabled, status.active) if x)
        line = f"Apply at boot: the boot service is installed and {applies} at every boot" + (
            f" ({state})" if state else "") + "."
        line += " b removes it." if status.profile == profile_name else offer
    if status.next_boot_skips:
        line += f" The next boot skips it: {status.next_boot_skips}."
    last = status.last_run
    if last is not None:
        when = datetime.fromtimestamp(last.finished_at).strftime("%Y-%m-%d %H:%M")
        how = "ok" if last.ok else f"failed (exit {last.exit_code})"
        line += (f" Last {'SIMULATED ' if last.simulated else ''}boot run {when}: {how}"
                 + (f", skipped: {last.skipped}" if last.skipped else "") + ".")
        if last.lines and not last.ok:
            line += f" {last.lines[-1]}"
    elif status.last_run_unreadable:
        line += f" Last boot run: {status.last_run_unreadable}."
    return line


def detail_text(profile: Profile, target_label: str, match: MatchResult | None) -> Text:
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
        efficiency = efficiency_text(t, s.value, s.unit, simulated=d.simulated)
        if efficiency:
            text.append(f"{efficiency}.\n")
        text.append(f"Evidence: {evidence.strength(profile.parts[0], why=True)}.\n")
    if match is not None:
        text.append(match_sentence(match, target_label) + "\n")
        for warning in match.warnings:
            text.append(f"Note: {warning}\n")
    return text


class ProfilesScreen(TunerScreen):
    TITLE = "Profiles"
    DEFAULT_CSS = """
    ProfilesScreen #profiles-main { height: 1fr; }
    ProfilesScreen #profiles-table { width: auto; max-width: 60%; min-width: 30; }
    ProfilesScreen.-wide #profiles-table { max-width: 65%; }
    ProfilesScreen #profiles-detail { width: 1fr; padding: 0 1; border-left: solid $primary; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "apply", "Apply", id="profiles.apply"),
        Binding("e", "export", "Export", id="profiles.export"),
        Binding("i", "import_profile", "Import", id="profiles.import"),
        Binding("delete", "delete", "Delete", id="profiles.delete"),
        Binding("x", "delete", "Delete", show=False),
        Binding("l", "reload", "Reload", id="profiles.reload"),
        Binding("b", "boot_service", "At boot", id="profiles.boot", tooltip="Apply at boot (install/remove)"),
        Binding("d", "next_device", "Next card", id="profiles.device"),
    ]

    def compose_body(self) -> ComposeResult:
        self.profiles: list[Profile] = []
        self.lists_read = 0  # how many times a worker's list of the store arrived (tests wait for it)
        self._wide = self.app.size.width >= WIDE_COLUMNS
        self.set_class(self._wide, "-wide")
        with Horizontal(id="profiles-main"):
            yield self._new_table(self._wide)
            with VerticalScroll(id="profiles-detail"):
                yield Static(id="profile-detail")

    def on_screen_resume(self) -> None:  # every visit, the first one included (after the mount)
        self.action_reload()
        self.app.read_boot_status()

    async def on_resize(self, event: events.Resize) -> None:  # type: ignore[override]  # textual runs each class's handler, sync or async
        """From 100 columns the table has a card column, each cell in full; below, the card is in the detail. The
        new columns come in a new table, filled before it is mounted (a DataTable laid out, then given its
        columns, kept its old width and rows drawn at the old widths)."""
        wide = event.size.width >= WIDE_COLUMNS
        if wide == getattr(self, "_wide", wide):
            # the same columns; the name's width was cut for the old width (_fill): lay the rows out again
            if self.is_mounted and getattr(self, "profiles", None):
                table = self.query_one("#profiles-table", DataTable)
                self._fill(table, select=selected.name if (selected := self.selected()) is not None else None)
            return
        selected = self.selected()
        self._wide = wide
        self.set_class(wide, "-wide")
        table = self._new_table(wide)
        self._fill(table, select=selected.name if selected is not None else None)
        self._swapping = True  # a repaint in between would find no table
        try:
            await self.query_one("#profiles-table", DataTable).remove()
            await self.query_one("#profiles-main").mount(table, before=0)
        finally:
            self._swapping = False
        self.show_detail()
        if not too_small(event.size):
            table.focus()

    @staticmethod
    def _new_table(wide: bool) -> DataTable:
        table: DataTable[str | Text] = DataTable(id="profiles-table", cursor_type="row")
        table.add_columns(*_COLUMNS[wide])
        return table

    def _fill(self, table: DataTable, select: str | None = None) -> None:
        """One row per profile; a profile measured on a simulated card says SIMULATED in its row at any width (from
        100 columns in the card column, the card's label or the rig's `N cards`; below, in a column of its own).
        A name too long for the room left is cut, so the rest of the row (SIMULATED) stays in view."""
        table.clear(columns=True)
        rows = [_row(profile, self._wide) for profile in self.profiles]
        rest = [max([len(_COLUMNS[self._wide][i]), *(len(str(row[i])) for row in rows)]) + 2  # the cell padding
                for i in (1, 2)]
        size = self.app.size
        scrollbar = 2 if len(rows) + 1 > size.height - 5 else 0  # rows past the screen: a scrollbar takes 2 columns
        room = int(size.width * (WIDE_SHARE if self._wide else NARROW_SHARE)) - scrollbar - sum(rest)
        longest = max([4, *(len(row[0]) for row in rows)])
        name_width = None if longest + 2 <= room else max(8, room - 2)
        table.add_column(_COLUMNS[self._wide][0], width=name_width)
        table.add_columns(*_COLUMNS[self._wide][1:])
        for row in rows:
            table.add_row(*row)
        names = [p.name for p in self.profiles]
        if select in names:
            table.move_cursor(row=names.index(select))

    def repaint(self) -> None:
        """The boot service's status arrives from a worker: show it once it changed."""
        if getattr(self, "_boot_painted", None) is not self.app.boot_status:
            self._boot_painted = self.app.boot_status
            self.show_detail()

    # --- helpers -------------------------------------------------------------------------------------------------
    def selected(self) -> Profile | None:
        table = next(iter(self.query("#profiles-table").results(DataTable)), None)
        if table is None or not self.profiles or table.cursor_row is None or table.cursor_row >= len(self.profiles):
            return None
        return self.profiles[table.cursor_row]

    # --- actions -------------------------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, exit_on_error=False, group="profile-list", name="profile-list")
    def action_reload(self, select: str | None = None) -> None:
        try:
            profiles, error = profile_store.list_profiles(), None
        except (TunerError, OSError) as e:
            profiles, error = [], e
        self.post_message(ProfilesListed(profiles, error, select))

    def on_profiles_listed(self, message: ProfilesListed) -> None:
        self.profiles = message.profiles
        self.lists_read += 1
        if message.error is not None:
            self.notify(describe_error(message.error), severity="error", timeout=10)
        self._fill(self.query_one("#profiles-table", DataTable), message.select)
        self.show_detail()

    def on_file_work_done(self, message: FileWorkDone) -> None:  # then said by the App
        if message.reload:
            self.action_reload(select=message.select)

    def on_data_table_row_highlighted(self) -> None:
        self.show_detail()

    def show_detail(self) -> None:
        if getattr(self, "_swapping", False):
            return
        profile = self.selected()
        widget = self.query_one("#profile-detail", Static)
        if profile is None:
            widget.update("no profiles yet: save one from a finished bisect (3, then v), or import one (i)")
            return
        if profile.is_rig:
            knobs = {d: h.knob for d, h in self.app.histories.items() if h.knob is not None}
            text = rig_detail_text(profile, self.app.devices, knobs)
        else:
            device_id = self.app.selected_device_id
            match = None
            knob = self._knob()
            if device_id and knob is not None:
                from tuner.profiles.identity import match_device

                match = match_device(profile, self.app.device(device_id), knob)
            text = detail_text(profile, device_id or "-", match)
        text.append(boot_status_text(self.app.boot_status, profile.name, self.boot_refusal(profile)))
        widget.update(text)
        self.refresh_keys()

    def boot_refusal(self, profile: Profile | None) -> str | None:
        """Why `b` would be refused for `profile` in this session (tuner.actions.boot_service.check_installable: a
        simulated session or a simulated profile), or None. Removing the service that applies it is always
        offered."""
        from tuner.actions import boot_service

        status = self.app.boot_status
        if profile is None or (status is not None and status.installed and status.profile == profile.name):
            return None
        try:
            boot_service.check_installable(profile, simulated_session=self.app.backend.simulated)
        except TunerError as e:
            return for_people(e.message).removesuffix(": nothing installed")
        return None

    def offers(self, action: str) -> bool:
        """`b` is offered only where it could install or remove the boot service (not for a SIMULATED profile or
        in a simulated session: it asked first, then refused)."""
        if action != "boot_service":
            return True
        profile = self.selected() if self.is_mounted else None
        return profile is not None and self.boot_refusal(profile) is None

    def action_next_device(self) -> None:
        self.app.select_device(1)
        self.show_detail()

    def action_apply(self) -> None:
        profile = self.selected()
        if profile is not None and profile.is_rig:
            self.app.apply_rig_profile(profile)
        elif profile is not None and self.app.selected_device_id:
            self.app.apply_profile(profile, self.app.selected_device_id)

    def action_boot_service(self) -> None:
        """Install the boot service for the selected profile, or remove it when it applies this one (asks first;
        tuner.actions.boot_service, as `tuner service` does)."""
        profile = self.selected()
        status = self.app.boot_status
        refusal = self.boot_refusal(profile)
        if refusal:  # said before any question: nothing to confirm
            self.notify(f"apply at boot: {refusal}", severity="warning", timeout=10)
            return
        if profile is None or status is None:
            self.notify("select a profile first" if profile is None else "reading the boot service's status...",
                        severity="warning")
            return
        if status.installed and status.profile == profile.name:
            question = (f"Remove the boot service? {profile.name!r} is no longer applied at boot; the profiles in "
                        "the system store are kept.")
            self.app.push_screen(ConfirmDialog(question, yes="Remove", no="Cancel"),
                                 if_answered(lambda _yes: self.app.change_boot_service(None)))
            return
        system_names = {p.name for p in status.system_profiles}
        replaces = (f" It replaces the system copy of {profile.name!r}." if profile.name in system_names else "")
        instead = (f" It replaces the service that applies {status.profile or 'every system profile'!r}."
                   if status.installed else "")
        question = (f"Apply {profile.name!r} at every boot? This copies it to the system store and installs the "
                    f"boot service (needs root).{replaces}{instead} Booting with tuner.reset on the kernel command "
                    "line skips it.")
        self.app.push_screen(ConfirmDialog(question, yes="Install", no="Cancel"),
                             if_answered(lambda _yes: self.app.change_boot_service(profile.name,
                                                                                   overwrite=bool(replaces))))

    def action_export(self) -> None:
        profile = self.selected()
        if profile is None:
            return
        from tuner.actions.exports import profile_export_path

        def export(path: Path) -> FileWorkDone:
            written, carried = profile_store.export_profile(profile, path)  # with its stock reference, as the CLI
            ref = f" and its stock reference to {carried[1]}" if carried else ""
            return FileWorkDone(f"exported {profile.name} to {written}{ref}", None)

        default, why = default_path(partial(profile_export_path, profile.name))
        self.app.push_screen(  # the default in full: where it goes is never a guess
            TextInputDialog(f"Export {profile.name!r} to path{why}:", value=default),
            if_answered(lambda path: self._file_work(partial(export, Path(path)))))

    def action_import_profile(self) -> None:
        def import_file(path: Path) -> FileWorkDone:
            profile, _path, _ref = profile_store.import_profile(path)  # validated before it is stored
            return FileWorkDone(f"imported {profile.name}", None, reload=True, select=profile.name)

        self.app.push_screen(TextInputDialog("Import a profile from path:", placeholder="~/r9700.toml"),
                             if_answered(lambda path: self._file_work(partial(import_file, Path(path)))))

    def action_delete(self) -> None:
        profile = self.selected()
        if profile is None:
            return

        def delete() -> FileWorkDone:
            # the selected row's own file (its store and file name): a namesake in the other store is another
            # profile; and the stock reference beside it
            profile_store.delete_profile(profile.store_name, system=profile_store.is_system(profile))
            return FileWorkDone(f"deleted {profile.store_name}", None, reload=True)

        store = "system" if profile_store.is_system(profile) else "user"
        self.app.push_screen(
            ConfirmDialog(f"Delete profile {profile.store_name!r} from the {store} store? This cannot be undone.",
                          yes="Delete", no="Keep"),
            if_answered(lambda _yes: self._file_work(delete)))
