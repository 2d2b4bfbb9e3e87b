"""Screen 3: auto-bisect. A form with the parameters, the live trial table, progress, efficiency plot, result.

The run itself belongs to the App (switching screens never stops it); this screen only asks and draws.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import DataTable, Input, Label, ProgressBar, Static

from tuner.actions import parameters
from tuner.app import form_memory, jobs
from tuner.app.state import BisectState, CardState, trial_text
from tuner.app.words import BISECT, for_people
from tuner.core.durations import duration_text, format_duration
from tuner.core.errors import TunerError, UsageError
from tuner.core.models import Knob
from tuner.screens.base import TunerScreen
from tuner.screens.dialogs import TextInputDialog, default_path
from tuner.screens.messages import FileWorkDone
from tuner.tuning.events import FINISHING, Recommendation
from tuner.tuning.job import BisectEstimate, BisectOutcome, BisectParams
from tuner.tuning.sensitivity import detection_rate_text
from tuner.widgets.history_plot import HistoryPlot

if TYPE_CHECKING:
    from tuner.backends.base import Backend

# The parameters with a label (tuner.actions.parameters), the first row's first. A blank field is the core's default
# for the card, shown as the field's placeholder ("10 mV", "30 MHz", "5m").
FIRST_ROW = ("step", "resolution", "margin", "floor")
FIELDS = tuple(sorted((p for p in parameters.BISECT if p.label), key=lambda p: p.id not in FIRST_ROW))
# Each field holds its longest valid value and the cursor after it: a setting with its unit ("-300 mV",
# "+1000 MHz"), a duration ("1h30m"), a mode ("mixed"). Two rows at 80 columns; the plan sits beside the second.
FIELD_WIDTHS = {"step": 8, "resolution": 8, "margin": 8, "floor": 10, "trial": 6, "confirm": 6, "mode": 6}
COLUMNS = ("setting", "phase", "verdict", "why", "tok/s", "W", "tok/J", "max °C")
WIDE_COLUMNS = 100  # at this width and more the efficiency plot sits beside the table; below, g swaps them
KIND_WIDTH = 10  # the reason column holds a short kind; the selected row's full reason is on the detail line
T = TypeVar("T")


# What the screen's file worker (TunerScreen._file_work) posts back: the files are read and written off the UI
# thread (issue 21), each answer handled on it.
@dataclass
class FormRecalled(Message):
    """The card's remembered form (tuner.app.form_memory), and the form as it was when it was asked for."""

    device_id: str
    asked: dict[str, str]
    recalled: tuple[dict[str, str], str | None]  # the values, and why none could be read (form_memory.recall)


class Asked(Generic[T]):
    """A value the file worker reads for a key (the card's unfinished session, the plan line): kept with the key it
    was read for; an answer for a key asked before the last one is dropped (Read)."""

    def __init__(self, value: T) -> None:
        self.value = value
        self.key: tuple | None = None  # the key `value` was read for (None: the first value, read for none)
        self.asked: tuple | None = None

    def ask(self, key: tuple) -> bool:
        """True: `key` is now asked (the caller reads it), neither its answer nor its read being under way."""
        if key in (self.key, self.asked):
            return False
        self.asked = key
        return True


@dataclass
class Read(Message, Generic[T]):
    """What the file worker read for `into`, for the key it was read for."""

    into: Asked[T]
    key: tuple
    value: T


def parse_form(values: dict[str, str], *, unit: str = "", resume: bool = False,
               restart: bool = False) -> BisectParams:
    """The form's text as bisect parameters, each read as the CLI reads its flag (a blank field: None here, the
    card's default in the core); UsageError names the bad field."""
    given = {p.name: p.parse(text, unit, p.label) for p in FIELDS if (text := values.get(p.id, "").strip())}
    return BisectParams(**given, resume=resume, restart=restart)


def _cell(value: object, fmt: str = "{}") -> str:
    if value is None or value == "":
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def short_kind(row: Mapping[str, Any]) -> str:
    """The reason as a short kind (`mismatch`, `hang`, `stopped`), so every column fits at 80 columns."""
    kind = row.get("kind") or ""
    if not kind:
        reason = str(row.get("reason") or "")
        kind = "stopped" if reason == "stopped by you" else reason.split(":")[0].split(" (")[0]
    return _fit(kind, KIND_WIDTH)


