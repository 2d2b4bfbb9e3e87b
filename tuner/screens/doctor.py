"""Screen 5: the environment checks with their remedies (run in a thread; the torch probe takes seconds)."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import LoadingIndicator, Static

from tuner.screens.base import TunerScreen

if TYPE_CHECKING:
    from tuner.actions.doctor import Check

STATUS_MARK = {"ok": "[ OK ]", "warn": "[WARN]", "fail": "[FAIL]", "info": "[INFO]"}
STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "info": "cyan"}
INDENT = " " * 7  # under the text after the mark: a wrapped line never starts under the mark
REMEDY = "-> "


def _hanging(first: str, text: str, width: int, indent: str) -> list[str]:
    """`text` wrapped to `width` after `first` (the mark, `-> `): the following lines start under the text."""
    # a group name (systemd-journal) or a path is never split: it is what the user types
    lines = textwrap.wrap(text, max(10, width - len(indent)), break_on_hyphens=False, break_long_words=False) or [""]
    return [first + lines[0], *(indent + line for line in lines[1:])]


def checks_text(checks: list[Check], width: int = 80) -> Text:
    """The verdict, then each check (`[FAIL] kernel log: ...`, its remedy under it); a long line wraps under its
    own text, not under the mark, at `width` columns."""
    text = Text()
    failed = sum(c.status == "fail" for c in checks)
    if checks:  # the verdict first, as `tuner doctor`'s exit code gives it
        text.append(f"NOT READY: {failed} check(s) failed\n" if failed else "READY: no check failed\n",
                    style="bold")
    for check in checks:
        mark = STATUS_MARK.get(check.status, f"[{check.status}]")
        lines = _hanging(" " * len(mark) + " ", f"{check.name}: {check.detail}", width, INDENT)
        text.append(mark, style=STATUS_STYLE.get(check.status, ""))
        text.append("\n".join(lines)[len(mark):] + "\n")
        if check.remedy and check.status != "ok":
            remedy = _hanging(INDENT + REMEDY, check.remedy, width, INDENT + " " * len(REMEDY))
            text.append("\n".join(remedy) + "\n", style="italic")
    if not checks:
        text.append("no checks ran (see the notification)")
    return text


class DoctorScreen(TunerScreen):
    TITLE = "Doctor"
    DEFAULT_CSS = """
    DoctorScreen #doctor-loading, DoctorScreen #doctor-body { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("r", "rerun", "Run again", id="doctor.rerun")]

    def compose_body(self) -> ComposeResult:
        yield LoadingIndicator(id="doctor-loading")
        with VerticalScroll(id="doctor-body"):
            yield Static(id="doctor-checks")

    def on_mount(self) -> None:
        self._shown: list[Check] | None = None
        if self.app.doctor_checks is None:
            self.app.run_doctor()

    def action_rerun(self) -> None:
        self.app.run_doctor()

    def on_resize(self, event: events.Resize) -> None:
        self._shown = None  # wrapped again at the new width
        self.repaint()

    def repaint(self) -> None:
        checks = self.app.doctor_checks
        loading = checks is None
        self.query_one("#doctor-loading").display = loading
        self.query_one("#doctor-body").display = not loading
        if checks is not None and checks is not getattr(self, "_shown", None):
            self._shown = checks
            width = self.size.width - 2  # a vertical scrollbar may take two columns
            self.query_one("#doctor-checks", Static).update(checks_text(checks, width))
