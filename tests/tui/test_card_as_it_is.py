"""Issue 15, items 1-3: the screen shows the card as it is (at once, with units), every key is visible at 80x24,
and the Bisect screen fits 80 columns with an ETA from what trials really took."""

from __future__ import annotations

from tests.polling import until
from tuner.app.jobs import apply_card_event
from tuner.app.state import BisectState, CardState
from tuner.screens.dialogs import KeepOrRevertDialog
from tuner.tuning.events import TrialFinished, TrialProgress, TrialResult, TrialStarted
from tuner.widgets.key_bar import KeyBar

SCREENS = {"1": "Dashboard", "2": "Tune", "3": "Bisect", "4": "Profiles", "5": "Doctor", "6": "Help"}


def _text(widget) -> str:
    return str(widget.render())


async def test_apply_refreshes_the_screen_behind_the_dialog_with_units(app, backend):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        tune = app.screen
        await pilot.press("left", "left", "left")  # target -15 mV
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, KeepOrRevertDialog)
        assert "Applied -15 mV on sim0" in _text(app.screen.query_one("#keep-question"))
        head = _text(tune.query_one("#tune-head"))
        assert "setting -15 mV" in head and "MODIFIED" in head  # not the stale "+0 mV ... STOCK"
        assert "not applied" not in head
        await pilot.press("r")  # revert
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert backend.knob("sim0").current == 0
        head = _text(tune.query_one("#tune-head"))
        assert "setting +0 mV" in head and "STOCK" in head and "target +0 mV" in head


async def test_reset_refreshes_the_dashboard_at_once(app, backend):
    backend.apply("sim0", -30)
    async with app.run_test(size=(80, 24)) as pilot:
        app.sample_now()
        await app.workers.wait_for_complete()
        await pilot.pause()
        panel_setting = app.screen.query_one("#setting")
        assert "-30 mV" in _text(panel_setting)
        app.reset_to_stock("sim0")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "+0 mV" in _text(panel_setting) and "STOCK" in _text(panel_setting)


async def test_every_screen_shows_all_its_keys_and_quit_at_80x24(app):
    async with app.run_test(size=(80, 24)) as pilot:
        for key, title in SCREENS.items():
            await pilot.press(key)
            await pilot.pause()
            bar = app.screen.query_one(KeyBar)
            assert bar.region.bottom <= 24 and bar.region.height >= 1
            shown = bar.plain
            assert all(len(line) <= 80 for line in shown.splitlines())
            for binding in app.screen.footer_bindings():
                if binding.show and binding.description:
                    assert binding.description in shown, (title, binding.description, shown)
            # one card: `d` (next card) and `c` (card table) would do nothing, so they are not offered
            assert "Next card" not in shown and "Card table" not in shown, (title, shown)
            assert not app.screen.check_action("next_device", ()) and not app.screen.check_action("next_table", ())
            assert "q Quit" in shown and "^p Palette" in shown, (title, shown)
            nav = _text(app.screen.query_one("NavBar"))
            for name in SCREENS.values():
                assert f"{name} " in nav or f"{name}]" in nav, (name, nav)  # never "Dashbo" / "Profil"


def _result(setting, verdict="fail", kind="mismatch", reason="loss diverged from the stock reference at step 412"):
    return TrialResult(setting=setting, unit="mV", phase="descend", verdict=verdict, kind=kind, reason=reason or "",
                       duration_s=1.0, tok_s=900.0, power_w=210.0, tok_per_j=4.3, max_temp_c=71.0)


def test_a_trial_past_its_time_says_it_is_finishing_not_a_stale_eta():
    """A trial ends at a step boundary (a slow step; in a rig, the peers): past its nominal time the bar stays at
    100 % and the line says the trial is finishing, on the card's own screen and on its ALL CARDS line."""
    from tuner.screens.bisect import rig_card_line
    from tuner.tuning.events import FINISHING

    state = CardState(device_id="sim0", running=True, unit="mV")
    state = apply_card_event(state, TrialStarted(index=2, setting=-10, unit="mV", phase="descend", duration_s=10.0,
                                                   started_at=0.0, expected_trials=4), now_s=0.0)
    on_time = apply_card_event(state, TrialProgress(setting=-10, phase="descend", elapsed_s=6.0, duration_s=10.0,
                                                      eta_s=4.0, step=60), now_s=6.0)
    over = apply_card_event(state, TrialProgress(setting=-10, phase="descend", elapsed_s=13.0, duration_s=10.0,
                                                   eta_s=0.0, step=130), now_s=13.0)
    assert on_time.current["finishing"] is False and over.current["finishing"] is True
    assert over.current["progress"] == 1.0
    lines = {name: rig_card_line(BisectState(device_ids=("sim0",), running=True, cards={"sim0": s}), "sim0",
                                 selected=True).plain for name, s in (("on time", on_time), ("over", over))}
    assert FINISHING not in lines["on time"] and "60 %" in lines["on time"]
    assert FINISHING in lines["over"] and "100 %" in lines["over"], lines


