"""Issue 21: the Bisect screen and the App read and write no file on Textual's event-loop thread (the main thread
under run_test): the remembered form, the journal, the unsafe list (the plan), the export and the saved profile
are each reached from a thread worker."""

from __future__ import annotations

import contextlib
import threading

import pytest

from tests.polling import until
from tests.tui.helpers import make_app, sim_backend
from tests.tuning.fake_engine import FakeEngine
from tuner.screens.dialogs import TextInputDialog

FILE_FUNCTIONS = (  # (module, name): what the Bisect screen and the App's bisect save reach files through
    ("tuner.app.form_memory", "recall"),
    ("tuner.app.form_memory", "remember"),
    ("tuner.app.jobs", "unfinished_session"),
    ("tuner.actions.bisect", "bisect_estimate"),
    ("tuner.actions.report", "write_report"),
    ("tuner.actions.profile_store", "save_profile"),
)


@pytest.fixture(autouse=True)
def boot_id(boot):
    """A fake /proc with a known boot id (the journal records it)."""


async def test_the_bisect_screens_file_work_runs_off_the_ui_thread(tmp_path, monkeypatch):
    import importlib

    calls: dict[str, list[bool]] = {}  # name -> for each call: was it on the main (event-loop) thread

    for module_name, name in FILE_FUNCTIONS:
        module = importlib.import_module(module_name)
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.setdefault(_name, []).append(threading.current_thread() is threading.main_thread())
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)

    backend = sim_backend(tmp_path, vmin_mv=-52)
    app = make_app(tmp_path, backend=backend, samples=1,
                   bisect_options={"engine_factory": FakeEngine(), "kernel_watcher_factory": lambda _card: None})
    out = tmp_path / "trials.csv"
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        assert threading.current_thread() is threading.main_thread()  # the event loop runs here
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect" and {"recall", "unfinished_session",
                                                                      "bisect_estimate"} <= calls.keys())
        await until(pilot, lambda: "plan" in str(app.screen.query_one("#bisect-plan").render()))
        for field_id, value in (("trial", "1s"), ("confirm", "2s")):
            app.screen.query_one(f"#in-{field_id}").value = value
        await pilot.press("b")
        await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None)
        await until(pilot, lambda: "RECOMMENDED" in str(app.screen.query_one("#bisect-result").render()))
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog))
        app.screen.query_one("#text").value = str(out)
        await pilot.press("enter")
        await until(pilot, lambda: any(n.message.startswith("exported the trials") for n in app._notifications))
        await until(pilot, lambda: not isinstance(app.screen, TextInputDialog))
        await pilot.press("v")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog))
        await pilot.press("enter")
        await until(pilot, lambda: any(n.message.startswith("saved profile") for n in app._notifications))
    assert out.exists()
    assert {name for _m, name in FILE_FUNCTIONS} <= calls.keys(), calls
    on_ui_thread = {name for name, threads in calls.items() if any(threads)}
    assert not on_ui_thread, f"file work on the UI thread: {sorted(on_ui_thread)}"


