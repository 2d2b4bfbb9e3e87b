"""Issue 24, the Bisect screen: footer keys never type into the form (a field takes keys only while it visibly has
focus), fields wide enough for what they hold, the plan shown before a start, a failed start keeps the finished
result, notices in the UI's words, the shared export default, an unfinished session's trials shown on opening."""

from __future__ import annotations

import pytest
from textual.widgets import Input

from tests.tui.helpers import make_app, screen_text, sim_backend, until
from tests.tuning.fake_engine import FakeEngine
from tuner.screens.bisect import FIELDS, BisectScreen
from tuner.screens.dialogs import ConfirmDialog, KeepOrRevertDialog, TextInputDialog


@pytest.fixture(autouse=True)
def boot_id(boot):
    """Every test here runs on a fake /proc with a known boot id (the journal records it)."""


def _app(tmp_path, engine=None):
    backend = sim_backend(tmp_path, vmin_mv=-52)
    return make_app(tmp_path, backend=backend, samples=1,
                    bisect_options={"engine_factory": engine or FakeEngine(),
                                    "kernel_watcher_factory": lambda _card: None})


def _form(app) -> dict[str, str]:
    screen = next(s for s in app.screen_stack if isinstance(s, BisectScreen))
    return {p.id: screen.query_one(f"#in-{p.id}", Input).value for p in FIELDS}


async def _finished_bisect(app, pilot) -> None:
    await pilot.press("3")
    await until(pilot, lambda: isinstance(app.screen, BisectScreen), what="the Bisect screen")
    # short trials, and a coarse step from a floor near the card's limit (-52): a few trials reach a result
    for field_id, value in (("trial", "1s"), ("confirm", "2s"), ("step", "20"), ("resolution", "10"),
                            ("floor", "-60")):
        app.screen.query_one(f"#in-{field_id}", Input).value = value
    await pilot.press("b")
    await until(pilot, lambda: not app.bisect.running and app.bisect.outcome is not None, timeout_s=60,
                what="a finished bisect")
    await until(pilot, lambda: "RECOMMENDED" in screen_text(app), what="the result on screen")


async def _back_to_the_screen(app, pilot) -> None:
    """Close whatever a key opened (a dialog) and wait for the bisect a key started to end."""
    while not isinstance(app.screen, BisectScreen):
        top = app.screen
        assert isinstance(top, (TextInputDialog, ConfirmDialog, KeepOrRevertDialog)), top
        await pilot.press("escape")
        await until(pilot, lambda top=top: app.screen is not top, what="the dialog to close")
    await until(pilot, lambda: not app.bisect.running and not app.jobs_running(), timeout_s=60,
                what="the job a key started to end")


@pytest.mark.heavy(seconds=15)
async def test_footer_keys_after_a_finished_bisect_change_no_field(tmp_path):
    """The issue's sequence (a, k, v, e, b) and then every key the key bar shows: the form holds what it held."""
    app = _app(tmp_path)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await _finished_bisect(app, pilot)
        before = _form(app)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, KeepOrRevertDialog), what="keep or revert")
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog), what="the save dialog after keep")
        await pilot.press("v", "enter")  # the name field has visible focus (a heavy frame): saved as v...
        await until(pilot, lambda: isinstance(app.screen, BisectScreen))
        for key in ("e", "b", "v"):
            await pilot.press(key)
            await pilot.pause()
            await _back_to_the_screen(app, pilot)
            assert _form(app) == before, f"after {key!r}"
        keys = [b.key for b in app.screen.footer_bindings()]
        assert {"a", "v", "e", "b", "u"} <= set(keys), keys
        for key in keys + keys:  # twice: what one key leaves behind (g hides the table) meets every other key
            await pilot.press(key)
            await pilot.pause()
            if isinstance(app.screen, BisectScreen) and isinstance(app.screen.focused, Input):
                await pilot.press("escape")  # f: the form, visibly focused; esc leaves it
                await until(pilot, lambda: not isinstance(app.screen.focused, Input), what="esc leaves the form")
            await _back_to_the_screen(app, pilot)
            assert not isinstance(app.screen.focused, Input), f"a field kept focus after {key!r}"
            assert _form(app) == before, f"after {key!r}"


async def test_a_screen_with_nothing_focused_gives_focus_to_the_table_not_a_field(tmp_path):
    """Back from a dialog with nothing focused (a terminal that was too small, a click on a label), the screen's
    automatic focus went to its first focusable widget: the step field, so the footer's next `e` typed `e` there."""
    app = _app(tmp_path)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await _finished_bisect(app, pilot)
        before = _form(app)
        app.screen.set_focus(None)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog), what="the export dialog")
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, BisectScreen))
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog) or _form(app) != before,
                    what="the export dialog again")
        assert _form(app) == before
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, BisectScreen))
        assert not isinstance(app.screen.focused, Input)


async def test_each_field_is_labelled_and_shows_its_longest_valid_value_at_80x24(tmp_path):
    app = _app(tmp_path)
    longest = {"step": "100 mV", "resolution": "50 mV", "margin": "100 mV", "floor": "-200 mV", "trial": "1h30m",
               "confirm": "1h30m", "mode": "mixed"}
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, BisectScreen), what="the Bisect screen")
        for field_id, value in longest.items():
            app.screen.query_one(f"#in-{field_id}", Input).value = value
        labels = {p.id: p.label for p in FIELDS}
        await until(pilot, lambda: all(f"{labels[f]}: {v}" in screen_text(app) for f, v in longest.items()),
                    what="every field's label and whole value")


