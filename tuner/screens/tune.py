"""Screen 2: set the knob by hand (keep-or-revert), reset to stock, and stress the current setting.

A stress run compares every step with this card's stock reference (tuner.actions.stress). When there is none and
the card is not at stock, `s` asks first: run without the comparison (said on screen and in the summary), or
cancel and record one (r resets to stock, s records it first). Nothing starts before the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Log, Static

from tuner.actions import parameters
from tuner.actions.stress import NoStockReference
from tuner.app.jobs import MANUAL_DETECTORS, stress_question
from tuner.app.state import running_label
from tuner.core.models import Knob, Mode
from tuner.screens.base import TunerScreen
from tuner.screens.dialogs import ConfirmDialog
from tuner.widgets.device_panel import setting_text
from tuner.widgets.history_plot import HistoryPlot

PRESETS = tuple(sorted(parameters.PRESET.choices, key=lambda preset: preset != "tiny"))  # p cycles from the quick one
MODES = parameters.MODE.choices
DETECTORS = tuple(name for name, _state in MANUAL_DETECTORS)  # every detector a run shows, in the job's order


# what the reference detector's state means, said on the status's third line (the log scrolls)
REFERENCE_NOTES = {
    "OFF": "reference comparison OFF: you chose to run without a stock reference (weaker checks only)",
    "NONE": "reference comparison OFF: the stock reference was not recorded",
    "recording": "recording this card's stock reference first, at stock (kept for later runs)",
}


@dataclass
class StressChecked(Message):
    """The worker's answer to `s`: start (`question` None) or ask first."""

    device_id: str
    preset: str
    mode: str
    question: NoStockReference | None


def reference_question(problem: NoStockReference) -> str:
    """The dialog's words for a NoStockReference (tuner.actions.stress): what would be off, and the way to avoid it."""
    return (f"{problem.device_id} has no stock reference for {problem.workload} ({problem.why}), and the card is "
            f"at {problem.setting:+d} {problem.unit}, not at stock. This run could not compare its steps with "
            "stock: the check that catches silent miscomputation would be OFF, leaving the canary, GEMM, "
            "non-finite, device-error, watchdog and kernel-log checks.\n\n"
            "Run without it? To record one instead: r resets to stock, s records it first, then apply your "
            "setting again.")


def clamp_target(knob: Knob, value: int) -> int:
    """Keep a target inside the knob's range and on the safe side of stock (no overvolt from the UI)."""
    value = max(knob.min, min(knob.max, value))
    return knob.stock if knob.is_overvolt(value) else value


