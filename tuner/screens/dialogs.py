"""Modal dialogs. Each has a safe default (Revert, No, Cancel) that Enter and Escape choose."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from tuner.widgets.key_bar import KeyBar

if TYPE_CHECKING:
    from tuner.actions.keep_or_revert import PendingChange
    from tuner.actions.profile_apply import RigChange

DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 72; max-width: 100%; height: auto; border: thick $primary; background: $surface; padding: 0 1;
}}
{name} Horizontal {{ height: auto; align: center middle; }}
{name} Button {{ margin: 0 1; }}
{name} Input {{ margin: 0 0 1 0; }}
{name} > KeyBar {{ min-height: 3; content-align-vertical: bottom; }}
"""
# a dialog's key bar covers the screen's (at most three lines) whole: its keys mean other things under a dialog


def default_path(where: Callable[[], Path]) -> tuple[str, str]:
    """An export's default in full (tuner.actions.exports), and what the prompt adds: with the current directory
    gone (removed under the UI by another shell) there is no default in it, so none is filled in and it says why."""
    try:
        return str(where()), ""
    except FileNotFoundError:
        return "", " (the current directory is gone: give a full path)"


def if_answered(then: Callable[[Any], object]) -> Callable[[Any], None]:
    """A dialog's callback that runs `then(answer)` only on a yes or a line typed (not on a no, Escape, a blank)."""

    def answered(answer: Any) -> None:
        if answer:
            then(answer)

    return answered


class ConfirmDialog(ModalScreen[bool]):
    """Yes/No; the default (focused, Escape) is No."""

    DEFAULT_CSS = DIALOG_CSS.format(name="ConfirmDialog")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "choose(False)", "No"), Binding("y", "choose(True)", "Yes"),
        Binding("n", "choose(False)", "No"),
    ]

    def __init__(self, question: str, *, yes: str = "Yes", no: str = "No") -> None:
        super().__init__()
        self.question, self.yes, self.no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical():
            # it quotes names, serials and reasons from files and drivers
            yield Static(self.question, markup=False, id="question")
            with Horizontal():
                yield Button(f"{self.yes} (y)", id="yes", variant="error", action="screen.choose(True)")
                yield Button(f"{self.no} (n)", id="no", variant="primary", action="screen.choose(False)")
        yield KeyBar([b for b in self.BINDINGS if isinstance(b, Binding)])  # over the screen's own key bar

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def action_choose(self, yes: bool) -> None:
        self.dismiss(yes)


class KeepOrRevertDialog(ModalScreen[bool]):
    """A setting was applied (one card, or every card of a rig profile as one change): keep it, or it reverts
    when the countdown ends. Revert is the default."""

    DEFAULT_CSS = DIALOG_CSS.format(name="KeepOrRevertDialog")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "choose(False)", "Revert"), Binding("r", "choose(False)", "Revert"),
        Binding("k", "choose(True)", "Keep"),
    ]

    def __init__(self, pending: PendingChange | RigChange) -> None:
        super().__init__()
        self.pending = pending
        self._timed_out = False  # the countdown ended while another screen was on top: already answered Revert

    def compose(self) -> ComposeResult:
        from tuner.app.jobs import keep_question

        with Vertical():
            yield Static(keep_question(self.pending), id="keep-question")
            yield Label(id="countdown")
            with Horizontal():
                yield Button("Revert (r)", id="revert", variant="primary", action="screen.choose(False)")
                yield Button("Keep (k)", id="keep", variant="warning", action="screen.choose(True)")
        # over the screen's own key bar, whose `r` (Reset to stock) means Revert here
        yield KeyBar([b for b in self.BINDINGS if isinstance(b, Binding)])

    def on_mount(self) -> None:
        self.query_one("#revert", Button).focus()
        self._tick()
        self.set_interval(0.25, self._tick, name="countdown")

    def _tick(self) -> None:
        if not self.is_attached:
            return
        # not pending: reverted by the App before a Ctrl-Z stopped the process (TunerApp.make_safe_to_stop)
        over = self.pending.expired() or not self.pending.pending
        if self.app.screen is not self:  # the palette or the quit question on top: the countdown still ends on time
            if over and not self._timed_out:
                self._timed_out = True
                self._result_callbacks[-1](False)  # Revert now; this dialog closes once it is on top again
            return
        if self._timed_out:
            self.app.pop_screen()  # answered already (a second answer would settle a later change)
            return
        if over:
            self.dismiss(False)
            return
        left_s = max(0, int(self.pending.seconds_left() + 0.999))
        self.query_one("#countdown", Label).update(f"Reverting in {left_s} s unless you keep it.")

    def action_choose(self, keep: bool) -> None:
        self.dismiss(keep)


class TextInputDialog(ModalScreen[str | None]):
    """Ask for one line (a profile name, a path). Escape cancels."""

    DEFAULT_CSS = DIALOG_CSS.format(name="TextInputDialog")
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, prompt: str, *, value: str = "", placeholder: str = "") -> None:
        super().__init__()
        self.prompt, self.value, self.placeholder = prompt, value, placeholder

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.prompt)
            yield Input(value=self.value, placeholder=self.placeholder, id="text")
            with Horizontal():
                yield Button("OK", id="ok", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(self.query_one(Input).value.strip() or None if event.button.id == "ok" else None)

    def action_cancel(self) -> None:
        self.dismiss(None)