async def test_the_plan_is_shown_before_a_start_by_the_core_rule(tmp_path):
    from tuner.actions.bisect import bisect_estimate
    from tuner.tuning.job import BisectParams

    app = _app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, BisectScreen), what="the Bisect screen")
        est = bisect_estimate(app.backend, "sim0", BisectParams())
        await until(pilot, lambda: f"plan ≤{est.trials} trials, confirm 30m, ≤2h25m" in screen_text(app),
                    what="the default plan")
        app.screen.query_one("#in-trial", Input).value = "10s"
        app.screen.query_one("#in-floor", Input).value = "-100"
        est = bisect_estimate(app.backend, "sim0", BisectParams(trial_s=10, floor=-100))
        assert est.trials < 24 and est.duration_s == (est.trials - 1) * 10 + 1800
        await until(pilot, lambda: f"plan ≤{est.trials} trials, confirm 30m, ≤32m" in screen_text(app),
                    what="the plan after the form changed")


async def test_the_export_default_is_the_one_the_cli_and_profiles_use(tmp_path, monkeypatch):
    from tuner.actions.exports import report_export_path

    monkeypatch.chdir(tmp_path)
    app = _app(tmp_path)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await _finished_bisect(app, pilot)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog), what="the export dialog")
        expected = report_export_path("sim0", app.bisect.card("sim0").session)
        assert app.screen.query_one(Input).value == str(expected) and expected.parent == tmp_path
        await pilot.press("enter")
        await until(pilot, expected.exists, what="the export written")


async def test_a_trial_warning_is_said_and_stays_on_the_screen(tmp_path):
    """A bisect's warnings (a check at less than full strength, a clamped setting, a pause) were folded into the
    App's state and shown nowhere: the CLI prints each one. Now each is a toast, and the last stays in view, cut to
    what is left of the status's state line."""
    from tuner.app.state import BisectState, CardState
    from tuner.screens import messages as msg
    from tuner.tuning.events import TrialWarning

    app = _app(tmp_path)
    line = "clamped: the card limited its clock during the trial"
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, BisectScreen), what="the Bisect screen")
        app.bisect = BisectState(device_ids=("sim0",), cards={"sim0": CardState("sim0")})
        app.post_message(msg.BisectEventReceived(TrialWarning(line, device="sim0")))
        await until(pilot, lambda: any(line in n.message for n in app._notifications), what="the toast")
        [toast] = [n for n in app._notifications if line in n.message]
        assert toast.severity == "warning" and toast.message.startswith("sim0: ")
        app.clear_notifications()
        await until(pilot, lambda: "· warning: clamped: the car" in screen_text(app), what="the warning on screen")
        # on the state's line, cut to fit: the status takes no extra row (the SIMULATED note must stay in view)
        assert app.screen.query_one("#bisect-status").size.height == 2
        [shown] = [row for row in screen_text(app).splitlines() if "· warning:" in row]
        assert shown.startswith(" idle · b start") and shown.rstrip().endswith("…"), shown


async def test_a_form_value_that_looks_like_markup_is_refused_as_typed(tmp_path):
    """The plan line quotes a refused field as typed: `[/]` (or `[b]`) is text there, never Textual markup (it
    crashed the App with MarkupError: auto closing tag ('[/]') has nothing to close)."""
    app = _app(tmp_path)
    async with app.run_test(size=(160, 40)) as pilot:  # wide enough for the refusal in full
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, BisectScreen), what="the Bisect screen")
        await pilot.press("f")
        app.screen.query_one("#in-floor", Input).value = "[/]"
        await until(pilot, lambda: "got '[/]'" in screen_text(app), what="the refusal quoting the field as typed")
        app.screen.query_one("#in-floor", Input).value = "[b]x"
        await until(pilot, lambda: "got '[b]x'" in screen_text(app), what="the refusal quoting the field as typed")


async def test_a_trials_reason_is_shown_as_the_kernel_wrote_it(tmp_path):
    """The detail line under the trial table shows the selected trial's full reason: a kernel-log line quotes
    amdgpu's `[gfxhub]` (stress.md), which Textual's markup ate, and a `[/]` in it crashed the App."""
    from dataclasses import replace

    from tuner.app.jobs import apply_bisect_event
    from tuner.app.state import BisectState
    from tuner.tuning.events import SessionStarted, TrialFinished, TrialResult, TrialStarted

    reason = "kernel log: page-fault: amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24) [/]"
    state = BisectState.started(("sim0",))
    for event in (SessionStarted(session="s1", device="sim0", label="sim0", unit="mV", stock=0, resumed=False),
                  TrialStarted(index=1, setting=-40, unit="mV", phase="coarse", duration_s=60.0, started_at=0.0,
                               expected_trials=8, device="sim0"),
                  TrialFinished(index=1, device="sim0", result=TrialResult(
                      setting=-40, unit="mV", phase="coarse", verdict="fail", kind="kernel", reason=reason))):
        state = apply_bisect_event(state, event)
    app = _app(tmp_path)
    async with app.run_test(size=(160, 40)) as pilot:  # wide enough for the reason in full
        app.bisect = replace(state, running=False)
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, BisectScreen), what="the Bisect screen")
        await until(pilot, lambda: "[gfxhub] page fault (src_id:0 ring:24) [/]" in screen_text(app),
                    what="the reason as the kernel wrote it")