def trial_detail(row: Mapping[str, Any] | None, unit: str) -> str:
    """The selected trial in one line, the full reason included."""
    if not row:
        return ""
    where = _cell(row.get("setting"), "{:+d} " + unit)
    verdict = str(row.get("verdict") or "-").upper()
    reason = row.get("reason") or row.get("kind") or ""
    return f"{where} {row.get('phase') or ''}: {verdict}" + (f" · {reason}" if reason else "")


def trial_cells(row: Mapping[str, Any], unit: str) -> tuple[str, ...]:
    verdict = str(row.get("verdict") or "-").upper()
    return (
        _cell(row.get("setting"), "{:+d} " + unit),
        _cell(row.get("phase")),
        verdict,
        _cell(short_kind(row)),
        _cell(row.get("tok_s"), "{:,.0f}"),
        _cell(row.get("power_w"), "{:.0f}"),
        _cell(row.get("tok_per_j"), "{:.2f}"),
        _cell(row.get("max_temp_c"), "{:.0f}"),
    )


class BisectScreen(TunerScreen):
    TITLE = "Bisect"
    # Back from a dialog or another screen with nothing focused, Textual focuses AUTO_FOCUS: by default the first
    # focusable widget, the step field, where the footer's next key (e, b, v) would be typed. The table instead: a
    # field takes keys only after `f` gives it focus, which it shows reversed (no colour needed), until esc or enter.
    AUTO_FOCUS = "#bisect-trials"
    DEFAULT_CSS = """
    BisectScreen .bisect-form { height: 1; padding: 0 1; }
    BisectScreen .bisect-form Label { width: auto; padding: 0 1 0 0; }
    BisectScreen #bisect-plan { width: 1fr; }
    BisectScreen #bisect-status { height: 2; padding: 0 1; }
    BisectScreen #bisect-progress { height: 1; padding: 0 1; }
    BisectScreen #bisect-main { height: 1fr; }
    BisectScreen #bisect-trials { width: 1fr; }
    BisectScreen #plot-efficiency { width: 1fr; display: none; }
    BisectScreen.-wide #plot-efficiency { width: 40%; display: block; }
    BisectScreen.-plot #plot-efficiency { display: block; }
    BisectScreen.-plot #bisect-trials { display: none; }
    BisectScreen.-wide #bisect-trials { display: block; }
    BisectScreen #bisect-detail { height: 1; padding: 0 1; }
    BisectScreen #bisect-result { height: auto; max-height: 4; padding: 0 1; }
    BisectScreen #rig-cards, BisectScreen #rig-attempts { height: auto; padding: 0 1; display: none; }
    BisectScreen #rig-attempts { max-height: 2; }
    BisectScreen.-rig #rig-cards, BisectScreen.-rig #rig-attempts { display: block; }
    BisectScreen.-rig #bisect-progress { display: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("b", "start", "Start", id="bisect.start"),
        Binding("x", "stop", "Stop", id="bisect.stop"),
        Binding("u", "resume", "Resume", id="bisect.resume"),
        Binding("n", "restart", "Restart", id="bisect.restart"),
        Binding("a", "apply_result", "Apply result", id="bisect.apply"),
        Binding("v", "save_profile", "Save", id="bisect.save"),
        Binding("e", "export", "Export", id="bisect.export"),
        Binding("f", "edit_form", "Form", id="bisect.form"),
        Binding("escape", "leave_form", "Table", show=False),
        Binding("g", "toggle_plot", "Plot/table", id="bisect.plot"),
        Binding("d", "next_device", "Next card", id="bisect.device", tooltip="Next card, then ALL CARDS"),
        Binding("c", "next_table", "Card table", id="bisect.table", tooltip="All cards: the next card's table"),
    ]

    def compose_body(self) -> ComposeResult:
        for row, fields in (("bisect-form", FIRST_ROW), ("bisect-form-2", None)):
            with Horizontal(id=row, classes="bisect-form"):
                for p in FIELDS:
                    if (p.id in FIRST_ROW) == (fields is not None):
                        field = Input(id=f"in-{p.id}", compact=True)
                        field.styles.width = FIELD_WIDTHS[p.id]
                        yield Label(f"{p.label}:")
                        yield field
                if fields is None:
                    yield Static(id="bisect-plan", markup=False)  # it quotes a refused field as typed
        yield Static(id="bisect-status")
        yield ProgressBar(total=1.0, show_eta=False, id="bisect-progress")
        yield Static(id="rig-cards")
        yield Static(id="rig-attempts")
        with Horizontal(id="bisect-main"):
            table: DataTable[str | Text] = DataTable(id="bisect-trials", cursor_type="row", zebra_stripes=True)
            table.add_columns(*COLUMNS)
            yield table
            yield HistoryPlot("tok/J vs setting", x_label="setting", id="plot-efficiency")
        yield Static(id="bisect-detail", markup=False)  # a reason quotes the kernel log: amdgpu's `[gfxhub]`
        yield Static(id="bisect-result")

    def on_mount(self) -> None:
        self._painted: tuple[object, ...] | None = None
        self._session = Asked(BisectState())  # for (card, bisect running, its outcome): its unfinished session
        self._defaults_for: object = None
        self._plan = Asked("")  # the plan line, for the form as it was estimated for
        self._recalls = 0  # form recalls in flight: a start waits for them (it must use the remembered values)
        # (resume, restart) and the target b was pressed for (card, ALL CARDS): the start waits for the recall
        self._start_after_recall: tuple[bool, bool, tuple[str | None, bool]] | None = None
        self._notes_said: set[str] = set()  # a FIFO at the form memory: said once, not at every card's recall
        self._recall_form()

    def _form_values(self) -> dict[str, str]:
        return {p.id: self.query_one(f"#in-{p.id}", Input).value for p in FIELDS}

    def _recall_form(self) -> None:
        """The selected card's last values (tuner.app.form_memory), read in a worker; blank where it has none."""
        device_id = self.app.selected_device_id
        if not device_id:
            self._fill_form({})
            return
        device, asked = self.app.device(device_id), self._form_values()
        self._recalls += 1
        self._file_work(lambda: FormRecalled(device_id, asked, form_memory.recall(device)))

    def on_form_recalled(self, message: FormRecalled) -> None:
        """Filled in unless the card changed or the form was edited meanwhile (what was typed is kept); a start
        asked for meanwhile runs now, with the form as filled."""
        self._recalls -= 1
        values, note = message.recalled
        if note is not None and note not in self._notes_said:  # the line names the file: once per file
            self._notes_said.add(note)
            self.notify(note, severity="warning", timeout=8)
        if message.device_id == self.app.selected_device_id and self._form_values() == message.asked:
            self._fill_form(values)
            self.repaint()
        if self._recalls == 0 and self._start_after_recall is not None:
            (resume, restart, target), self._start_after_recall = self._start_after_recall, None
            if target != self._target():  # d chose another card meanwhile: its form is not the one b was pressed on
                self.notify(f"the bisect of {self._target_words(target)} was not started: d chose another card "
                            "before its form was read; b starts one here", severity="warning")
                return
            self.action_start(resume=resume, restart=restart)

    def _fill_form(self, values: Mapping[str, str]) -> None:
        for p in FIELDS:
            self.query_one(f"#in-{p.id}", Input).value = values.get(p.id, "")

    def _show_defaults(self, knob: Knob | None) -> None:
        """Placeholders follow the selected card (its unit and steps), refreshed only when the card changes."""
        if knob is None or (knob.unit, knob.step, knob.stock) == self._defaults_for:
            return
        self._defaults_for = (knob.unit, knob.step, knob.stock)
        for p in FIELDS:
            self.query_one(f"#in-{p.id}", Input).placeholder = p.placeholder(knob)

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(self.size.width >= WIDE_COLUMNS, "-wide")

    # --- actions -------------------------------------------------------------------------------------------------
    def action_start(self, resume: bool = False, restart: bool = False) -> None:
        if self._recalls:  # b pressed before the remembered form arrived: started once it is filled in
            self._start_after_recall = (resume, restart, self._target())
            return
        values, knob, selected = self._form_values(), self._knob(), self.app.selected_device_id
        try:
            params = parse_form(values, unit=knob.unit if knob else "", resume=resume, restart=restart)
        except UsageError as e:
            self.notify(e.one_line(), severity="error", timeout=8)
            return
        if selected:  # none while no card is known
            device = self.app.device(selected)
            self._file_work(lambda: form_memory.remember(device, values))
        ids = tuple(d.id for d in self.app.devices) if self.app.bisect_all else tuple(filter(None, [selected]))
        if ids:
            self.app.start_bisect(ids, params)
            self.query_one("#bisect-trials", DataTable).focus()

    def _target(self) -> tuple[str | None, bool]:
        """What b starts now: the selected card, or every card (ALL CARDS)."""
        return self.app.selected_device_id, self.app.bisect_all

    @staticmethod
    def _target_words(target: tuple[str | None, bool]) -> str:
        device_id, every = target
        return "every card" if every else str(device_id)

    def on_input_submitted(self) -> None:
        self.action_start()

    def action_resume(self) -> None:
        self.action_start(resume=True)

    def action_restart(self) -> None:
        """A new session although an unfinished one exists (the CLI's --restart); the unsafe list is kept."""
        self.action_start(restart=True)

    def action_stop(self) -> None:
        if self._start_after_recall is not None:  # b pressed, its start waiting for the form: it never starts
            target, self._start_after_recall = self._start_after_recall[2], None
            self.notify(f"the bisect of {self._target_words(target)} was not started (x)")
        if self.app.bisect.running:
            self.app.stop_bisect()
            several = len(self.app.bisect.device_ids) > 1
            self.notify("stopping the bisect of every card; every card goes back to stock" if several
                        else "stopping the bisect; the card goes back to stock")

    def action_toggle_plot(self) -> None:
        """Below WIDE_COLUMNS the plot takes the table's place (g again brings the table back)."""
        self.toggle_class("-plot")

    def on_data_table_row_highlighted(self) -> None:
        self._paint_detail()

    def _table_state(self) -> CardState:
        """The search whose trials the table shows: the selected card's."""
        return self._shown().card(self.app.selected_device_id)

    def _paint_detail(self) -> None:
        state = self._table_state()
        table = self.query_one("#bisect-trials", DataTable)
        row = state.trials[table.cursor_row] if 0 <= table.cursor_row < len(state.trials) else None
        self.query_one("#bisect-detail", Static).update(trial_detail(row, state.unit))

    def action_edit_form(self) -> None:
        self.query_one("#in-step", Input).focus()

    def action_leave_form(self) -> None:
        self.query_one("#bisect-trials", DataTable).focus()

    def action_next_device(self) -> None:
        """The next card; with two or more cards, after the last one comes ALL CARDS (every card at once)."""
        app = self.app
        if app.bisect.running:
            self.notify("a bisect is running; stop it before choosing another card", severity="warning")
            return
        ids = [d.id for d in app.devices]
        if app.bisect_all:
            app.bisect_all = False
            app.selected_device_id = ids[0]
        elif len(ids) > 1 and app.selected_device_id == ids[-1]:
            app.bisect_all = True
            app.selected_device_id = ids[0]  # the first card's table first; c shows the next
        else:
            app.select_device(1)
        self._recall_form()
        self.repaint()

    def action_next_table(self) -> None:
        """All cards: show the next card's trial table (the run goes on)."""
        if not self.app.bisect_all:
            self.notify("c switches the card table when the target is ALL CARDS (d)", severity="warning")
            return
        self.app.select_device(1)
        self._painted = None
        self.repaint()

    def action_export(self) -> None:
        """The trials as CSV or JSON (by the suffix), as `tuner report FILE` writes them (all cards: the card whose
        table is shown)."""
        state = self._table_state()
        if not state.device_id or not any(r.get("verdict") not in (None, "running") for r in state.trials):
            self.notify("no finished trials to export yet", severity="warning")
            return
        from tuner.actions.exports import report_export_path

        # as Profiles' e and `tuner report`
        default, why = default_path(partial(report_export_path, state.device_id, state.session))
        self.app.push_screen(TextInputDialog(f"Export the trials to (.csv or .json){why}:", value=default),
                             self._export)

    def _export(self, path: str | None) -> None:
        if not path:
            return
        from dataclasses import asdict

        from tuner.actions.report import write_report

        state = self._table_state()
        device_id = state.device_id
        if device_id is None:  # no card selected: no trials to write
            return
        rec = state.recommendation
        simulated = self.app.device(device_id).simulated

        def export() -> FileWorkDone:  # in the file worker; said by the App
            written = write_report(Path(path), state.trials, device_id=device_id, session=state.session,
                                   simulated=simulated, recommendation=asdict(rec) if rec is not None else None)
            return FileWorkDone(f"exported the trials to {written}", None)

        self._file_work(export)

    def action_apply_result(self) -> None:
        """One card: its recommendation through the App's apply path (the rules of `tuner set`, then keep-or-revert).
        All cards: every card's final setting through the core's rig apply (one keep-or-revert for the whole rig).
        Once kept, offer to save it as a profile (a rig profile)."""
        from tuner.actions.bisect import rig_profile_from_outcome

        app, job = self.app, self._shown()
        if app.bisect_all:
            if (outcome := self._rig_outcome(job)) is not None:
                app.apply_rig_profile(lambda: rig_profile_from_outcome(app.backend, outcome, jobs.RESULT_NAME),
                                      on_kept=self.action_save_profile)
            return
        device_id = app.selected_device_id
        rec = job.card(device_id).recommendation
        if rec is None or job.running or device_id is None:
            self.notify("no recommendation yet: a finished bisect gives one", severity="warning")
            return
        knob = app.histories[device_id].knob
        if knob is not None and knob.current == rec.setting:
            self.notify(f"{device_id} is already at {rec.setting:+d} {rec.unit}; v saves it as a profile")
            return
        app.apply_setting(device_id, rec.setting, on_kept=self.action_save_profile)

    def action_save_profile(self) -> None:
        app, job = self.app, self._shown()
        if app.bisect_all:
            if self._rig_outcome(job) is not None:
                app.push_screen(TextInputDialog("Save every card's setting as one rig profile:",
                                                value=f"rig-{len(job.settings or {})}-cards"), self._save_as)
            return
        device_id = app.selected_device_id
        rec = job.card(device_id).recommendation
        if rec is None or job.outcome is None:  # the outcome (the evidence saved) comes as the job ends
            self.notify("no recommendation yet: a finished bisect gives one", severity="warning")
            return
        default = f"{device_id}-{abs(rec.setting)}{rec.unit.lower()}"
        app.push_screen(TextInputDialog("Save the recommended setting as profile:", value=default), self._save_as)

    def _save_as(self, name: str | None) -> None:
        if name:
            self.app.save_bisect_profile(name, None if self.app.bisect_all else self.app.selected_device_id)

    def _rig_outcome(self, job: BisectState) -> BisectOutcome | None:
        """All cards: a finished run with settings confirmed together (what apply and save act on); else say so."""
        if job.running or job.outcome is None or not job.settings:
            self.notify("no settings confirmed together yet: a finished bisect of every card gives them",
                        severity="warning")
            return None
        return job.outcome

    # --- drawing -------------------------------------------------------------------------------------------------
    def _shown(self) -> BisectState:
        """The bisect this target shows: the App's when it is of every card (ALL CARDS) or, for one card, when it
        includes that card (after a bisect of every card: that card's own search); else none yet."""
        job, app = self.app.bisect, self.app
        mine = len(job.device_ids) > 1 if app.bisect_all else app.selected_device_id in job.device_ids
        if mine or app.bisect_all or not app.selected_device_id:
            return job if mine else BisectState()
        # nothing ran here for this card: its unfinished session, if any (read again once a bisect started or ended,
        # in the file worker; until it answers, what was read for this card before, else nothing)
        device_id, resting = app.selected_device_id, self._session
        key = (device_id, job.running, id(job.outcome))
        if resting.ask(key):
            self._file_work(lambda: Read(resting, key, jobs.unfinished_session(device_id) or BisectState()))
        return resting.value if resting.key is not None and resting.key[0] == device_id else BisectState()

    def on_read(self, message: Read) -> None:
        if message.key == message.into.asked:
            message.into.key, message.into.value = message.key, message.value
            self.repaint()

    RUNNING_REFUSES = frozenset({"start", "resume", "restart", "apply_result", "save_profile", "next_device"})

    def offers(self, action: str) -> bool:
        """While a bisect runs, starting another (b, u, n), applying or saving a result it has not given yet (a, v)
        and choosing another card (d) are only refused: the key bar leaves them out (x stops it); the state line
        says RUNNING."""
        return not (self.app.bisect.running and action in self.RUNNING_REFUSES)

    def repaint(self) -> None:
        app = self.app
        self.refresh_keys()
        every = app.bisect_all
        self.set_class(every, "-rig")
        job, selected = self._shown(), app.selected_device_id
        card = job.card(selected)
        knob = self._knob()
        unit = (job.unit(selected) if selected else "") or (knob.unit if knob else "")
        if every:
            status = Text(f"ALL CARDS ({', '.join(d.id for d in app.devices)}) at once · table: {selected} (c next)\n")
        else:
            status = Text(f"{selected} · {app.device(selected).label} · {setting_text_short(knob)}\n" if selected
                          else "")
        cur = (card.current if not every else None) or {}
        if job.running:
            status.append("RUNNING ", style="bold reverse")
            if every:
                status.append(" each card's own search, then the whole rig together" if job.current is None else
                              f" the whole rig: {rig_run_what(job.current)} ({rig_run_time(job.current, app.clock())})")
            elif cur:
                status.append(f" {trial_text(cur, unit)}")
                if cur.get("finishing"):
                    status.append(f" · {FINISHING}")
                elif cur.get("eta_s") is not None:
                    status.append(f" · trial ETA {format_duration(cur['eta_s'])}")
                if cur.get("eta_total_s") is not None:
                    status.append(f" · all ≤{format_duration(cur['eta_total_s'])}")
        elif not every and card.failure:
            status.append(f"STOPPED: {card.failure}", style="bold")
        elif job.failure and job.failure.startswith("stopped"):
            status.append(f"STOPPED: {job.failure}", style="bold")
        elif job.failure:  # a refused start (no session to resume...) or an error: nothing was stopped
            status.append(f"ERROR: {job.failure.removeprefix('error: ')}", style="bold")
        elif every and job.outcome is not None:
            status.append(f"FINISHED: {job.outcome.status}")
        elif job.unfinished:
            status.append(f"UNFINISHED: {job.unfinished}", style="bold")
        elif not every and card.trials:
            status.append("FINISHED")
        elif every:
            status.append("idle · b start every card at once · d next target · u resume")
        else:
            status.append("idle · b start · f edit form · u resume a session"
                          + (" · d next card, then ALL CARDS" if len(app.devices) > 1 else ""))
        warnings = card.warnings + (job.warnings if every else ())  # every card: the rig's own too
        if warnings:  # the last one stays in view, on the state's line (a toast said each one whole as it came)
            status.append(self._warning_text(warnings[-1], after=status.plain.rsplit("\n", 1)[-1]))
        self.query_one("#bisect-status", Static).update(status)
        progress = cur.get("progress") or 0.0
        if not card.running:
            progress = 1.0 if card.recommendation is not None or (card.trials and not card.failure
                                                                   and not job.unfinished) else 0.0
        self.query_one("#bisect-progress", ProgressBar).update(progress=progress)
        if every:
            self.query_one("#rig-cards", Static).update(
                Text("\n").join(rig_card_line(job, d.id, selected=d.id == selected) for d in app.devices))
            self.query_one("#rig-attempts", Static).update(rig_attempts_text(job))
        self._show_defaults(knob)
        self._paint_plan(job)
        shown = (job.device_ids or (selected,)) if every else (selected,)
        simulated = any(app.device(d).simulated for d in shown if d)
        if self._paint_table(card, unit, selected) and not every:
            self.query_one("#bisect-result", Static).update(
                recommendation_text(card.recommendation, unit, simulated=simulated))
        elif every:
            self.query_one("#bisect-result", Static).update(rig_result_text(job, simulated=simulated))

    def _warning_text(self, warning: str, *, after: str) -> Text:
        """` · warning: ...` cut to what is left of the status's last line: the status never takes another row
        (at 80x24 that row would push the SIMULATED note off the screen)."""
        room = self.query_one("#bisect-status", Static).content_region.width - len(after)
        text = Text(f" · warning: {for_people(warning, here='bisect')}", style="bold yellow")
        text.truncate(max(room, 0), overflow="ellipsis")
        return text

    def _paint_plan(self, job: BisectState) -> None:
        """Before a start: what b runs with the form as it is (trials at most, the confirmation, the time at
        most), by the core rule the running bisect's ETA uses; a form it would refuse says which field."""
        device_id = self.app.selected_device_id
        text = ""
        if not job.running and device_id:
            knob, values, every = self._knob(), self._form_values(), self.app.bisect_all
            key = (device_id, values, knob, every, id(job.outcome))  # the unsafe list changes only with a bisect
            if self._plan.ask(key):
                self._file_work(partial(_plan_read, self._plan, key, self.app.backend, device_id, values, knob, every))
            text = self._plan.value  # until the worker answers, the last plan line
        plan = self.query_one("#bisect-plan", Static)
        plan.update(_fit(text, plan.size.width or LINE_WIDTH))  # a refusal is cut; b says it in full

    def _paint_table(self, state: CardState, unit: str, device_id: str | None) -> bool:
        """The trial table, its detail line and the efficiency plot, when they changed. True: repainted."""
        painted = (state.trials, state.recommendation, unit, device_id)
        if self._painted is not None and all(a is b for a, b in zip(painted, self._painted, strict=True)):
            return False
        self._painted = painted
        table = self.query_one("#bisect-trials", DataTable)
        cursor, following = table.cursor_row, table.cursor_row >= table.row_count - 1
        table.clear()
        for row in state.trials:
            table.add_row(*trial_cells(row, unit))
        if state.trials:  # follow the newest trial unless the user moved up to read an older one
            table.move_cursor(row=len(state.trials) - 1 if following else cursor)
        self._paint_detail()
        done = sorted((r for r in state.trials if r.get("tok_per_j") is not None and r.get("setting") is not None),
                      key=lambda r: r["setting"])
        powered = [r for r in done if r.get("power_w") is not None]
        self.query_one("#plot-efficiency", HistoryPlot).show_series(
            [("tok/J", [r["setting"] for r in done], [r["tok_per_j"] for r in done], "left"),
             ("W", [r["setting"] for r in powered], [r["power_w"] for r in powered], "right")],
            title=f"tok/J and W vs setting ({unit})" + (" SIMULATED" if self.app.simulated else ""))
        return True


