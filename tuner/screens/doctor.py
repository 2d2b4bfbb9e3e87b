"""Screen 5: the environment checks with their remedies (run in a thread; the torch probe takes seconds)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import LoadingIndicator, Static

from tuner.screens.base import TunerScreen

STATUS_MARK = {"ok": "[ OK ]", "warn": "[WARN]", "fail": "[FAIL]", "info": "[INFO]"}
STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "info": "cyan"}


def checks_text(checks: list) -> Text:
    text = Text()
    failed = sum(c.status == "fail" for c in checks)
    if checks:  # the verdict first, as `tuner doctor`'s exit code gives it
        text.append(f"NOT READY: {failed} check(s) failed\n" if failed else "READY: no check failed\n",
                    style="bold")
    for check in checks:
        text.append(STATUS_MARK.get(check.status, f"[{check.status}]"), style=STATUS_STYLE.get(check.status, ""))
        text.append(f" {check.name}: {check.detail}\n")
        if check.remedy and check.status != "ok":
            text.append(f"       -> {check.remedy}\n", style="italic")
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
        super().on_mount()
        self._shown = None
        if self.app.doctor_checks is None:
            self.app.run_doctor()

    def action_rerun(self) -> None:
        self.app.run_doctor()

    def repaint(self) -> None:
        checks = self.app.doctor_checks
        loading = checks is None
        self.query_one("#doctor-loading").display = loading
        self.query_one("#doctor-body").display = not loading
        if not loading and checks is not self._shown:
            self._shown = checks
            self.query_one("#doctor-checks", Static).update(checks_text(checks))