def test_eta_comes_from_measured_wall_time_per_trial():
    state = CardState(device_id="sim0", running=True)
    state = apply_card_event(state, TrialStarted(index=1, setting=0, unit="mV", phase="baseline", duration_s=1.0,
                                                   started_at=0.0, expected_trials=4), now_s=100.0)
    # the first trial really took 5 s (engine start, reference, reset), not its nominal 1 s
    state = apply_card_event(state, TrialStarted(index=2, setting=-10, unit="mV", phase="descend",
                                                   duration_s=1.0, started_at=0.0, expected_trials=4), now_s=105.0)
    assert state.current["eta_s"] == 5.0
    state = apply_card_event(state, TrialProgress(setting=-10, phase="descend", elapsed_s=0.5, duration_s=1.0,
                                                    eta_s=0.5, eta_total_s=2.5), now_s=106.0)
    assert state.current["eta_s"] == 4.0  # 5 s expected, 1 s gone
    assert state.current["eta_total_s"] == 14.0  # this trial's 4 s and two more nominal seconds, 5x each


async def test_bisect_table_fits_80_columns_with_a_detail_line_and_a_full_bar(app):
    rows = (_result(0, "pass", None, None), _result(-10, "pass", None, None), _result(-20))
    state = CardState(device_id="sim0", unit="mV")
    for r in rows:
        state = apply_card_event(state, TrialStarted(index=1, setting=r.setting, unit="mV", phase="descend",
                                                       duration_s=1.0, started_at=0.0))
        state = apply_card_event(state, TrialFinished(index=1, result=r))
    async with app.run_test(size=(80, 24)) as pilot:
        app.bisect = BisectState(device_ids=("sim0",), cards={"sim0": state})
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect"
                    and app.screen.query_one("#bisect-trials").row_count == len(rows))
        screen = app.screen
        table = screen.query_one("#bisect-trials")
        assert sum(c.get_render_width(table) for c in table.columns.values()) <= 78  # every column on screen
        assert "mismatch" in table.get_row_at(2)
        detail = _text(screen.query_one("#bisect-detail"))
        assert "-20 mV" in detail and "loss diverged from the stock reference at step 412" in detail
        assert screen.query_one("#bisect-progress").percentage == 1.0  # FINISHED reads 100 %
        assert not screen.query_one("#plot-efficiency").display
        await pilot.press("g")  # the plot takes the table's place at 80 columns
        await pilot.pause()
        assert screen.query_one("#plot-efficiency").display and not table.display


# --- item 7: words for people ----------------------------------------------------------------------------------
def test_cli_flags_become_the_ui_keys():
    from tuner.app.jobs import BisectRunner
    from tuner.app.words import for_people, job_name

    assert for_people("stopped; resume with --resume") == "stopped; u resumes it on the Bisect screen (3)"
    assert for_people("stopped; resume with --resume", here="bisect") == "stopped; u resumes it"  # already there
    text = for_people("an unfinished bisect session exists for sim0 (s1, 3 trials done); continue it with "
                      "--resume or discard it with --restart (the unsafe list is kept)")
    assert "--" not in text and "u continues it and n starts afresh" in text
    assert "--" not in for_people("/x/a.toml already exists; nothing was written; pass --overwrite to replace it")
    assert job_name(BisectRunner(lambda: None, ("sim0",))) == "the auto-bisect"