def _plan_read(into: Asked[str], key: tuple, backend: Backend, device_id: str, values: dict[str, str],
               knob: Knob | None, every: bool) -> Read[str]:
    """In the file worker: the plan line (tuner.actions.bisect.bisect_estimate reads the card's unsafe list)."""
    from tuner.actions.bisect import bisect_estimate

    try:
        params = parse_form(values, unit=knob.unit if knob else "")
        text = plan_text(bisect_estimate(backend, device_id, params), every=every)
    except TunerError as e:
        text = f"plan: {for_people(e.message, here=BISECT)}"
    return Read(into, key, text)


def plan_text(estimate: BisectEstimate, *, every: bool = False) -> str:
    """`≤24 trials · confirm 30m · ≤2h25m`: one card's new search at most (ALL CARDS: each card's, then the rig)."""
    head = "each card " if every else "plan "
    return (f"{head}≤{estimate.trials} trials, confirm {duration_text(estimate.confirm_s)}, "
            f"≤{format_duration(estimate.duration_s)}")


def setting_text_short(knob: Knob | None) -> str:
    if knob is None:
        return "setting unknown"
    return f"now {knob.current:+d} {knob.unit}" + (" (STOCK)" if knob.current == knob.stock else " (MODIFIED)")


SIMULATED_NOTE = "SIMULATED card: the simulator's power and the CPU engine's tok/s, not a real gain"


