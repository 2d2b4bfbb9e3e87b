"""The pieces behind tests/tui/test_hangup.py, in-process: the guard (tuner.app.hangup), the terminal output that
never wedges (tuner.app.terminal_driver) and the App's make_safe from another thread while the App still runs."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.polling import until, wait_until
from tuner.app.hangup import HangUpGuard, terminal_gone
from tuner.app.terminal_driver import TerminalOutput
from tuner.core import exit_codes
from tuner.screens.dialogs import KeepOrRevertDialog


class Recorder:
    """make_safe / leave / exit fakes that say which thread called them, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.exits: list[int] = []

    def make_safe(self) -> list[str]:
        self.calls.append(("make_safe", threading.current_thread().name))
        return ["reset sim0 to stock (read back)"]

    def leave(self) -> None:
        self.calls.append(("leave", threading.current_thread().name))  # an event loop that never runs it

    def exit(self, code: int) -> None:
        self.exits.append(code)


def _guard(rec: Recorder, **kwargs) -> HangUpGuard:
    kwargs.setdefault("grace_s", 0.2)
    return HangUpGuard(make_safe=rec.make_safe, leave=rec.leave, exit=rec.exit, say=lambda _lines: None, **kwargs)


def test_a_stuck_event_loop_does_not_stop_the_guard_making_safe_and_ending_with_130():
    """The old handler only asked the event loop to leave; here the loop never answers (leave does nothing), and
    the cards are made safe on the guard's own thread, then the process is ended with 130 after the grace."""
    rec = Recorder()
    guard = _guard(rec)
    guard._thread.start()
    guard.trigger("SIGHUP")
    wait_until(lambda: rec.exits)
    assert rec.exits == [exit_codes.INTERRUPTED]
    assert ("make_safe", "tuner-hangup-guard") in rec.calls
    assert guard.lines == ["reset sim0 to stock (read back)"] and guard.safe.is_set()


def test_a_storm_makes_safe_once_and_ends_once():
    rec = Recorder()
    guard = _guard(rec)
    guard._thread.start()
    for reason in ("SIGHUP", "SIGTERM", "SIGINT", "the terminal went away", "SIGTERM"):
        guard.trigger(reason)
    wait_until(lambda: rec.exits)
    guard._thread.join(5)
    assert guard.reason == "SIGHUP"
    assert [name for name, _thread in rec.calls] == ["leave", "make_safe"]
    assert rec.exits == [exit_codes.INTERRUPTED]


def test_closed_before_any_trigger_the_guard_does_nothing():
    """A normal quit: the guard stops watching; a late signal (the CLI's handlers own it then) changes nothing."""
    rec = Recorder()
    guard = _guard(rec, check_s=0.02)
    guard._thread.start()
    guard.close()
    guard._thread.join(5)
    assert not guard._thread.is_alive()
    guard.trigger("SIGTERM")
    assert rec.calls == [] and rec.exits == []


def test_a_closed_terminal_is_noticed_without_any_signal():
    """A process that is not in the terminal's session gets no SIGHUP: the guard notices the hang-up itself."""
    master, slave = os.openpty()
    try:
        assert not terminal_gone(slave)
        rec = Recorder()
        guard = _guard(rec, terminal_fd=slave, check_s=0.02)
        guard._thread.start()
        os.close(master)
        master = -1
        wait_until(lambda: rec.exits)
        assert guard.reason == "the terminal went away"
        assert [name for name, _thread in rec.calls] == ["leave", "make_safe"]
    finally:
        os.close(slave)
        if master >= 0:
            os.close(master)


def test_a_real_signal_is_taken_by_the_guard_and_given_back():
    rec = Recorder()
    guard = _guard(rec)
    before = signal.getsignal(signal.SIGTERM)
    guard.install()
    try:
        signal.raise_signal(signal.SIGTERM)
        wait_until(lambda: rec.exits)
        assert guard.reason == "SIGTERM"
    finally:
        guard.release_signals()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # after a hang-up: a storm's tail cannot kill it
    signal.signal(signal.SIGTERM, before)