def test_a_users_stop_reads_stopped_by_you():
    from tests.engine.examples import example
    from tuner.app.jobs import apply_stress_event
    from tuner.app.state import StressState
    from tuner.tuning.events import BisectStopped

    end = example("end", verdict="error", kind="interrupted", reason="interrupted by SIGTERM", steps=431,
                  exit_code=130, median_tok_s=None)
    stopping = StressState(device_id="sim0", running=True, stopping=True)
    assert apply_stress_event(stopping, end).log[-1] == "stopped by you after 431 steps (no fault seen)"
    stopped = apply_card_event(CardState(device_id="sim0", running=True),
                                 BisectStopped(reason="stopped on request", resumable=True))
    assert stopped.failure == "stopped by you; u resumes it"


# --- items 4 and 5: act on the result; honest numbers -------------------------------------------------------------
def _finished_state(rec) -> BisectState:
    """The App's state after a bisect of sim0 that recommended `rec` (the job ended: its outcome is there)."""
    from tuner.tuning.job import BisectOutcome, CardOutcome

    card = CardOutcome("recommended", 0, None, recommendation=rec)
    return BisectState(device_ids=("sim0",), cards={"sim0": CardState("sim0", unit="mV", recommendation=rec)},
                       outcome=BisectOutcome("recommended", 0, {"sim0": card}, {"sim0": rec.setting}))


def _recommendation(setting=-40):
    from tuner.tuning.events import Recommendation

    return Recommendation(device="sim0", unit="mV", setting=setting, confirmed=-50, lowest_pass=-50,
                          first_failure=-60, margin=10, edge=False, baseline_tok_per_j=23.8005328005328,
                          tuned_tok_per_j=25.104, measured_at=-50, efficiency_gain_pct=5.4789)


async def test_apply_the_recommendation_then_keep_offers_to_save(app, backend):
    from tuner.screens.dialogs import TextInputDialog

    async with app.run_test(size=(80, 24)) as pilot:
        rec = _recommendation()
        app.bisect = _finished_state(rec)
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect"
                    and "tok/J" in _text(app.screen.query_one("#bisect-result")))
        result = _text(app.screen.query_one("#bisect-result"))
        assert "tok/J 23.80 at stock, 25.10 at -50 mV (+5.5 %)" in result  # rounded, with where it was measured
        assert "SIMULATED card" in result and "not a real gain" in result
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, KeepOrRevertDialog) and backend.knob("sim0").current == -40
        await pilot.press("k")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert backend.knob("sim0").current == -40
        assert isinstance(app.screen, TextInputDialog)  # kept: now offered as a profile
        await pilot.press("escape")


# --- item 9: dashboard ----------------------------------------------------------------------------------------------
async def test_dashboard_shows_fan_vram_power_cap_and_limits(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: bool(app.screen.query("#figures"))
                    and "limits:" in _text(app.screen.query_one("#figures")))
        figures = _text(app.screen.query_one("#figures"))
        assert "of 300 W" in figures and "fan " in figures  # the cap has its unit, not a bare 300 and "%" in figures
        assert "VRAM 0.4/32 GiB" in figures and "limits: n/a" in figures  # the AMD-style card, as real amdgpu


def test_plots_get_a_minimum_span_and_round_ticks():
    from tuner.widgets.history_plot import nice_axis

    lo, hi, ticks = nice_axis([15.0, 15.2, 15.1], 20.0)  # an idle card: a flat line, not noise filling the plot
    assert hi - lo >= 20.0 and all(t == int(t) and int(t) % 5 == 0 for t in ticks)
    assert nice_axis([15.0, 297.3], 20.0) == (0, 300, [0, 100, 200, 300])


async def test_a_backend_that_cannot_read_limit_reasons_shows_n_a_not_none(tmp_path):
    """AMD reports throttle_reasons None (only in the binary gpu_metrics): "limits: none" would claim that no
    limit is active."""
    from dataclasses import replace

    from tests.tui.helpers import make_app, sim_backend

    backend = sim_backend(tmp_path)
    read = backend.telemetry
    backend.telemetry = lambda device_id: replace(read(device_id), throttle_reasons=None)
    app = make_app(tmp_path, backend=backend, samples=3)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: bool(app.screen.query("#figures"))
                    and "limits:" in _text(app.screen.query_one("#figures")))
        figures = _text(app.screen.query_one("#figures"))
        assert "limits: n/a" in figures and "limits: none" not in figures


def test_limits_text_says_none_only_when_none_were_read():
    from tuner.widgets.device_panel import limits_text

    assert limits_text(None) == "n/a"
    assert limits_text(()) == "none"
    assert limits_text(("power cap", "hw thermal")) == "power cap, hw thermal"
