"""The Textual UI: composition root. Builds the App on a backend, owns the long jobs, and keeps the card safe.

Screens (tuner/screens) only draw and ask the App to act; the App reaches hardware only inside thread workers,
which post messages back (tuner/screens/messages.py). Stress and bisect runs belong to the App, so switching
screens never stops them; quitting while one runs asks first, then stops it and resets the card to stock.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.drivers.linux_driver import LinuxDriver
from textual.message import Message
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from tuner.actions import other_tools
from tuner.actions.bisect import consent_question, prepare_bisect
from tuner.actions.context import Context
from tuner.actions.profile_apply import ProfileApply, plan_profile_apply, plan_rig_apply, prepare_rig_apply
from tuner.actions.reset import reset_device
from tuner.actions.setting import SetRequest, prepare_setting
from tuner.app import jobs
from tuner.app.hangup import HangUpGuard
from tuner.app.state import BisectState, DeviceHistory, StressState
from tuner.app.terminal_driver import HangUpSafeDriver
from tuner.app.words import SCREENS_IN_ORDER, describe_error, for_people, job_name, short_title
from tuner.backends.base import Backend
from tuner.core import exit_codes
from tuner.core.durations import format_duration
from tuner.core.errors import TunerError, UsageError
from tuner.profiles.schema import Profile
from tuner.screens import messages as msg
from tuner.screens.base import TunerScreen
from tuner.screens.dashboard import DashboardScreen
from tuner.screens.dialogs import ConfirmDialog, KeepOrRevertDialog, if_answered
from tuner.tuning.events import TrialWarning
from tuner.tuning.job import BisectOutcome, BisectParams

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel
    from textual.widget import AwaitMount

    from tuner.actions.boot_service import BootServiceStatus
    from tuner.actions.keep_or_revert import PendingChange
    from tuner.actions.profile_apply import RigChange
    from tuner.app.palette import TunerCommands
    from tuner.core.models import DeviceInfo, Knob, Telemetry

SAMPLE_INTERVAL_S = 1.0
OVERDUE_S = 5.0  # a change still pending this long past its countdown: the event loop is stuck, revert it anyway


def screen_class(mode: str) -> type[Screen]:
    """The class of `mode`'s screen, tuner.screens.<mode>.<Mode>Screen, imported on its first use: its first visit
    (the first frame only needs the dashboard) or the palette (it lists every screen's keys)."""
    return getattr(importlib.import_module(f"tuner.screens.{mode}"), f"{mode.capitalize()}Screen")


def _lazy_screen(mode: str) -> Callable[[], Screen]:
    """A MODES entry that imports its screen on first visit."""
    return lambda: screen_class(mode)()


ERROR_PREFIX = "error: "  # a job's summary when it raised (a refused start included)


def ended_notice(summary: str) -> dict:
    """A job's end as a notice: an error (the job raised) is one ERROR toast that stays 10 s, said once."""
    return {"severity": "error", "timeout": 10} if summary.startswith(ERROR_PREFIX) else {}


def _reverted(outcome: str, change: PendingChange | RigChange) -> str:
    """The outcome of a revert, with why a card went to stock instead of its previous value (as the CLI says it)."""
    one = len(change.device_ids) == 1
    notes = "; ".join(note if one else f"{d}: {note}" for d, note in change.restore_notes.items())
    return f"{outcome} ({notes})" if notes else outcome


def _palette() -> type[TunerCommands]:
    """The command palette's provider, imported when the palette first opens (not for the first frame)."""
    from tuner.app.palette import TunerCommands

    return TunerCommands


SEVERITY_WORDS = {"error": "ERROR", "warning": "WARNING"}  # a notice's kind in words, not only its colour


class TunerApp(App[int]):
    TITLE = "tuner"
    # notices: one line of padding less than Textual's (a toast is 3 rows, not 5, at 80x24); each screen keeps them
    # above its key bar (tuner.screens.base), and switching screens clears them (they were about the screen left)
    # which field has focus, seen without colour (NO_COLOR, a monochrome terminal), on every screen's forms: a
    # framed field's frame turns heavy; a one-line (compact) field is underlined, and reversed while it has focus;
    # a table's cursor row is reversed while the table has focus (in colour its background says so already)
    CSS = """
    Toast { padding: 0 1; }
    Input:focus { border: heavy $accent; }
    Input.-textual-compact { text-style: underline; }
    Input.-textual-compact:focus { border: none; text-style: bold reverse; }
    DataTable:nocolor:focus > .datatable--cursor { text-style: bold reverse; }
    """
    MODES: ClassVar[dict[str, str | Callable[[], Screen]]] = {  # the dashboard: the first frame needs it
        mode: DashboardScreen if mode == "dashboard" else _lazy_screen(mode)
        for _key, mode, _title in SCREENS_IN_ORDER
    }
    COMMANDS = App.COMMANDS | {_palette}  # every action of every screen, by name, with its key
    DEFAULT_MODE = "dashboard"
    BINDINGS: ClassVar[list[BindingType]] = [
        *[
            Binding(key, f"switch_mode('{mode}')", short_title(title)[:6], id=f"screen.{mode}")
            for key, mode, title in SCREENS_IN_ORDER
        ],
        Binding("q", "request_quit", "Quit", id="app.quit"),
        Binding("ctrl+q", "request_quit", "Quit", show=False, priority=True, id="app.quit_ctrl"),
    ]

    def __init__(
        self,
        ctx: Context | None = None,
        *,
        backend: Backend | None = None,
        clock: Callable[[], float] = time.monotonic,
        sample_interval_s: float | None = SAMPLE_INTERVAL_S,
        doctor: Callable[[], list] | None = None,
        bisect_options: dict | None = None,
        stress_options: dict | None = None,
        verify_duration_s: float = jobs.VERIFY_DURATION_S,
    ) -> None:
        super().__init__()
        assert backend is not None or ctx is not None, "TunerApp needs a backend or a ctx that opens one"
        self.backend: Backend = backend if backend is not None else ctx.backend  # type: ignore[union-attr]  # asserted
        self.ctx = ctx
        self.clock = clock  # monotonic seconds: keep-or-revert countdowns
        self.sample_interval_s = sample_interval_s
        self._doctor = doctor
        self.verify_duration_s = verify_duration_s
        self._bisect_options = bisect_options or {}  # extra BisectJob keywords (tests: a fake engine)
        self._stress_options = stress_options or {}  # extra StressJob keywords (tests: a short reference)
        self.devices = self.backend.devices()
        self.histories: dict[str, DeviceHistory] = {d.id: DeviceHistory() for d in self.devices}
        self.stress = StressState()
        self.bisect = BisectState()  # of one card, or of every card at once (the Bisect screen's ALL CARDS target)
        self.bisect_all = False  # the Bisect screen targets every card at once
        self.pending: PendingChange | RigChange | None = None  # the PendingChange waiting for keep-or-revert, if any
        self.doctor_checks: list | None = None
        self.boot_status: BootServiceStatus | None = None  # read in a worker (systemctl may be slow)
        self.selected_device_id = self.devices[0].id if self.devices else None
        self._stress_job: jobs.StressJob | jobs.VerifyJob | None = None
        self._bisect_job: jobs.BisectRunner | None = None
        self._bisect_before = BisectState()  # what the Bisect screen showed before the start in progress
        # leaving (quit confirmed, hang-up): a job that ends now stays known, so make_safe still resets its cards
        # and says how to resume its session (a fast stop used to end it before make_safe ran, silently)
        self._leaving = False
        # stopping (SIGTSTP): from make_safe_to_stop until back from the stop, nothing new goes on a card
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.hung_up = False
        # leaving safely from any thread (tuner.app.hangup): make_safe runs once, whoever asks first; the setting
        # workers hold `_writing` while they write, so make_safe never races a write half-way, and a change a
        # worker applied is known (`_unannounced`) before the event loop hears of it (it may never: a hang-up)
        self.hang_up_guard: HangUpGuard | None = None
        self._made_safe: list[str] | None = None
        self._made_safe_lock = threading.Lock()
        self._writing = threading.Lock()
        self._unannounced: list = []
        self._overdue_since: tuple[object, float] | None = None  # (change, when revert_overdue first saw it due)
        self._last_sampler_error: str | None = None
        self._sample_again = False
        self._sampling = False  # a sample is in flight (sample_now)
        self._on_kept: Callable[[], None] | None = None

    # --- notices ------------------------------------------------------------------------------------------------
    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None,
               markup: bool = False) -> None:
        """A toast whose kind is also a word (ERROR, WARNING) above the text, so NO_COLOR loses nothing. The
        text is never markup (screens' `notify` asks for it by default): a card's `[SIMULATED]` or a path in
        brackets is shown as it is. It speaks the UI, from the screen it is shown on (tuner.app.words: the core's
        `--resume` is `u` here, `--floor` the form's floor field)."""
        super().notify(for_people(message, here=self.current_mode), title=title or SEVERITY_WORDS.get(severity, ""),
                       severity=severity, timeout=timeout, markup=False)

    def switch_mode(self, mode: str) -> AwaitMount:
        """Another screen: the notices of the one left go with it (they said something about what it showed)."""
        if mode != self.current_mode:
            self.clear_notifications()
        return super().switch_mode(mode)

    # --- life cycle ---------------------------------------------------------------------------------------------
    def on_mount(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.ctx is not None:  # backend notes (the helper put a card back) from any thread: a notification
            self.ctx.notice = self._note_from_any_thread
        if self._leaving:  # hung up before the loop was known (the guard has made the cards safe): leave now
            self.call_later(self.hang_up)
        if any(history.knob is None for history in self.histories.values()):
            self.sample_now()
        if self.sample_interval_s:
            self.set_interval(self.sample_interval_s, self.sample_now, name="sampler")

    @property
    def simulated(self) -> bool:
        return any(d.simulated for d in self.devices)

    def device(self, device_id: str) -> DeviceInfo:
        return next(d for d in self.devices if d.id == device_id)

    def select_device(self, step: int) -> None:
        ids = [d.id for d in self.devices]
        if ids:
            self.selected_device_id = ids[(ids.index(self.selected_device_id) + step) % len(ids)]

    def jobs_running(self) -> list[str]:
        running = []
        if self.stress.running:
            running.append(f"a stress run on {self.stress.device_id}")
        ids = self.bisect.device_ids
        if self.bisect.running:
            running.append(f"an auto-bisect on {ids[0]}" if len(ids) == 1 else
                           f"an auto-bisect of every card ({', '.join(ids)})")
        if self.pending is not None:
            running.append(f"an unconfirmed setting on {', '.join(self.pending.device_ids)}")
        return running

    # --- telemetry ----------------------------------------------------------------------------------------------
    def sample_now(self) -> None:
        """Read every card now. One sample at a time: while one is in flight (it may have read the card before a
        change), another is queued to follow it, so the screen always ends on a read made after the change."""
        # in flight until its sample is handled here, not until Textual marks the worker finished: a worker's thread
        # can still be running after its sample was handled, and a follow-up queued then would never start
        if self._sampling:
            self._sample_again = True
            return
        self._sampling = True
        self._sample_again = False
        self._sample()

    @work(thread=True, exit_on_error=False, group="sampler")
    def _sample(self) -> None:
        samples = []
        try:
            for device in self.devices:
                try:
                    samples.append((device.id, self.backend.telemetry(device.id), self.backend.knob(device.id)))
                except Exception as e:  # noqa: BLE001 - a bad sample is shown, never fatal
                    self.post_message(msg.BackendFailed(f"reading {device.id}", e))
        finally:  # always: it is what ends this sample's turn
            self.post_message(msg.TelemetrySampled(tuple(samples)))

    def on_telemetry_sampled(self, message: msg.TelemetrySampled) -> None:
        self._sampling = False
        if len(message.samples) == len(self.devices):
            self._last_sampler_error = None
        knob_changed = False
        for device_id, sample, knob in message.samples:
            knob_changed |= knob != self.histories[device_id].knob
            self.record_sample(device_id, sample, knob)
        if knob_changed:
            self.repaint_screens()
        if self._sample_again:
            self.call_after_refresh(self.sample_now)

    def repaint_screens(self) -> None:
        """Repaint every screen on the stack now (the one under a dialog too): after an apply, revert, reset or a
        trial's phase change no view may show the card as it was."""
        for screen in self.screen_stack:
            if isinstance(screen, TunerScreen) and screen.is_mounted:
                screen.repaint()

    def record_sample(self, device_id: str, sample: Telemetry, knob: Knob) -> None:
        """Add one sample: the sampler's, or one tests and snapshots pre-fill history with."""
        self.histories[device_id].add(sample)
        self.histories[device_id].set_knob(knob)

    def on_backend_failed(self, message: msg.BackendFailed) -> None:
        text = f"{message.what}: {describe_error(message.error)}"
        if message.what.startswith("reading") and text == self._last_sampler_error:
            return  # the 1 Hz sampler repeats itself; say it once until it changes
        if message.what.startswith("reading"):
            self._last_sampler_error = text
        self.notify(text, severity="error", timeout=10)

    @property
    def busy(self) -> bool:
        """A stress run, a bisect or a bisect of every card is running: one job at a time."""
        return self.stress.running or self.bisect.running

    def _bisect_on(self, device_id: str) -> bool:
        """A bisect of this card, alone or with every card, is running."""
        return self.bisect.running and device_id in self.bisect.device_ids

    def job_on(self, device_id: str) -> bool:
        """A stress run (its stock reference recorded at stock, its result for the setting it runs at) or a bisect
        is running on this card: no manual change goes on it until it stops."""
        return (self.stress.running and self.stress.device_id == device_id) or self._bisect_on(device_id)

    def _note_from_any_thread(self, line: str) -> None:
        self.post_message(msg.Noted(line, "warning"))  # thread-safe and never blocks (a heartbeat must go on)

    def on_noted(self, message: msg.Noted) -> None:
        self.notify(message.text, severity=message.severity, timeout=10)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """One place for workers that died with an unexpected error: show it, keep running."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self.notify(f"{event.worker.name}: {describe_error(event.worker.error)}", severity="error", timeout=10)

    def _post_result(self, what: str, do: Callable[[], Message | None]) -> None:
        """In a worker: post the message `do` returns (None: nothing to say), or BackendFailed(what) when it raised
        (refused, not root...: said in one line, never fatal)."""
        try:
            message = do()
        except Exception as e:  # noqa: BLE001 - shown, never fatal
            message = msg.BackendFailed(what, e)
        if message is not None:
            self.post_message(message)

    # --- manual setting: apply, keep or revert, reset ------------------------------------------------------------
    def apply_setting(self, device_id: str, value: int, *, profile: ProfileApply | None = None,
                      on_kept: Callable[[], None] | None = None) -> None:
        """Apply `value` through the same rules as `tuner set` (tuner.actions.setting), then keep-or-revert.
        `profile`: a profile being applied (its lock clock is set first, as `tuner apply` does).
        `on_kept`: called once the user kept it (the Bisect screen then offers to save it as a profile)."""
        if self.pending is not None:
            self.notify("a change is already waiting for keep-or-revert", severity="warning")
            return
        if self.job_on(device_id):
            self.notify("a job is running on this card; stop it first", severity="warning")
            return

        def apply() -> PendingChange:
            request = profile.set_request() if profile is not None else SetRequest(device_id, value)
            pending = prepare_setting(self.backend, request, clock=self.clock)
            if profile is None:  # as `tuner set` warns (a profile's plan said it already: on_profile_checked)
                for warning in other_tools.warnings_for(self.backend, [device_id]):
                    self.post_message(msg.Noted(warning, "warning"))
            pending.apply()
            return pending

        self._apply(apply, f"apply {value:+d} on {device_id}", on_kept)

    def apply_rig_profile(self, profile: Profile | Callable[[], Profile], *,
                          on_kept: Callable[[], None] | None = None) -> None:
        """`tuner apply` on a rig profile (tuner.actions.profile_apply): every part checked before any write, each
        to the card it was proven on, then one keep-or-revert for the whole rig (a revert puts every card back).
        `profile`: a rig profile, or a function that builds one (the Bisect screen's result, built from the
        backend's cards in the worker)."""
        if self.pending is not None:
            self.notify("a change is already waiting for keep-or-revert", severity="warning")
            return
        if self.busy:  # a rig profile goes on several cards: any job's card may be one of them
            self.notify("a job is running; stop it first", severity="warning")
            return

        def apply() -> RigChange:
            built = profile() if callable(profile) else profile
            plan = plan_rig_apply(self.backend, built)
            change = prepare_rig_apply(self.backend, plan, clock=self.clock, purpose=f"tuner (UI) apply {built.name}")
            change.apply()  # a card that fails puts the ones before it back, then raises
            for warning in plan.warnings:
                self.post_message(msg.Noted(warning, "warning"))
            return change

        name = profile.name if isinstance(profile, Profile) else jobs.RESULT_NAME  # the name the function builds
        self._apply(apply, f"apply {jobs.profile_words(name)}", on_kept)

    @work(thread=True, exit_on_error=False, group="setting")
    def _apply(self, apply: Callable[[], PendingChange | RigChange], what: str,
               on_kept: Callable[[], None] | None) -> None:
        """`apply` prepares the change (a setting, a rig profile), applies it and returns it, in this worker under
        the write lock; the keep-or-revert follows, and `on_kept` travels with the change (a second apply refused
        here must not replace the first one's). Refused or not applied: said as `what` and why."""
        with self._writing:
            if self._refuses_new_writes(what):
                return
            # one change at a time, checked here under the lock: apply_setting's check sees only an announced change,
            # and a second apply asked for before the first was announced took `pending`'s place, the first orphaned
            if self._unconfirmed_changes():
                self.post_message(msg.Noted(f"{what}: not done, a change is already waiting for keep-or-revert",
                                            "warning"))
                return
            try:
                change = apply()
            except Exception as e:  # noqa: BLE001 - nothing was kept; say why
                self.post_message(msg.BackendFailed(what, e))
                return
            self._unannounced.append(change)  # make_safe reverts it even if the event loop never takes it
        self.post_message(msg.ChangeApplied(change, on_kept))

    def on_change_applied(self, message: msg.ChangeApplied) -> None:
        with self._writing:
            if message.pending not in self._unannounced:  # make_safe reverted it already (leaving)
                return
            self._unannounced.remove(message.pending)
            self.pending = message.pending
            self._on_kept = message.on_kept
        for device_id, knob in message.pending.applied_by_card.items():  # read back: shown before the dialog
            self.histories[device_id].set_knob(knob)
        self.repaint_screens()
        self.sample_now()
        self.push_screen(KeepOrRevertDialog(message.pending), self._settle)

    def _settle(self, keep: bool | None) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            self._settle_in_thread(pending, bool(keep))

    @work(thread=True, exit_on_error=False, group="setting")
    def _settle_in_thread(self, pending: PendingChange | RigChange, keep: bool) -> None:
        def settle() -> msg.ChangeSettled | None:
            with self._writing:  # make_safe waits for it (a hang-up while the answer is being written)
                if not pending.pending:  # revert_overdue reverted it while the event loop was stuck
                    return None
                if keep:
                    pending.keep()
                else:
                    pending.revert()
            knobs = {device_id: self.backend.knob(device_id) for device_id in pending.device_ids}
            return msg.ChangeSettled(knobs, "kept" if keep else _reverted("reverted", pending))

        self._post_result(f"{'keep' if keep else 'revert'} on {', '.join(pending.device_ids)}", settle)

    def reset_to_stock(self, device_id: str) -> None:
        if self.job_on(device_id):
            self.notify("a job is running on this card; stop it first (stopping resets to stock)", severity="warning")
            return
        self._reset(device_id)

    @work(thread=True, exit_on_error=False, group="setting")
    def _reset(self, device_id: str) -> None:
        def reset() -> msg.ChangeSettled:
            with self._writing:  # make_safe waits for it
                return msg.ChangeSettled({device_id: reset_device(self.backend, device_id)}, "reset to stock")

        self._post_result(f"reset {device_id}", reset)

    def on_change_settled(self, message: msg.ChangeSettled) -> None:
        for device_id, knob in message.knobs.items():
            self.histories[device_id].set_knob(knob)
        self.repaint_screens()
        on_kept, self._on_kept = self._on_kept, None
        if on_kept is not None and message.outcome == "kept":
            on_kept()
        if len(message.knobs) == 1:
            [(device_id, knob)] = message.knobs.items()
            self.notify(f"{device_id}: {message.outcome}, now {knob.current:+d} {knob.unit}")
        else:
            now = ", ".join(f"{d} {k.current:+d} {k.unit}" for d, k in message.knobs.items())
            self.notify(f"every card {message.outcome}: now {now}")

    # --- stress (App-owned) -----------------------------------------------------------------------------------
    def start_stress(self, device_id: str, preset: str, mode: str, *, without_reference: bool = False) -> None:
        """A stress run through tuner.actions.stress; `without_reference`: the user chose to run without a stock
        reference (the Tune screen asked)."""
        if self._refuses_new_writes(f"stress on {device_id}"):
            return
        if self.busy:
            self.notify("a stress run or bisect is already running", severity="warning")
            return
        setting = knob.current if (knob := self.histories[device_id].knob) else None
        started = StressState(device_id=device_id, running=True, preset=preset, mode=mode, run=self.stress.run + 1)
        self.stress = started.written(f"starting {preset}/{mode} stress on {device_id} at {setting}")
        self._stress_job = jobs.StressJob(self.backend, device_id, preset=preset, mode=mode, emit=self._stress_event,
                                          without_reference=without_reference, **self._stress_options)
        self._run_stress(self._stress_job)

    @work(thread=True, exit_on_error=False, group="stress", name="stress")
    def _run_stress(self, job: jobs.StressJob | jobs.VerifyJob) -> None:
        try:
            summary = job.run()
        except Exception as e:  # noqa: BLE001 - said once, by on_stress_ended (not also as a BackendFailed)
            summary = f"{ERROR_PREFIX}{describe_error(e)}"
        self.post_message(msg.StressEnded(job.device_id, summary))

    def _stress_event(self, event: object) -> None:
        """A stress or verify job's event or line, from its worker thread (post_message is thread-safe)."""
        self.post_message(msg.StressEventReceived(event))

    def stop_stress(self) -> None:
        if self._stress_job is not None and self.stress.running:
            self.stress = replace(self.stress, stopping=True).written("stopping (you asked)...")
            self._stress_job.stop()

    def on_stress_event_received(self, message: msg.StressEventReceived) -> None:
        self.stress = jobs.apply_stress_event(self.stress, message.event)

    def on_stress_ended(self, message: msg.StressEnded) -> None:
        self.stress = replace(self.stress, running=False, verdict=message.summary).written(
            f"ended: {message.summary}")
        if not self._leaving:
            self._stress_job = None
        self.notify(f"stress on {message.device_id}: {message.summary}", **ended_notice(message.summary))
        self.sample_now()

    # --- bisect of one card or every card at once (App-owned) ---------------------------------------------------
    def start_bisect(self, device_ids: tuple[str, ...], params: BisectParams) -> None:
        """Start (or resume, per `params`) a bisect of these cards through tuner.actions.bisect (the CLI's `--device
        ID` or `--device all`); a blank form field arrives here as None, which the core turns into the card's
        default. Real cards are asked about first."""
        if self.busy:
            self.notify("a stress run or bisect is already running", severity="warning")
            return
        questions = [q for q in (consent_question(self.device(d)) for d in device_ids) if q]
        if questions:
            question = questions[0] if len(device_ids) == 1 else (
                f"Bisect every card at once ({', '.join(device_ids)})? {questions[0]}")
            self.push_screen(ConfirmDialog(question, yes="Start", no="Cancel"),
                             if_answered(lambda _yes: self._begin_bisect(device_ids, params)))
            return
        self._begin_bisect(device_ids, params)

    def _begin_bisect(self, ids: tuple[str, ...], params: BisectParams) -> None:
        if self._refuses_new_writes(f"bisect on {', '.join(ids)}"):
            return
        if self.busy:  # started while the question was open
            return
        # the finished result stays until this start is accepted: a refused start puts it back (on_bisect_ended)
        self._bisect_before = self.bisect
        self.bisect = BisectState.started(ids)

        def show_earlier_trials() -> None:  # a resumed session: each card's table starts with its earlier trials
            from tuner.actions.safety_files import session_trials

            for device_id in ids:
                self.post_message(msg.BisectEventReceived(jobs.EarlierTrials(session_trials(device_id), device_id)))

        self._bisect_job = runner = jobs.BisectRunner(
            lambda: prepare_bisect(self.backend, ids, params,
                                   lambda event: self.post_message(msg.BisectEventReceived(event)),
                                   **self._bisect_options),
            ids, on_prepared=show_earlier_trials if params.resume else None)
        # asked again now that the job is known: a Ctrl-Z (make_safe_to_stop, on another thread, may have run since
        # the check above) sets `_stopping` before it reads `_bisect_job`, so either it paused this runner or this
        # sees `_stopping`; else the bisect started unpaused and its trial ran unwatched while the process was stopped
        if self._refuses_new_writes(f"bisect on {', '.join(ids)}"):
            self._bisect_job, self.bisect = None, self._bisect_before
            return
        self._run_bisect(runner)

    @work(thread=True, exit_on_error=False, group="bisect", name="bisect")
    def _run_bisect(self, runner: jobs.BisectRunner) -> None:
        try:
            summary = jobs.describe_bisect_result(runner.run())
        except Exception as e:  # noqa: BLE001 - a refused start (bad parameters, an unfinished session) lands here
            summary = f"{ERROR_PREFIX}{describe_error(e)}"  # too; said once, by on_bisect_ended (not a BackendFailed)
        self.post_message(msg.BisectEnded(runner.device_ids, summary, runner.outcome, accepted=runner.accepted))

    def stop_bisect(self) -> None:
        if self._bisect_job is not None and self.bisect.running:
            self._bisect_job.stop()

    def on_bisect_event_received(self, message: msg.BisectEventReceived) -> None:
        before = self.bisect
        self.bisect = jobs.apply_bisect_event(before, message.event, now_s=self.clock())
        if isinstance(message.event, TrialWarning):  # a check at less than full strength, a pause: said at once
            where = f"{message.event.device}: " if message.event.device else ""
            self.notify(where + message.event.message, severity="warning", timeout=15)  # notify speaks the UI
        if jobs.bisect_may_have_changed_cards(before, self.bisect):
            self.sample_now()  # a phase change writes the cards: read them back now, not at the next 1 Hz tick
        self.repaint_screens()

    def on_bisect_ended(self, message: msg.BisectEnded) -> None:
        outcome = message.outcome
        cards = {d: replace(c, running=False, current=None) for d, c in self.bisect.cards.items()}
        failure = self.bisect.failure
        if outcome is None:
            failure = for_people(message.summary, here="bisect")  # shown on the Bisect screen
        elif outcome.status == "stopped" and len(message.device_ids) > 1:
            failure = "stopped by you; u resumes it (every card)"
        if not message.accepted:  # refused before anything ran: the screen keeps what it showed, with the reason
            self.bisect = replace(self._bisect_before, failure=failure)
        else:
            self.bisect = replace(self.bisect, running=False, current=None, cards=cards, outcome=outcome,
                                  failure=failure,
                                  settings=dict(outcome.settings) if outcome is not None else self.bisect.settings)
        if not self._leaving:
            self._bisect_job = None
        what = message.device_ids[0] if len(message.device_ids) == 1 else "every card"
        self.notify(f"bisect {'on' if len(message.device_ids) == 1 else 'of'} {what}: {message.summary}",
                    **ended_notice(message.summary))
        self.sample_now()
        self.repaint_screens()

    def save_bisect_profile(self, name: str, device_id: str | None = None) -> None:
        """The finished bisect as a profile (tuner.actions.bisect, as the CLI's --save), in the user's store: one
        card's own result (`device_id`), or one rig profile of the settings confirmed together."""
        outcome = self.bisect.outcome
        if outcome is None or (device_id is not None and device_id not in outcome.per_card):
            error = UsageError("no finished bisect to save", "run a bisect to its recommendation first")
            self.notify(error.one_line(), severity="error", timeout=10)
            return
        self._save_bisect_profile_in_thread(outcome, name, device_id)

    @work(thread=True, exit_on_error=False, group="profile-files")
    def _save_bisect_profile_in_thread(self, outcome: BisectOutcome, name: str, device_id: str | None) -> None:
        """save_bisect_profile's writes (the profile, one card's bundled evidence), off the UI thread."""
        from tuner.actions.bisect import SAVED_NEXT_IN_UI, profile_from_outcome, rig_profile_from_outcome
        from tuner.actions.profile_store import save_profile
        from tuner.actions.screen.record import bundle_beside_profile

        try:
            if device_id is None:  # a rig profile bundles no baseline (each card's is its own)
                path, said = save_profile(rig_profile_from_outcome(self.backend, outcome, name)), ""
            else:
                card = outcome.per_card[device_id]
                path = save_profile(profile_from_outcome(self.backend, device_id, card, name))
                said = bundle_beside_profile(self.backend, device_id, card, path).text()  # as bisect --save
        except TunerError as e:
            self.post_message(msg.FileWorkDone(None, e))
            return
        self.post_message(msg.FileWorkDone(
            f"saved {'profile' if device_id is not None else 'rig profile'} {name} ({path}){said}; {SAVED_NEXT_IN_UI}",
            None))

    def on_file_work_done(self, message: msg.FileWorkDone) -> None:
        """What a file worker did, or the error that stopped it: the App's own, and every screen's (bubbled up)."""
        if message.error is not None:
            self.notify(describe_error(message.error), severity="error", timeout=10)
        elif message.said:
            self.notify(message.said)

    # --- profiles -----------------------------------------------------------------------------------------------
    @work(thread=True, exit_on_error=False, group="setting")
    def apply_profile(self, profile: Profile, device_id: str) -> None:
        """`tuner apply`'s rules (tuner.actions.profile_apply), without --force: the same card applies
        (keep-or-revert); another card of the same model needs a verify trial; anything else is refused."""
        self._post_result(f"apply {profile.name!r}",
                          lambda: msg.ProfileChecked(plan_profile_apply(self.backend, profile, device_id, verify=True)))

    def on_profile_checked(self, message: msg.ProfileChecked) -> None:
        plan = message.plan
        for warning in plan.warnings:
            self.notify(warning, severity="warning", timeout=10)
        if not plan.verify_required:
            self.apply_setting(plan.device.id, plan.value, profile=plan)
            return
        question = (f"{plan.profile.name!r} was proven on another card ({plan.match.reason}). Run a "
                    f"{format_duration(self.verify_duration_s)} stress trial at {plan.value:+d} {plan.knob.unit} on "
                    f"{plan.device.id}? It is kept only if it passes, else reverted.")
        self.push_screen(ConfirmDialog(question, yes="Verify", no="Cancel"),
                         if_answered(lambda _yes: self.verify_profile(plan)))

    def verify_profile(self, plan: ProfileApply) -> None:
        """`tuner apply --verify`: the journalled trial with the profile's workload and lock clock."""
        if self._refuses_new_writes(f"verify on {plan.device.id}"):
            return
        if self.busy:
            self.notify("a stress run or bisect is already running", severity="warning")
            return
        device_id, value = plan.device.id, plan.value
        before = self.stress
        self.stress = StressState(device_id=device_id, running=True, preset="verify", run=self.stress.run + 1).written(
            f"verifying {value:+d} on {device_id} (kept only if it passes)")
        self._stress_job = job = jobs.VerifyJob(self.backend, plan, self.verify_duration_s, emit=self._stress_event)
        # asked again now that the job is known, as _begin_bisect does: a Ctrl-Z's make_safe_to_stop sets
        # `_stopping` before it reads `_stress_job`, so either it stopped this verify or this sees `_stopping`
        if self._refuses_new_writes(f"verify on {device_id}"):
            self._stress_job, self.stress = None, before
            return
        self._run_stress(job)

    # --- apply at boot (tuner.actions.boot_service, as `tuner service`) ---------------------------------------------
    @work(thread=True, exclusive=True, exit_on_error=False, group="service-status")
    def read_boot_status(self) -> None:
        from tuner.actions import boot_service

        simulated = self.backend.simulated  # the simulated cards' last boot run, labelled so
        self._post_result("boot service status",
                          lambda: msg.BootServiceRead(boot_service.status(simulated=simulated)))

    def on_boot_service_read(self, message: msg.BootServiceRead) -> None:
        self.boot_status = message.status
        self.repaint_screens()  # shown as it arrives, not on the next tick (a snapshot under load caught the gap)

    def change_boot_service(self, profile_name: str | None, *, overwrite: bool = False) -> None:
        """Install the boot service for `profile_name`, or remove it (None). The caller asked first."""
        self._boot_service_in_thread(profile_name, overwrite)

    @work(thread=True, exit_on_error=False, group="service")
    def _boot_service_in_thread(self, profile_name: str | None, overwrite: bool) -> None:
        from tuner.actions import boot_service

        def change() -> None:
            if profile_name is None:
                result = boot_service.remove()
            else:
                result = boot_service.install(profile_name, overwrite=overwrite,
                                              simulated_session=self.backend.simulated)
            if profile_name is not None:
                done = f"boot service installed: {profile_name!r} is applied at every boot"
            elif result.changed:
                done = "boot service removed: no profile is applied at boot (the system profiles are kept)"
            else:
                done = "the boot service was not installed; nothing to do"
            self.post_message(msg.Noted(done))
            for warning in result.warnings:  # systemctl's stderr is several lines: a toast says it in one
                self.post_message(msg.Noted(" ".join(warning.split()), "warning"))

        self._post_result("boot service", change)
        self.call_from_thread(self.read_boot_status)  # workers are started from the event loop

    # --- doctor --------------------------------------------------------------------------------------------------
    def run_doctor(self) -> None:
        self.doctor_checks = None
        self._doctor_in_thread()

    @work(thread=True, exclusive=True, exit_on_error=False, group="doctor")
    def _doctor_in_thread(self) -> None:
        try:
            if self._doctor is not None:
                checks = self._doctor()
            else:
                from tuner.actions.doctor import run_checks

                checks = run_checks(simulate=self.backend.simulated)
        except Exception as e:  # noqa: BLE001
            self.post_message(msg.BackendFailed("doctor", e))
            checks = []
        self.post_message(msg.DoctorFinished(checks))

    def on_doctor_finished(self, message: msg.DoctorFinished) -> None:
        self.doctor_checks = message.checks

    # --- quitting and hang-ups -----------------------------------------------------------------------------------
    def action_request_quit(self) -> None:
        running = self.jobs_running()
        if not running:
            self.exit(exit_codes.OK)
            return
        several = (self.bisect.running and len(self.bisect.device_ids) > 1) or len(running) > 1 or (
            self.pending is not None and len(self.pending.device_ids) > 1)
        what = "every card involved" if several else "the card"
        question = f"Quit? This stops {' and '.join(running)} and resets {what} to stock."
        self.push_screen(ConfirmDialog(question, yes="Quit and reset", no="Stay"), self._quit_confirmed)

    async def action_quit(self) -> None:
        """Textual's own quit action (its default bindings, widgets that call it) takes the safe path too."""
        self.action_request_quit()

    def _quit_confirmed(self, yes: bool | None) -> None:
        if yes:
            self.stop_jobs()
            self.exit(exit_codes.OK)

    def hang_up(self) -> None:
        """SIGHUP (the SSH session went away), SIGTERM or the terminal gone: leave. The cards are made safe by
        run_app's guard (tuner.app.hangup), which does not wait for this event loop."""
        self.hung_up = True
        self.stop_jobs()
        self.exit(exit_codes.INTERRUPTED)

    def revert_overdue(self) -> None:
        """Run each second on the hang-up guard's thread (tuner.app.hangup): the keep-or-revert countdown runs on
        the event loop, which a terminal that stopped reading (a stalled SSH connection) can block for good. A
        change still pending OVERDUE_S after its countdown ended is reverted here, as the countdown would have;
        the App hears of it when its loop moves again."""
        pending = self.pending
        if pending is None or not pending.pending or not pending.expired():
            self._overdue_since = None
            return
        now = self.clock()
        if self._overdue_since is None or self._overdue_since[0] is not pending:
            self._overdue_since = (pending, now)
            return
        if now - self._overdue_since[1] < OVERDUE_S:
            return
        with self._writing:
            if self.pending is not pending or not pending.pending:  # answered meanwhile
                return
            self.pending = None
            cards = pending.device_ids
            try:
                pending.revert()
                knobs = {device_id: self.backend.knob(device_id) for device_id in cards}
            except Exception as e:  # noqa: BLE001 - said when the loop moves; make_safe resets at exit
                self.post_message(msg.BackendFailed(f"revert on {', '.join(cards)}", e))
                self.pending = pending if pending.pending else None
                self._overdue_since = (pending, now)  # tried again after OVERDUE_S, not every second
                return
        self.post_message(msg.ChangeSettled(knobs, _reverted("reverted (not confirmed in time)", pending)))

    def stop_jobs(self) -> None:
        """Ask every running job to stop (non-blocking, thread-safe), so their workers end before the App does."""
        self._leaving = True
        for job in (self._stress_job, self._bisect_job):
            if job is not None:
                job.stop()

    def signal_safe_hang_up(self, *_args: object) -> None:
        """Ask the event loop to leave (from a signal handler or any thread; never blocks). Nothing new is written
        to a card from now on (the setting workers check `_leaving`)."""
        self._leaving = True
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the App has already ended
                self._loop.call_soon_threadsafe(self.hang_up)

    def terminal_went_away(self, reason: str) -> None:
        """The driver found the terminal gone (tuner.app.terminal_driver): leave as on SIGHUP, through the guard
        when run_app installed one (it makes the cards safe without waiting for this event loop)."""
        if self.hang_up_guard is not None:
            self.hang_up_guard.trigger(reason)
        else:
            self.signal_safe_hang_up()

    def _unconfirmed_changes(self) -> list[PendingChange | RigChange]:
        """Changes applied and neither kept nor reverted: the one asked about, and those not yet announced."""
        return [c for c in (self.pending, *self._unannounced) if c is not None and c.pending]

    def make_safe(self, wait_s: float = 30.0) -> list[str]:
        """Stop every job, revert an unconfirmed setting and reset cards that had a job on them to stock.

        Runs once, from whichever thread asks first: the hang-up guard's (tuner.app.hangup: on SIGHUP/SIGTERM or
        the terminal gone, without waiting for the event loop) or run_app's, once the App has stopped. A later
        call waits for the first and returns what it did. Nothing is written to a card by the UI afterwards.
        """
        with self._made_safe_lock:
            if self._made_safe is None:
                self._leaving = True
                self._made_safe = self._make_safe_now(wait_s)
            return list(self._made_safe)

    def _make_safe_now(self, wait_s: float) -> list[str]:
        done, devices_to_reset = [], set[str]()
        for job in (self._stress_job, self._bisect_job):
            if job is not None:
                job.stop()
                devices_to_reset.update(job.device_ids)
                done.append(f"stopped {job_name(job)} on {', '.join(job.device_ids)}")
        for job in (self._stress_job, self._bisect_job):
            if job is not None:
                job.wait(wait_s)
        if self._bisect_job is not None:  # the CLI's next bisect on these cards would otherwise refuse, unexplained
            ids = ",".join(self._bisect_job.device_ids)
            several = len(self._bisect_job.device_ids) > 1
            what, where = ((f"bisect of every card ({ids})", "ALL CARDS, then u") if several
                           else (f"bisect session on {ids}", "u"))
            done.append(f"the unfinished {what} is kept: `tuner bisect --device {ids} --resume` continues it ({where} "
                        "on the Bisect screen), --restart starts afresh")
        with self._writing:  # a setting worker half-way through a write finishes first; later ones write nothing
            changes = self._unconfirmed_changes()
            self.pending, self._unannounced = None, []
            for change in changes:  # applied, neither kept nor reverted
                cards = change.device_ids
                devices_to_reset.update(cards)
                try:
                    change.revert()
                    devices_to_reset.difference_update(cards)
                    done.append(f"reverted the unconfirmed setting on {', '.join(cards)}")
                except Exception as e:  # noqa: BLE001 - fall back to a plain reset below
                    done.append(f"revert failed ({describe_error(e)}); resetting to stock instead")
            for device_id in sorted(devices_to_reset):
                try:
                    reset_device(self.backend, device_id, force=True)
                    done.append(f"reset {device_id} to stock (read back)")
                except Exception as e:  # noqa: BLE001
                    done.append(f"could not reset {device_id}: {describe_error(e)}")
        return done

    def make_safe_to_stop(self, wait_s: float = 30.0) -> bool:
        """Before the process stops (SIGTSTP: `kill -TSTP`; the driver, tuner.app.terminal_driver, stops it
        once this returns True): a stopped process reverts nothing and watches no engine (they run in sessions of
        their own), so, as `tuner set` and `tuner bisect` do before they stop, an unconfirmed change is reverted (a
        profile's verify, whose value is kept only on a pass, is stopped: the previous value goes back) and a bisect
        pauses (its running trials end without a result, their cards at stock and verified; they run again
        after `resume_after_stop`). Blocks: never on the event loop (a setting worker holding `_writing` may be
        waiting for it). False: the App is leaving (make_safe has the cards), a trial did not end in `wait_s`, or a
        step raised (said); the process does not stop then, and the bisect and new writes go on."""
        # from here until back from the stop (resume_after_stop), nothing new goes on a card: the event loop still
        # handles keys and answers before the driver's stop, and a write then would stay on the card while stopped
        self._stopping = True
        runner = self._bisect_job

        def not_stopped() -> bool:  # the process goes on: so do the paused bisect (unless leaving) and new writes
            self._stopping = False
            if runner is not None and not self._leaving:  # leaving: make_safe stops it, no trial starts first
                runner.resume()
            return False

        try:
            if runner is not None:
                runner.pause()
                deadline = time.monotonic() + wait_s
                while not runner.paused_safely() and not runner.wait(0.05):
                    if time.monotonic() > deadline:
                        self.post_message(msg.Noted("not stopped (Ctrl-Z): the running trial did not end in time",
                                                    "warning"))
                        return not_stopped()
            verify = self._stress_job if isinstance(self._stress_job, jobs.VerifyJob) else None
            if verify is not None and not verify.wait(0):  # its value is unconfirmed (kept only on a pass): it ends
                verify.stop()  # anything but a pass puts the previous value back (tuner.actions.verify)
                self.post_message(msg.Noted(f"verify on {verify.device_id} stopped (Ctrl-Z): the value is not kept; "
                                            "apply the profile again to verify it", "warning"))
                if not verify.wait(wait_s):
                    self.post_message(msg.Noted("not stopped (Ctrl-Z): the verify did not end in time", "warning"))
                    return not_stopped()
            with self._writing:  # a setting worker half-way through a write finishes first
                if self._leaving:
                    return not_stopped()
                for change in self._unconfirmed_changes():
                    cards = change.device_ids
                    try:
                        change.revert()  # the previous value, else stock (PendingChange.revert), read back
                        knobs = {device_id: self.backend.knob(device_id) for device_id in cards}
                    except Exception as e:  # noqa: BLE001 - a card not known to be safe: the process must not stop
                        self.post_message(msg.BackendFailed(f"not stopped (Ctrl-Z): revert on {', '.join(cards)}", e))
                        return not_stopped()
                    if change is self.pending:  # its dialog closes (KeepOrRevertDialog: no longer pending)
                        self.pending = None
                    else:  # applied, not yet announced: on_change_applied drops it
                        self._unannounced.remove(change)
                    self.post_message(msg.ChangeSettled(knobs, _reverted("reverted (Ctrl-Z)", change)))
        except Exception as e:  # noqa: BLE001 - a step that raised: not stopped, and not left stopping for good
            self.post_message(msg.BackendFailed("not stopped (Ctrl-Z)", e))
            return not_stopped()
        return True

    def _refuses_new_writes(self, what: str) -> bool:
        """True when nothing new may go on a card, so `what` (a setting, a stress run, a bisect, a verify) is not
        done: the App is leaving (quit confirmed, hung up: make_safe may have run already; nothing to say), or the
        process is being stopped (make_safe_to_stop until resume_after_stop: the UI says so once it is back). From
        any thread."""
        if self._leaving:
            return True
        if self._stopping:
            self.post_message(msg.Noted(f"{what}: not done, the UI was stopping (Ctrl-Z); ask again", "warning"))
        return self._stopping

    @property
    def leaving(self) -> bool:
        """Quitting or hung up: nothing new goes on a card, make_safe has (or will have) the cards."""
        return self._leaving

    def resume_after_stop(self) -> None:
        """Back from a stop (SIGCONT): a paused bisect goes on; the trial that was cut short runs again."""
        self._stopping = False
        # leaving (a hang-up's SIGCONT woke us): make_safe stops the bisect; resumed, it would start a trial first
        if self._bisect_job is not None and not self._leaving:
            self._bisect_job.resume()

    # --- command palette -----------------------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's own commands (theme, keys, screenshot) without its Quit, which exits at once, skipping the safe
        quit; ours (tuner.app.palette) lists Quit with every screen and action."""
        for command in super().get_system_commands(screen):
            if command.title != "Quit":
                yield command

    async def run_on_screen(self, mode: str | None, action: str) -> None:
        """The palette's way to run an action: on `mode`'s screen (switching to it first), or the App's own."""
        if mode is None:
            await self.run_action(action)
            return
        if self.current_mode != mode:
            await self.switch_mode(mode)
        await self.screen.run_action(action)


def run_app(ctx: Context) -> int:
    """The UI, then the cards made safe. A hang-up, SIGTERM (every fatal signal) or the terminal gone goes through
    the guard (tuner.app.hangup): the cards are made safe on its thread at once, and the process ends with 130
    within its grace even when the UI cannot end by itself (Textual blocked writing to a terminal that is gone)."""
    on_stderr = ctx.notice
    app = TunerApp(ctx)
    if app.driver_class is LinuxDriver:  # not when TEXTUAL_DRIVER names another (a developer's choice)
        app.driver_class = HangUpSafeDriver
    guard = HangUpGuard(make_safe=app.make_safe, leave=app.signal_safe_hang_up, tick=app.revert_overdue,
                        terminal_fd=0 if os.isatty(0) else None)  # the UI's terminal (stdin) is watched for a hang-up
    app.hang_up_guard = guard
    guard.install()
    try:
        result = app.run()
    finally:
        ctx.notice = on_stderr  # the UI is gone: a late note (the helper put a card back) is printed again
        lines = app.make_safe()  # at once, or what the guard's thread did (it may still be at it: this waits)
        guard.release_signals()  # after a hang-up: ignored from now on, and the deadline stays armed
        for line in lines:
            print(f"tuner: {line}")
    if app.hung_up or guard.triggered:
        return exit_codes.INTERRUPTED
    return exit_codes.OK if result is None else result