def test_after_a_normal_quit_the_signals_go_back():
    rec = Recorder()
    guard = _guard(rec)
    before = signal.getsignal(signal.SIGTERM)
    guard.install()
    guard.release_signals()
    assert signal.getsignal(signal.SIGTERM) == before
    guard._thread.join(5)
    assert not guard._thread.is_alive() and rec.calls == []


class DeadTerminal:
    """A terminal whose other end is gone: every write and flush fails as the kernel fails them (EIO)."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, _text: str) -> int:
        self.writes += 1
        raise OSError(5, "Input/output error")

    def flush(self) -> None:
        raise OSError(5, "Input/output error")

    def fileno(self) -> int:
        return 2

    def isatty(self) -> bool:
        return True


def test_terminal_output_never_raises_and_says_once_that_the_terminal_went_away():
    """Textual's writer thread died on the first EIO and the UI wedged on its next 30 writes; through
    TerminalOutput every write returns, the first failure is reported once, and nothing more is tried."""
    lost: list[str] = []
    silenced: list[bool] = []
    out = TerminalOutput(DeadTerminal(), lost.append, silence=lambda: silenced.append(True))  # type: ignore[arg-type]
    for _ in range(100):
        assert out.write("frame") == len("frame")
        out.flush()
    assert lost == ["the terminal went away ([Errno 5] Input/output error)"]
    assert silenced == [True]
    assert out._file.writes == 1  # type: ignore[attr-defined]


# --- the App's side: make_safe from the guard's thread while the App is still running ---------------------------
async def _open_keep_or_revert(app, pilot) -> None:
    await pilot.press("2")
    await pilot.pause()
    await pilot.press("left", "left", "a")  # -10 mV
    await app.workers.wait_for_complete()
    await pilot.pause()
    assert isinstance(app.screen, KeepOrRevertDialog)


async def test_make_safe_from_another_thread_while_the_dialog_is_open(app, backend):
    """The guard's thread makes the card safe while the App still shows the dialog (its event loop may be stuck);
    the App's answer afterwards writes nothing, and run_app's later make_safe returns what was done, once."""
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_keep_or_revert(app, pilot)
        assert backend.knob("sim0").current == -10
        done: list[list[str]] = []
        worker = threading.Thread(target=lambda: done.append(app.make_safe()), name="tuner-hangup-guard")
        worker.start()
        worker.join(20)
        assert backend.knob("sim0").current == 0
        assert done == [["reverted the unconfirmed setting on sim0"]]
        await pilot.press("k")  # the user's "keep", too late: nothing is kept
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert backend.knob("sim0").current == 0
    assert app.make_safe() == done[0]


async def test_nothing_new_is_written_once_leaving(app, backend):
    """After a hang-up (make_safe ran, or is running) an apply that was asked for writes nothing."""
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        app.make_safe()
        await pilot.press("left", "left", "a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert backend.knob("sim0").current == 0
        assert not isinstance(app.screen, KeepOrRevertDialog)


async def test_nothing_new_goes_on_a_card_between_made_safe_to_stop_and_the_stop(app, backend, monkeypatch):
    """SIGTSTP: the driver's stop thread makes the cards safe (make_safe_to_stop), then queues the stop on the event
    loop, which handles what came before it: a key (a), a worker's answer. An apply or a bisect start there went on
    the card after it was made safe, and stayed on it, unwatched, while the process was stopped. Until the process
    is back (resume_after_stop), nothing new is written; then it is as before."""
    from tuner.tuning.job import BisectJob, BisectParams

    started: list = []
    monkeypatch.setattr(BisectJob, "run", lambda job: started.append(job))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("2")
        await pilot.pause()
        made_safe: list[bool] = []
        stopper = threading.Thread(target=lambda: made_safe.append(app.make_safe_to_stop()), name="tuner-stop")
        stopper.start()
        stopper.join(20)
        assert made_safe == [True]
        # the driver's _stop_now is queued now; what the event loop handles before it:
        await pilot.press("left", "left", "a")
        app.start_bisect(("sim0",), BisectParams())
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert backend.knob("sim0").current == 0, "a setting went on the card after it was made safe to stop"
        assert not isinstance(app.screen, KeepOrRevertDialog) and app.pending is None
        assert started == [] and not app.bisect.running, "a bisect started after the cards were made safe to stop"
        said = [n.message for n in app._notifications if "stopping (Ctrl-Z)" in n.message]
        assert len(said) == 2 and "apply -10 on sim0" in said[0] and "bisect on sim0" in said[1], said
        app.resume_after_stop()  # SIGCONT: back, and an apply asked for now goes on as ever
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: isinstance(app.screen, KeepOrRevertDialog), what="the keep-or-revert dialog")
        assert backend.knob("sim0").current == -10
        await pilot.press("escape")
        await until(pilot, lambda: app.pending is None and backend.knob("sim0").current == 0, what="the revert")


async def test_a_stop_made_safe_as_a_bisect_starts_either_pauses_it_or_refuses_it(app, backend, monkeypatch):
    """SIGTSTP's handler runs on the event loop's thread, between any two bytecodes, and hands make_safe_to_stop to
    a thread of its own: it can run to its end while _begin_bisect is past its `_stopping` check but has not yet
    set `_bisect_job`. make_safe_to_stop then saw no bisect to pause and said the cards were safe, and the bisect
    started anyway: its trial ran unwatched while the process was stopped. Ordered here by program state: the stop
    runs inside the runner's construction."""
    from tuner.app import jobs
    from tuner.tuning.job import BisectJob, BisectParams

    started: list = []
    monkeypatch.setattr(BisectJob, "run", lambda job: started.append(job))
    made_safe: list[bool] = []

    StoppedWhileBuilt = stopped_while_built(jobs.BisectRunner, app, made_safe)
    monkeypatch.setattr(jobs, "BisectRunner", StoppedWhileBuilt)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.start_bisect(("sim0",), BisectParams())
        assert made_safe == [True]
        runner = app._bisect_job
        assert runner is None or runner._pausing, "a bisect started unpaused after the cards were made safe to stop"
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert started == [] and not app.bisect.running, "a bisect ran after the cards were made safe to stop"
        said = [n.message for n in app._notifications if "stopping (Ctrl-Z)" in n.message]
        assert len(said) == 1 and "bisect on sim0" in said[0], said
        app.resume_after_stop()
    assert backend.knob("sim0").current == 0