async def test_a_start_before_the_remembered_form_arrives_waits_for_it(tmp_path, monkeypatch):
    """The form's remembered values are read in a worker: b pressed before they arrive must not start with a blank
    form (the default 5-minute trials), but start once they are filled in, with them."""
    from tuner.app import form_memory
    from tuner.tuning.job import BisectJob

    backend = sim_backend(tmp_path, vmin_mv=-52)
    form_memory.remember(backend.device("sim0"), {"trial": "7s", "confirm": "9s"})
    release = threading.Event()
    real_recall = form_memory.recall

    def slow_recall(device):
        release.wait(20)
        return real_recall(device)

    monkeypatch.setattr(form_memory, "recall", slow_recall)
    started: list = []
    monkeypatch.setattr(BisectJob, "run", lambda job: started.append(job.params))
    app = make_app(tmp_path, backend=backend, samples=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect" and bool(app.screen.query("#in-trial")))
        await pilot.press("b")
        await pilot.pause()
        assert started == [] and not app.bisect.running  # waiting for the form, not started with a blank one
        release.set()
        await until(pilot, lambda: started != [], what="the start, once the form is filled in")
    [params] = started
    assert (params.trial_s, params.confirm_s) == (7.0, 9.0)


async def test_a_fifo_at_the_form_memory_is_refused_in_one_line_and_b_starts(tmp_path, monkeypatch):
    """Reading a FIFO blocks until something writes to it: the recall never came back, so b never started."""
    import os

    from tuner.app import form_memory
    from tuner.tuning.job import BisectJob

    path = form_memory._path()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    started: list = []
    monkeypatch.setattr(BisectJob, "run", lambda job: started.append(job.params))
    app = make_app(tmp_path, backend=sim_backend(tmp_path, vmin_mv=-52), samples=0)
    try:
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await pilot.press("3")
            await until(pilot, lambda: app.current_mode == "bisect" and bool(app.screen.query("#in-trial")))
            await pilot.press("b")
            await until(pilot, lambda: started != [], timeout_s=10, what="the start, with the blank form")
            notes = [n.message for n in app._notifications if "FIFO" in n.message]
            assert len(notes) == 1 and str(path) in notes[0] and "\n" not in notes[0], notes
    finally:  # on the code before the fix, a worker is still blocked opening the FIFO: a writer lets it go
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert path.is_fifo()  # not ours to replace


async def test_a_fifo_at_the_form_memory_is_said_once_not_at_every_card_switch(tmp_path, monkeypatch):
    """The form is recalled for each card `d` selects: the FIFO's line came again at every switch (two cards, ALL CARDS
    and back: four toasts saying the same thing). Said once per file in a session."""
    import os

    from tuner.app import form_memory

    path = form_memory._path()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    recalls: list[str] = []
    real_recall = form_memory.recall

    def counted(device):
        try:
            return real_recall(device)
        finally:
            recalls.append(device.id)

    monkeypatch.setattr(form_memory, "recall", counted)
    app = make_app(tmp_path, backend=sim_backend(tmp_path, gpus=2, vmin_mv=-52), samples=0)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect" and len(recalls) == 1 and not app.screen._recalls)
        for switches in (2, 3, 4):  # sim1, ALL CARDS, sim0
            await pilot.press("d")
            await until(pilot, lambda n=switches: len(recalls) == n and not app.screen._recalls,
                        what=f"recall {switches}")
        notes = [n.message for n in app._notifications if "FIFO" in n.message]
    assert len(notes) == 1 and str(path) in notes[0], notes
    assert path.is_fifo()


def _a_slow_form_recall(tmp_path, monkeypatch, gpus: int):
    """An App whose BisectJob only records that it was started, and a form recall that waits for `release`."""
    from tuner.app import form_memory
    from tuner.tuning.job import BisectJob

    release = threading.Event()
    real_recall = form_memory.recall

    def slow_recall(device):
        release.wait(20)
        return real_recall(device)

    started: list = []
    monkeypatch.setattr(BisectJob, "run", lambda job: started.append(job))
    app = make_app(tmp_path, backend=sim_backend(tmp_path, gpus=gpus, vmin_mv=-52), samples=0)
    return app, release, started, lambda: monkeypatch.setattr(form_memory, "recall", slow_recall)


async def _b_while_the_form_is_on_its_way(app, pilot, slow_recalls) -> None:
    """The Bisect screen open, its first recall done; then the card's form on its way again (as when the screen
    opens) and b pressed before it arrives."""
    await pilot.press("3")
    await until(pilot, lambda: app.current_mode == "bisect" and bool(app.screen.query("#in-trial"))
                and not app.screen._recalls, what="the first recall")
    slow_recalls()
    app.screen._recall_form()
    await pilot.press("b")


async def test_a_start_waiting_for_the_form_is_cancelled_when_d_chooses_another_card(tmp_path, monkeypatch):
    """b on sim0, then d before sim0's remembered form arrived: the deferred start ran on sim1 (the card d chose,
    with sim1's form), a bisect of a card b was never pressed for. The card changed: the start is cancelled, said."""
    app, release, started, slow_recalls = _a_slow_form_recall(tmp_path, monkeypatch, gpus=2)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await _b_while_the_form_is_on_its_way(app, pilot, slow_recalls)  # b on sim0
        await pilot.press("d")
        assert app.selected_device_id == "sim1" and not app.bisect.running
        release.set()
        await until(pilot, lambda: not app.screen._recalls, what="both recalls")
        await pilot.pause()
        cancelled = [n.message for n in app._notifications if "not started" in n.message]
        assert not app.bisect.running and started == [], app.bisect.device_ids
        assert len(cancelled) == 1 and "sim0" in cancelled[0], [n.message for n in app._notifications]


async def test_x_before_the_remembered_form_arrives_cancels_the_start_b_asked_for(tmp_path, monkeypatch):
    """b, then x (stop) before the card's remembered form arrived: x found nothing running and did nothing, and the
    bisect started anyway once the form came. x cancels the start that is waiting, and says so."""
    app, release, started, slow_recalls = _a_slow_form_recall(tmp_path, monkeypatch, gpus=1)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await _b_while_the_form_is_on_its_way(app, pilot, slow_recalls)
        await pilot.press("x")
        release.set()
        await until(pilot, lambda: not app.screen._recalls, what="the recall")
        await pilot.pause()
        assert started == [] and not app.bisect.running, "x was pressed, and the bisect started anyway"
        assert any("not started" in n.message for n in app._notifications), [n.message for n in app._notifications]