def recommendation_text(rec: Recommendation | None, unit: str, *, simulated: bool = False) -> Text:
    """The result with every figure labelled, rounded and in its unit; the efficiency with the setting it was
    measured at; on a simulated card, the same caveat the CLI prints."""
    if rec is None:
        return Text("")
    text = Text("RECOMMENDED ", style="bold reverse")
    text.append(f" {rec.setting:+d} {unit}")
    for value, label in ((rec.confirmed, "confirmed"), (rec.first_failure, "first fail")):
        if value is not None:
            text.append(f" · {label} {value:+d} {unit}")
    text.append(f" · margin {rec.margin} {unit}  (a: apply, v: save as profile)")
    gain = rec.efficiency_gain_pct
    if gain is not None and rec.baseline_tok_per_j is not None and rec.tuned_tok_per_j is not None:
        at = _cell(rec.measured_at, "{:+d} " + unit)
        text.append(f"\ntok/J {rec.baseline_tok_per_j:.2f} at stock, {rec.tuned_tok_per_j:.2f} at {at} "
                    f"({gain:+.1f} %)")
        if simulated:
            text.append(f" · {SIMULATED_NOTE}", style="bold")
    if rec.sensitivity == "reduced":  # the user opted in to the weaker comparison: say what it costs
        text.append(f"\n{detection_rate_text()}", style="bold")
    return text