async def test_a_stop_that_could_not_make_a_card_safe_leaves_the_bisect_running(tmp_path, boot, monkeypatch):
    """SIGTSTP with a bisect on sim0 and an unconfirmed change on sim1 whose revert fails: the process does not stop
    (a card not known to be safe), but the bisect, paused for the stop, was never resumed: it sat paused, showing
    RUNNING, for good. A stop that does not happen leaves the bisect going on."""
    from tests.tui.helpers import make_app, sim_backend
    from tests.tui.test_bisect import GatedEngine
    from tuner.core.errors import DeviceLost
    from tuner.tuning.job import BisectParams

    backend = sim_backend(tmp_path, gpus=2, vmin_mv=-52)
    engine = GatedEngine(hold_at=1)  # the first trial (the stock reference) holds until released
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": engine, "kernel_watcher_factory": lambda _card: None})
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.apply_setting("sim1", -10)
        await until(pilot, lambda: app.pending is not None, what="the change on sim1")

        def revert_fails() -> None:
            raise DeviceLost("sim1: the card went away")

        monkeypatch.setattr(app.pending, "revert", revert_fails)
        app.start_bisect(("sim0",), BisectParams(trial_s=1, confirm_s=2))
        await until(pilot, engine.entered.is_set, what="the first trial")
        made_safe: list[bool] = []
        stopper = threading.Thread(target=lambda: made_safe.append(app.make_safe_to_stop()), name="tuner-stop")
        stopper.start()
        engine.release.set()
        await until(pilot, lambda: not stopper.is_alive(), what="make_safe_to_stop")
        assert made_safe == [False]  # sim1 is not known to be safe: the process does not stop
        try:
            await until(pilot, lambda: not app.bisect.running, what="the bisect to go on to its end")
        finally:
            app.stop_bisect()
        assert app.bisect.card("sim0").recommendation is not None
        assert backend.knob("sim0").current == 0