class TuneScreen(TunerScreen):
    TITLE = "Tune"
    DEFAULT_CSS = """
    TuneScreen #tune-head { height: 3; padding: 0 1; }
    TuneScreen #stress-status { height: auto; min-height: 3; padding: 0 1; }
    TuneScreen #stress-plots { height: 1fr; min-height: 6; }
    TuneScreen #stress-log { height: 6; border-top: solid $primary; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        # one footer item per pair of arrow keys; the palette still lists each by name (screen_commands)
        Binding("left", "move(-1)", "Step", priority=True, key_display="←/→", tooltip="-1 step", id="tune.down"),
        Binding("right", "move(1)", "+1 step", show=False, priority=True, id="tune.up"),
        Binding("pagedown", "move(-5)", "5 steps", priority=True, key_display="PgDn/PgUp", tooltip="-5 steps",
                id="tune.down5"),
        Binding("pageup", "move(5)", "+5 steps", show=False, priority=True, id="tune.up5"),
        Binding("a", "apply", "Apply", id="tune.apply"),
        Binding("r", "reset", "Reset to stock", id="tune.reset"),
        Binding("s", "toggle_stress", "Stress on/off", id="tune.stress"),
        Binding("m", "cycle_mode", "Mode", id="tune.mode"),
        Binding("p", "cycle_preset", "Preset", id="tune.preset"),
        Binding("d", "next_device", "Next card", id="tune.device"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.target: int | None = None
        self.preset, self.mode = PRESETS[0], str(Mode.TRAIN)
        self._log_shown = 0
        self._log_run: int | None = None
        self._seen_setting: tuple | None = None

    def compose_body(self) -> ComposeResult:
        yield Static(id="tune-head")
        yield Static(id="stress-status")
        with Horizontal(id="stress-plots"):
            yield HistoryPlot("loss", x_label="step", id="plot-loss")
            yield HistoryPlot("tok/s", x_label="step", id="plot-toks")
        log = Log(max_lines=500, id="stress-log")
        log.can_focus = False
        yield log

    @property
    def device_id(self) -> str | None:
        return self.app.selected_device_id

    # --- actions -------------------------------------------------------------------------------------------------
    def action_move(self, steps: int) -> None:
        knob = self._knob()
        if knob is None:
            return
        base = knob.current if self.target is None else self.target
        self.target = clamp_target(knob, base + steps * knob.step)
        self.repaint()

    def action_apply(self) -> None:
        knob = self._knob()
        if knob is None or self.device_id is None or self.target is None or self.target == knob.current:
            self.notify("move the setting with the arrow keys first, then apply", severity="warning")
            return
        self.app.apply_setting(self.device_id, self.target)

    def action_reset(self) -> None:
        if self.device_id:
            self.target = None
            self.app.reset_to_stock(self.device_id)

    def action_toggle_stress(self) -> None:
        if self.app.stress.running:
            self.app.stop_stress()
        elif self.device_id:
            self._check_stress(self.device_id, self.preset, str(self.mode))

    @work(thread=True, exit_on_error=False, group="stress-check", name="stress-check")
    def _check_stress(self, device_id: str, preset: str, mode: str) -> None:
        """Off the UI thread (it reads the card and the reference cache): may this run start without asking?"""
        try:
            question = stress_question(self.app.backend, device_id, preset=preset, mode=mode)
        except Exception:  # noqa: BLE001 - the job meets the same problem and reports it
            question = None
        self.post_message(StressChecked(device_id, preset, mode, question))

    def on_stress_checked(self, message: StressChecked) -> None:
        if message.question is None:
            self.app.start_stress(message.device_id, message.preset, message.mode)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.app.start_stress(message.device_id, message.preset, message.mode, without_reference=True)
            else:
                self.notify("not started: record the stock reference first (r, then s), then apply your setting "
                            "again")

        self.app.push_screen(ConfirmDialog(reference_question(message.question), yes="Run without it",
                                           no="Cancel"), answered)

    def action_cycle_mode(self) -> None:
        self.mode = MODES[(MODES.index(self.mode) + 1) % len(MODES)]
        self.repaint()

    def action_cycle_preset(self) -> None:
        self.preset = PRESETS[(PRESETS.index(self.preset) + 1) % len(PRESETS)]
        self.repaint()

    def offers(self, action: str) -> bool:
        """While a job runs on the card, apply and reset are refused (stopping it resets the card), and so is a
        stress run while any job runs (one at a time); the screen says why (`_paint_stress`). `s` stops a stress run."""
        app = self.app
        if action in ("apply", "reset"):
            return self.device_id is None or not app.job_on(self.device_id)
        if action == "toggle_stress":
            return app.stress.running or not app.busy
        return True

    # --- drawing -------------------------------------------------------------------------------------------------
    def repaint(self) -> None:
        app = self.app
        knob = self._knob()
        seen = None if knob is None else (self.device_id, knob.current)
        if seen != self._seen_setting:  # applied, reverted or reset: the target starts from the card again
            self._seen_setting, self.target = seen, None
        device = app.device(self.device_id) if self.device_id else None
        head = Text()
        if device is None:
            head.append("no devices")
        else:
            head.append(f"{device.id} · {device.label}\n", style="bold")
            head.append(f"card now: {setting_text(knob)}\n")
            if knob is not None:
                target = knob.current if self.target is None else self.target
                marker = "" if target == knob.current else "  (not applied: press a)"
                head.append(f"target {target:+d} {knob.unit}{marker}   ", style="bold")
                head.append(f"range {knob.min:+d}..{knob.max:+d} step {knob.step} {knob.unit}")
        self.query_one("#tune-head", Static).update(head)
        self._paint_stress()
        self.refresh_keys()

    def _paint_stress(self) -> None:
        stress = self.app.stress
        status = Text()
        if stress.running:
            status.append(f"stress RUNNING on {stress.device_id} ({stress.preset}/{stress.mode})", style="bold")
        else:
            status.append(f"stress idle · preset {self.preset} (p) · mode {self.mode} (m)")
            if stress.verdict:
                status.append(f" · last: {stress.verdict}")
        bisect = self.app.bisect
        if bisect.running and self.device_id is not None:
            label = running_label(stress, bisect, self.device_id)
            why = (f"{label} runs on this card: a, r and s wait" if self.device_id in bisect.device_ids
                   else f"a bisect runs ({', '.join(bisect.device_ids)}): s waits")
            status.append(f"\n{why}; stop it on the Bisect screen (3, x)", style="bold")
        status.append("\ndetectors: ")
        for name in DETECTORS:
            state = stress.detector(name)
            status.append(f"{name} ")
            status.append(state, style="bold reverse" if state.startswith("FAULT") or state == "OFF" else "")
            status.append("  ")
        note = REFERENCE_NOTES.get(stress.detector("reference"))
        if note:
            status.append(f"\n{note}", style="bold")
        self.query_one("#stress-status", Static).update(status)
        steps = list(stress.steps)
        xs = [s for s, _, _ in steps]
        self.query_one("#plot-loss", HistoryPlot).show(xs, [loss for _, loss, _ in steps])
        self.query_one("#plot-toks", HistoryPlot).show(xs, [tok for _, _, tok in steps])
        log = self.query_one("#stress-log", Log)
        if self._log_run != stress.run:  # a new run: start the log afresh
            self._log_run, self._log_shown = stress.run, 0
            log.clear()
        new = stress.log_written - self._log_shown
        if new > 0:
            log.write_lines(list(stress.log)[-min(new, len(stress.log)):])
            self._log_shown = stress.log_written
