"""Stress from the Tune screen with the real engine (tiny preset, CPU): start/stop, screen switches, a fault."""

from __future__ import annotations

import pytest

from tests.tui.helpers import make_app, open_profiles, sim_backend, until

pytest.importorskip("tuner.tuning.engine_client", reason="the stress engine client is not in this checkout")
pytestmark = pytest.mark.timeout(300)


async def _wait(pilot, predicate, timeout_s: float = 90.0):
    """Engine runs on a loaded 2-core box: a generous bound, checked by the clock (tests.tui.helpers.until)."""
    await until(pilot, predicate, timeout_s=timeout_s)


async def test_stress_start_survives_screens_then_stop(tmp_path):
    """A stress run survives screen switches, and an apply on its card is refused while it runs: the first run
    records the card's stock reference, and a setting kept meanwhile made a reference recorded partly at -70 mV the
    cached stock one (every later run compared with it); a run's result is for the setting it ran at."""
    backend = sim_backend(tmp_path)
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("2", "s")
        await _wait(pilot, lambda: len(app.stress.steps) >= 3)
        assert backend._loaded("sim0")  # the simulated card knows it is under load
        for key in "134562":
            await pilot.press(key)
            await pilot.pause()
        assert app.stress.running
        await pilot.press("left", "a")
        try:
            await _wait(pilot, lambda: any("stop it first" in str(n.message) for n in app._notifications),
                        timeout_s=30)
            assert app.pending is None and backend.knob("sim0").current == 0 and app.stress.running
        except BaseException:
            app.stop_stress()  # a failure must not leave the hour-long run for the App's exit to wait on
            raise
        await _wait(pilot, lambda: "RUNNING" in str(app.screen.query_one("#stress-status").render()))
        await pilot.press("s")
        await _wait(pilot, lambda: not app.stress.running)
        assert "stopped by you" in app.stress.verdict
        assert not backend._loaded("sim0")
        assert backend.knob("sim0").current == 0


async def test_stress_below_the_limit_without_a_reference_asks_then_reports_the_fault_and_the_check_it_lacked(
        tmp_path):
    """Issue 24 item 2: after an undervolt there is no stock reference to compare with. `s` asks first; run without
    it and the screen says the comparison is OFF for the whole run (not only in the scrolling log), and the
    summary says it did not run."""
    from tuner.screens.dialogs import ConfirmDialog

    backend = sim_backend(tmp_path, vmin_mv=-60)
    backend.apply("sim0", -70)  # below the simulated card's limit: the engine is told to flip bits
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2", "s")
        await _wait(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        question = str(app.screen.query_one("#question").render())
        assert "no stock reference" in question and "-70 mV" in question and "OFF" in question
        assert not app.stress.running  # nothing starts before the answer
        await pilot.press("y")
        await _wait(pilot, lambda: app.stress.detector("reference") == "OFF")
        await _wait(pilot, lambda: "reference comparison OFF" in str(app.screen.query_one("#stress-status").render()))
        await _wait(pilot, lambda: not app.stress.running and app.stress.verdict is not None)
        assert app.stress.verdict.startswith("FAIL"), app.stress.verdict
        assert "the stock-reference comparison did not run" in app.stress.verdict
        assert any(v.startswith("FAULT") for _, v in app.stress.detectors)
        await _wait(pilot, lambda: "FAULT" in str(app.screen.query_one("#stress-status").render()))
        assert "reference comparison OFF" in str(app.screen.query_one("#stress-status").render())
    assert backend.knob("sim0").current == -70  # stress never changes the setting


async def test_no_to_the_reference_question_starts_nothing(tmp_path):
    from tuner.screens.dialogs import ConfirmDialog

    backend = sim_backend(tmp_path, vmin_mv=-60)
    backend.apply("sim0", -40)
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2", "s")
        await _wait(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.press("n")
        await _wait(pilot, lambda: not isinstance(app.screen, ConfirmDialog))
        assert not app.stress.running and app.stress.run == 0 and not backend._loaded("sim0")
    assert backend.knob("sim0").current == -40


async def test_profile_from_another_card_is_verified_and_reverted_when_it_fails(tmp_path):
    """A profile proven on another card of the same model is verified on this one before it is kept: a stock
    reference recorded first (as long as the trial), then the trial at -70, 10 mV past this card's limit, fails and
    the card is reverted. The simulated fault is seeded and lands on the trial's first steps, so a 1 s trial (and a
    1 s reference, which holds those steps) is plenty (the verdict does not depend on the length; the product's
    default is 5 minutes)."""
    from dataclasses import replace

    from tuner.profiles import build_profile, save_profile
    from tuner.screens.dialogs import ConfirmDialog

    backend = sim_backend(tmp_path, vmin_mv=-60)
    other = replace(backend.device("sim0"), serial="SIM-9999-00")  # same model, another card
    save_profile(build_profile("theirs", other, backend.knob("sim0"), -70))
    app = make_app(tmp_path, backend=backend, samples=1, verify_duration_s=1.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await pilot.press("a")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await _wait(pilot, lambda: app.stress.running)
        await _wait(pilot, lambda: not app.stress.running)
        assert app.stress.verdict.startswith("verify fail"), app.stress.verdict
    assert backend.knob("sim0").current == 0  # below this card's limit: reverted


async def test_the_first_stress_records_a_stock_reference_and_later_runs_compare_with_it(tmp_path):
    """Issue 15 item 8: a manual stress checks what a bisect trial checks. At stock with no reference it records
    one (cached per card and workload in the state dir); the next run, below the limit, compares with it."""
    from tuner.actions.stress import StressRequest, cached_reference

    backend = sim_backend(tmp_path, vmin_mv=-60)
    app = make_app(tmp_path, backend=backend, samples=1, stress_options={"reference_record_s": 1.0})
    request = StressRequest("sim0", preset="tiny", mode="train")
    ref = cached_reference(backend.device("sim0"), backend.stress_target("sim0"), request).path
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2", "s")
        # the stress run's own steps: the recording's steps are still shown after the reference is "ok", until the
        # stress run starts (RunStarted clears them); a stop between the two is "stopped before it started". And the
        # recording is read from the log, not caught while it lasts (a busy loop can miss a state that short).
        await _wait(pilot, lambda: "engine: the stress run" in app.stress.log and len(app.stress.steps) >= 3)
        assert app.stress.detector("reference") == "ok"
        assert any(line.startswith("reference: none yet for this card and workload: recording it first")
                   for line in app.stress.log), app.stress.log
        assert ref.exists()
        assert app.stress.detector("kernel log") == "n/a (simulated)"  # said, not silently off
        await pilot.press("s")
        await _wait(pilot, lambda: not app.stress.running)
        assert "stopped by you" in app.stress.verdict
        backend.apply("sim0", -70)
        app.sample_now()
        # the Tune screen knows the card's new value before s is pressed
        await _wait(pilot, lambda: getattr(app.histories["sim0"].knob, "current", None) == -70)
        await pilot.press("s")
        await _wait(pilot, lambda: not app.stress.running and app.stress.verdict is not None
                    and app.stress.run == 2)
        assert app.stress.detector("reference") != "recording"  # compared with the cached one, not re-recorded
        assert app.stress.verdict.startswith("FAIL"), app.stress.verdict
    assert any("compared with it" in line or "reference" in line for line in app.stress.log)