async def test_a_stop_whose_step_raises_leaves_the_bisect_running_and_writes_allowed(tmp_path, boot, monkeypatch):
    """SIGTSTP where a step of make_safe_to_stop raises something it does not catch: the driver's stop thread takes
    it for "not stopped" (terminal_driver._stop_when_safe), but the App's stopping flag stayed set and the bisect
    paused, so the bisect sat paused for good and every later write was refused with "the UI was stopping". A stop
    that does not happen leaves both as they were, and says why."""
    from tests.tui.helpers import make_app, sim_backend
    from tests.tui.test_bisect import GatedEngine
    from tuner.tuning.job import BisectParams

    backend = sim_backend(tmp_path, gpus=2, vmin_mv=-52)
    engine = GatedEngine(hold_at=1)  # the first trial (the stock reference) holds until released
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": engine, "kernel_watcher_factory": lambda _card: None})
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.start_bisect(("sim0",), BisectParams(trial_s=1, confirm_s=2))
        await until(pilot, engine.entered.is_set, what="the first trial")

        def unreadable() -> list:
            raise RuntimeError("the changes could not be listed")

        monkeypatch.setattr(app, "_unconfirmed_changes", unreadable)
        made_safe: list[object] = []

        def stop() -> None:
            try:
                made_safe.append(app.make_safe_to_stop())
            except Exception as e:  # noqa: BLE001 - what the driver's stop thread would take as "not stopped"
                made_safe.append(e)

        stopper = threading.Thread(target=stop, name="tuner-stop")
        stopper.start()
        engine.release.set()
        await until(pilot, lambda: not stopper.is_alive(), what="make_safe_to_stop")
        monkeypatch.undo()
        try:
            await until(pilot, lambda: not app.bisect.running, what="the bisect to go on to its end")
        finally:
            app.stop_bisect()
            app.resume_after_stop()  # on a failure above: a bisect left paused would never end
        assert app.bisect.card("sim0").recommendation is not None
        assert made_safe == [False], made_safe  # not stopped, said (below), not raised into the driver
        app.apply_setting("sim1", -10)  # a write asked for now goes on, not refused as "stopping"
        await until(pilot, lambda: app.pending is not None, what="the change on sim1")
        assert backend.knob("sim1").current == -10
        said = [n.message for n in app._notifications if "not stopped (Ctrl-Z)" in n.message]
        assert said and "could not be listed" in said[0], said


async def test_a_stop_during_a_profiles_verify_puts_the_previous_value_back_first(tmp_path, monkeypatch):
    """SIGTSTP while a profile is verified on this card (its value on the card, kept only on a pass): the App made
    nothing safe (the verify is no keep-or-revert change, no bisect), so the unconfirmed value stayed on the card,
    its trial unwatched, for as long as the process was stopped. The verify is stopped first (anything but a pass
    puts the previous value back), as an unconfirmed change is reverted."""

    from tests.tui.helpers import open_profiles
    from tuner.screens.dialogs import ConfirmDialog

    entered = threading.Event()
    backend, app = held_verify(monkeypatch, tmp_path, entered)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the verify question")
        await pilot.press("y")
        await until(pilot, entered.is_set, what="the verify's trial")
        assert backend.knob("sim0").current == 90
        made_safe: list[bool] = []
        stopper = threading.Thread(target=lambda: made_safe.append(app.make_safe_to_stop()), name="tuner-stop")
        stopper.start()
        try:
            await until(pilot, lambda: not stopper.is_alive(), what="make_safe_to_stop")
            assert made_safe == [True]
            assert backend.knob("sim0").current == 45, "the verify's unconfirmed value stayed on the stopped card"
        finally:
            app.stop_stress()
            app.resume_after_stop()
        await until(pilot, lambda: not app.stress.running, what="the verify's end")
    assert backend.knob("sim0").current == 45