LINE_WIDTH = 78  # one line per card at 80 columns (the widget's padding included)


def _fit(text: str, width: int = LINE_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def rig_card_line(rig: BisectState, device_id: str, *, selected: bool) -> Text:
    """One card of the rig on one line: its trial and progress, its own result, then its final setting."""
    from tuner.app.state import bisect_card_label

    card, unit = rig.card(device_id), rig.unit(device_id)
    line = Text("▶ " if selected else "  ", style="bold" if selected else "")
    line.append(f"{device_id:<6}", style="bold" if selected else "")
    outcome = rig.outcome
    if not rig.running and outcome is not None:
        value = (rig.settings or {}).get(device_id)
        if value is not None:
            body = f"FINAL {value:+d} {unit} (confirmed together)"
        elif outcome.status == "stopped":
            body = "STOPPED, back at stock; u resumes every card"
        else:
            reason = outcome.reasons.get(device_id) or card.failure or "no setting"
            body = f"NONE: {for_people(str(reason))}"  # the core words it for the CLI (--resume)
    elif rig.running and rig.current is not None:
        body = bisect_card_label(rig, device_id)
    elif card.running and card.current:
        cur = card.current
        body = f"{trial_text(cur, unit)} · {int(100 * (cur.get('progress') or 0))} %"
        if cur.get("finishing"):
            body += f" · {FINISHING}"
        if cur.get("eta_total_s") is not None:
            body += f" · all ≤{format_duration(cur['eta_total_s'])}"
    elif card.recommendation is not None:
        body = f"own result {card.recommendation.setting:+d} {unit}" + (
            "; waiting for the other cards" if rig.running else "")
    elif card.failure:
        body = f"STOPPED: {card.failure}" if card.failure.startswith("stopped") else f"FAILED: {card.failure}"
    else:
        body = "starting" if rig.running else "idle"
    line.append(_fit(body, LINE_WIDTH - len(line.plain)))
    return line


def _settings_text(settings: Mapping[str, int] | None, rig: BisectState) -> str:
    return ", ".join(f"{d} {v:+d} {rig.unit(d)}" for d, v in (settings or {}).items())


def rig_run_what(current: Mapping[str, Any]) -> str:
    return ("recording every card's reference at stock" if current.get("phase") == "rig-baseline" else
            f"confirmation attempt {current.get('attempt')}")


def rig_run_time(current: Mapping[str, Any], now_s: float) -> str:
    """`1m05s of 2m00s` (the run's nominal length; the rig trial reports no progress of its own)."""
    total = format_duration(current.get("duration_s") or 0)
    started_s = current.get("started_s")
    if started_s is None:
        return total
    return f"{format_duration(max(0.0, now_s - started_s))} of {total}"


def rig_attempt_line(rig: BisectState, row: Mapping[str, Any]) -> str:
    verdict = str(row.get("verdict") or "").upper()
    if row.get("phase") == "rig-baseline":
        head = f"rig recording at stock: {verdict}"
    else:
        head = f"rig attempt {row.get('attempt')} ({_settings_text(row.get('settings'), rig)}): {verdict}"
    if row.get("verdict") == "fail":
        why = row.get("machine_event") or "; ".join(f"{d}: {r}" for d, r in (row.get("reasons") or {}).items())
        if row.get("pinned"):
            why = f"pinned on {', '.join(row['pinned'])}" + (f" ({why})" if why else "")
        head += f" · {why}" if why else ""
        if row.get("backed_off"):
            head += f" → next {_settings_text(row['backed_off'], rig)}"
    return _fit(head)


def rig_attempts_text(rig: BisectState) -> Text:
    """The whole-rig runs so far, the last two (the recording at stock, then each confirmation attempt)."""
    if not rig.attempts:
        return Text("rig: each card's search first, then every card at its setting at once" if rig.running
                    else "")
    return Text("\n".join(rig_attempt_line(rig, row) for row in rig.attempts[-2:]))


def rig_result_text(rig: BisectState, *, simulated: bool) -> Text:
    """The final settings, confirmed together, with the keys that apply or save them."""
    if rig.running or rig.outcome is None:
        return Text("")
    if not rig.settings:
        return Text("no settings confirmed together (see each card's line)", style="bold")
    text = Text("RIG RESULT ", style="bold reverse")
    text.append(f" {_settings_text(rig.settings, rig)}  (a apply all, v save)")  # one line at 80 with 3 cards
    if simulated:
        text.append(f"\n{SIMULATED_NOTE}", style="bold")
    return text