async def test_a_stop_made_safe_as_a_verify_starts_refuses_it(tmp_path, monkeypatch):
    """The verify's twin of the bisect's race: make_safe_to_stop, on the driver's stop thread, ran to its end after
    verify_profile's `_stopping` check and before `_stress_job` was set, so it saw no verify to stop and said the
    cards were safe; the verify then put the profile's value on the card, unconfirmed and unwatched while the
    process was stopped. Ordered by program state: the stop runs inside the job's construction."""

    from tests.tui.helpers import open_profiles
    from tuner.app import jobs
    from tuner.screens.dialogs import ConfirmDialog

    entered = threading.Event()
    backend, app = held_verify(monkeypatch, tmp_path, entered)
    made_safe: list[bool] = []

    StoppedWhileBuilt = stopped_while_built(jobs.VerifyJob, app, made_safe)
    monkeypatch.setattr(jobs, "VerifyJob", StoppedWhileBuilt)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await open_profiles(pilot, app)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the verify question")
        await pilot.press("y")
        await until(pilot, lambda: made_safe, what="make_safe_to_stop")
        assert made_safe == [True]
        assert app._stress_job is None, "a verify started after the cards were made safe to stop"
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert not entered.is_set() and not app.stress.running
        assert backend.knob("sim0").current == 45
        said = [n.message for n in app._notifications if "stopping (Ctrl-Z)" in n.message]
        assert len(said) == 1 and "verify on sim0" in said[0], said
        app.resume_after_stop()


async def test_back_from_a_stop_into_a_hang_up_the_paused_bisect_stays_paused(tmp_path, boot):
    """SIGHUP while stopped comes with a SIGCONT: the driver's stop returns and resumes the paused bisect, while the
    hang-up has already begun (leaving: nothing new goes on a card). The resume let the next trial start, writing
    its setting, until make_safe stopped it. Leaving, the bisect stays paused."""
    from tests.tui.helpers import make_app, sim_backend
    from tests.tui.test_bisect import GatedEngine
    from tuner.tuning.job import BisectParams

    backend = sim_backend(tmp_path, vmin_mv=-52)
    engine = GatedEngine(hold_at=1)
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": engine, "kernel_watcher_factory": lambda _card: None})
    async with app.run_test(size=(80, 24)) as pilot:
        app.start_bisect(("sim0",), BisectParams(trial_s=1, confirm_s=2))
        await until(pilot, engine.entered.is_set, what="the first trial")
        runner = app._bisect_job
        made_safe: list[bool] = []
        stopper = threading.Thread(target=lambda: made_safe.append(app.make_safe_to_stop()), name="tuner-stop")
        stopper.start()
        engine.release.set()
        await until(pilot, lambda: not stopper.is_alive(), what="make_safe_to_stop")
        assert made_safe == [True] and runner.paused_safely()
        app.signal_safe_hang_up()  # the SIGHUP, handled before the stop returns (no await between the two)
        app.resume_after_stop()  # the driver's stop returns (SIGCONT)
        assert runner.paused_safely(), "back from the stop into a hang-up, the bisect went on"
    app.make_safe()
    assert backend.knob("sim0").current == 0


@pytest.fixture(autouse=True)
def _no_stray_guard_threads():
    yield
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "tuner-hangup-guard" and t.is_alive()
                        and t is not threading.current_thread()], timeout_s=10)


def test_the_guard_ticks_until_triggered():
    rec = Recorder()
    ticks: list[str] = []
    guard = _guard(rec, check_s=0.02, tick=lambda: ticks.append(threading.current_thread().name))
    guard._thread.start()
    wait_until(lambda: len(ticks) >= 3)
    guard.trigger("SIGTERM")
    wait_until(lambda: rec.exits)
    seen = len(ticks)
    time.sleep(0.1)
    assert len(ticks) == seen and set(ticks) == {"tuner-hangup-guard"}


async def test_an_overdue_change_is_reverted_off_the_event_loop(app, backend, clock):
    """The countdown runs on the event loop; when that loop cannot run (a stalled terminal), the guard's tick
    reverts a change OVERDUE_S past its deadline. Called here between two awaits, so the dialog's own countdown
    cannot run first, as when the loop is blocked."""
    from tuner.actions.keep_or_revert import DEFAULT_TIMEOUT_S
    from tuner.app.tuner_app import OVERDUE_S

    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await _open_keep_or_revert(app, pilot)
        clock.advance(DEFAULT_TIMEOUT_S - 1)
        app.revert_overdue()
        app.revert_overdue()
        assert backend.knob("sim0").current == -10  # not due yet
        clock.advance(2)
        app.revert_overdue()  # due: noted, not yet overdue
        clock.advance(OVERDUE_S - 1)
        app.revert_overdue()
        assert backend.knob("sim0").current == -10
        clock.advance(1)
        app.revert_overdue()
        assert backend.knob("sim0").current == 0 and app.pending is None
        # the loop moves again: the dialog's countdown ends it, nothing more is written
        await until(pilot, lambda: not isinstance(app.screen, KeepOrRevertDialog), what="the dialog to close")
        await app.workers.wait_for_complete()
        assert any("reverted (not confirmed in time)" in n.message for n in app._notifications)
        assert not [n for n in app._notifications if n.severity == "error"]
        assert backend.knob("sim0").current == 0


async def test_a_hang_up_before_the_event_loop_started_ends_the_app_once_it_does(app):
    """A signal during start-up (no event loop yet to ask): the App leaves as soon as it is mounted."""
    app.signal_safe_hang_up()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.hung_up  # hang_up ran: it stopped the jobs and asked the App to exit with 130


def test_a_signal_that_lands_inside_the_guards_own_handler_never_waits_for_itself():
    """A storm: the second signal's handler runs on the main thread between two bytecodes of the first one's, while
    that one holds the guard's lock. Waiting for the lock there waits for itself forever (the UI hung with every
    thread in futex wait, 90 s after the storm). Here the same thread holds the lock when the handler runs."""
    rec = Recorder()
    guard = _guard(rec)
    guard._thread.start()
    returned = threading.Event()

    def first_handler_holding_the_lock() -> None:
        with guard._lock:
            guard.handle_signal(signal.SIGTERM, None)
            returned.set()

    inside = threading.Thread(target=first_handler_holding_the_lock, daemon=True)
    inside.start()
    assert returned.wait(5), "the nested signal handler blocked on the lock its own thread holds"
    guard.handle_signal(signal.SIGHUP, None)  # the lock is free again: this one triggers
    wait_until(lambda: rec.exits)
    assert guard.reason == "SIGHUP" and rec.exits == [exit_codes.INTERRUPTED]


def stopped_while_built(job_class: type, app, made_safe: list[bool]) -> type:
    """`job_class` whose construction runs the App's safe stop (make_safe_to_stop, on a thread of its own as the
    driver's SIGTSTP handler does) to its end: the stop lands after the starter's check and before the job is known,
    by program state, never by time. Each answer is appended to `made_safe`."""

    class StoppedWhileBuilt(job_class):  # type: ignore[misc,valid-type]  # a class chosen at run time
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            stopper = threading.Thread(target=lambda: made_safe.append(app.make_safe_to_stop()), name="tuner-stop")
            stopper.start()
            stopper.join(20)

    return StoppedWhileBuilt


def held_verify(monkeypatch, tmp_path, entered: threading.Event):
    """A card at +45 MHz and a profile of +90 proven on another card of its model (so applying it verifies), whose
    verify trial puts the value on the card, sets `entered` and holds until it is stopped (20 s at most)."""
    from dataclasses import replace

    from tests.actions.fakes import ClockOffsetSim
    from tests.tui.helpers import make_app
    from tuner.profiles import build_profile, save_profile

    def held_trial(backend, device_id, value, duration_s, workload, on_line, stop_event):
        if workload.record is not None:  # the stock reference, recorded first on this card: passes
            workload.record.write_text("{}")
            return "pass", None
        backend.apply(device_id, value)  # the trial runs with the profile's value on the card
        entered.set()
        stop_event.wait(20)
        return ("stopped", "stopped by you") if stop_event.is_set() else ("pass", None)

    monkeypatch.setattr("tuner.actions.verify.bisect_trial", held_trial)
    backend = ClockOffsetSim(gpus=1, state_path=tmp_path / "sim.json")
    backend.apply("sim0", 45)
    other = replace(backend.device("sim0"), serial="SIM-9999-00")  # same model, another card: a verify
    save_profile(build_profile("theirs", other, backend.knob("sim0"), 90, kernel="6.14.0-test"))
    return backend, make_app(tmp_path, backend=backend, samples=0, verify_duration_s=30.0)
