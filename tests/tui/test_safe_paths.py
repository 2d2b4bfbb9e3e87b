"""Paths through the App that used to skip a rule the CLI keeps, driven the way a person would (keys, palette).

Each test failed before the rules moved into tuner.actions: the Tune screen wrote a value beyond one on the unsafe
list; a profile verified from the Profiles screen ran without the crash guard, with the default workload and
without its lock clock; the Bisect form sent 10/5/10 to a 15 MHz card; the palette offered Textual's own Quit.
"""

from __future__ import annotations

from dataclasses import replace

from tests.actions.fakes import ClockOffsetSim
from tests.polling import until
from tests.tui.helpers import make_app, open_profiles, screen_text, sim_backend
from tuner.profiles import build_profile, save_profile
from tuner.screens.dialogs import ConfirmDialog, KeepOrRevertDialog
from tuner.tuning import journal


async def _settle(app, pilot, rounds: int = 3) -> None:
    for _ in range(rounds):
        await app.workers.wait_for_complete()
        await pilot.pause()


async def test_tune_screen_refuses_a_value_beyond_the_unsafe_list(tmp_path):
    backend = sim_backend(tmp_path, vmin_mv=-60)
    journal.add_unsafe("sim0", -60, unit="mV", kind="hang", reason="froze", edge=True)
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("2")
        await pilot.pause()
        await pilot.press(*["pagedown"] * 2, "left", "left", "left", "left")  # 0 -> -50 -> -70
        await pilot.press("a")
        await _settle(app, pilot)
        assert not isinstance(app.screen, KeepOrRevertDialog)
        assert any("-70 mV is at or beyond -60 mV" in n.message for n in app._notifications)
    assert backend.knob("sim0").current == 0  # nothing was written


def _fake_trial(seen: list):
    """tuner.actions.verify's TrialRunner shape; records what the trial ran with and whether the guard was there."""

    def run(backend, device_id, value, duration_s, workload, on_line, stop_event):
        seen.append({"guard": journal.guard_path(device_id).exists(), "workload": workload,
                     "lock": backend.knob(device_id).lock_clock_mhz, "value": value})
        backend.apply(device_id, value)
        backend.reset(device_id)
        on_line("fault: canary mismatch at step 3")
        return "fail", "canary mismatch at step 3"

    return run


async def _verify_from_the_profiles_screen(app) -> None:
    """Apply the one saved profile from the Profiles screen, say yes to its verify, wait for the (failing) trial."""
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await pilot.press("a")
        await _settle(app, pilot)
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await _settle(app, pilot)
        await until(pilot, lambda: not app.stress.running)
        assert app.stress.verdict.startswith("verify fail"), app.stress.verdict


async def test_profile_verify_is_guarded_and_uses_the_profiles_workload_and_lock(tmp_path, monkeypatch):
    seen: list = []
    monkeypatch.setattr("tuner.actions.verify.bisect_trial", _fake_trial(seen))
    backend = ClockOffsetSim(gpus=1, state_path=tmp_path / "sim.json")
    backend.apply("sim0", 45)
    other = replace(backend.device("sim0"), serial="SIM-9999-00")  # same model, another card: a verify
    profile = build_profile("theirs", other, backend.knob("sim0"), 90, kernel="6.14.0-test",
                            tuning={"preset": "large", "mode": "gemm", "dtype": "float32"})
    save_profile(replace(profile, setting=replace(profile.setting, lock_clock_mhz=2400)))
    app = make_app(tmp_path, backend=backend, samples=0, verify_duration_s=30.0)
    await _verify_from_the_profiles_screen(app)
    [trial] = seen
    assert trial["guard"], "the verify ran without the crash guard"
    assert (trial["workload"].preset, trial["workload"].mode, trial["workload"].dtype) == ("large", "gemm", "float32")
    assert trial["lock"] == 2400 and trial["value"] == 90
    assert not journal.guard_path("sim0").exists()  # a finished trial removes it
    assert backend.knob("sim0").current == 45  # failed: back to the value before


async def test_bisect_form_blank_means_the_cards_defaults_in_its_unit(tmp_path, monkeypatch):
    from tuner.tuning.job import BisectJob, search_plan_params

    started: list = []

    def run(job):
        started.append(search_plan_params(job.backend.knob(job.device_ids[0]), job.params.search()))

    monkeypatch.setattr(BisectJob, "run", run)
    backend = ClockOffsetSim(gpus=1, state_path=tmp_path / "sim.json")
    app = make_app(tmp_path, backend=backend, samples=0)  # the App's first sample reads the knob
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await _settle(app, pilot)
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect" and bool(app.screen.query("#in-step")))
        inputs = {f: app.screen.query_one(f"#in-{f}") for f in ("step", "resolution", "margin", "trial", "mode")}
        assert {f: i.value for f, i in inputs.items()} == dict.fromkeys(inputs, "")
        assert {f: i.placeholder for f, i in inputs.items()} == {
            "step": "30 MHz", "resolution": "15 MHz", "margin": "30 MHz", "trial": "5m", "mode": "train"}
        await pilot.press("b")
        await _settle(app, pilot)
        errors = [n.message for n in app._notifications if n.severity == "error"]
        assert not errors, errors
    [plan] = started
    assert (plan.step, plan.resolution, plan.margin) == (30, 15, 30)


async def test_bisect_form_takes_a_value_with_the_cards_unit(tmp_path):
    from tuner.screens.bisect import parse_form

    params = parse_form({"step": "45 MHz", "trial": "90s"}, unit="MHz")
    assert (params.step, params.resolution, params.trial_s) == (45, None, 90.0)


async def test_palette_offers_one_quit_and_it_is_the_safe_one(tmp_path):
    backend = sim_backend(tmp_path)
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24)) as pilot:
        from tuner.app.palette import entries

        assert not [c for c in app.get_system_commands(app.screen) if c.title.lower() == "quit"]  # Textual's
        assert [e.title for e in entries(app, app.current_mode) if "quit" in e.title.lower()] == ["Quit (q)"]
        app.apply_setting("sim0", -20)  # an unconfirmed setting: quitting must ask first
        await _settle(app, pilot)
        assert isinstance(app.screen, KeepOrRevertDialog)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"quit")
        await until(pilot, lambda: "Quit (q)" in screen_text(app), what="the palette offers Quit")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the quit question")  # asked
        assert app.is_running
    assert backend.knob("sim0").current == -20  # still pending: nothing left behind the user's back


async def test_textuals_quit_action_takes_the_safe_path(tmp_path):
    backend = sim_backend(tmp_path)
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24)) as pilot:
        app.apply_setting("sim0", -20)
        await _settle(app, pilot)
        await app.run_action("app.quit")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        assert app.is_running


async def test_bisect_with_the_forms_defaults_runs_to_a_recommendation_on_a_mhz_card(tmp_path, boot):
    """The whole bisect (fake engine, real driver and plan) from a blank form on a 15 MHz clock-offset card."""
    from tests.tuning.fake_engine import FakeEngine

    backend = ClockOffsetSim(gpus=1, state_path=tmp_path / "sim.json", limit_mhz=150)
    app = make_app(tmp_path, backend=backend, samples=0,
                   bisect_options={"engine_factory": FakeEngine(), "kernel_watcher_factory": lambda _card: None})
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(app, pilot)
        await pilot.press("3")
        await pilot.pause()
        app.screen.query_one("#in-trial").value = "1s"
        app.screen.query_one("#in-confirm").value = "2s"
        await pilot.press("b")
        await until(pilot, lambda: not app.bisect.running, timeout_s=60)
        rec = app.bisect.card("sim0").recommendation
        assert rec is not None, app.bisect.card("sim0").failure
        # 30 MHz steps pass up to the 150 MHz limit; 180 and 165 fail; 150 confirms; minus the 30 MHz margin
        assert (rec.unit, rec.confirmed, rec.setting, rec.margin) == ("MHz", 150, 120, 30)
        assert [r["setting"] for r in app.bisect.card("sim0").trials][:7] == [0, 0, 30, 60, 90, 120, 150]
    assert backend.knob("sim0").current == 0


async def test_bisect_on_a_real_card_asks_first_as_the_cli_does(tmp_path, monkeypatch):
    from tests.actions.fakes import RealLookingSim
    from tuner.tuning.job import BisectJob

    started: list = []
    monkeypatch.setattr(BisectJob, "run", lambda job: started.append(job.device_ids[0]))
    backend = RealLookingSim(gpus=1, state_path=tmp_path / "sim.json")
    app = make_app(tmp_path, backend=backend, samples=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(app, pilot)
        await pilot.press("3", "b")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog) and "freeze" in str(app.screen.question)
        await pilot.press("escape")
        await _settle(app, pilot)
        assert not started and not app.bisect.running
        await pilot.press("b")
        await pilot.pause()
        await pilot.press("y")
        await _settle(app, pilot)
    assert started == ["sim0"]


async def test_profile_verify_compares_with_the_profiles_bundled_reference(tmp_path, monkeypatch):
    """The screen's verify used to ignore the reference saved beside the profile (the CLI's read it), so a profile
    carried with its proof was compared with a fresh recording on this card instead: one action decides now."""
    from tests.screen.helpers import bundle
    from tests.tui.helpers import sim_backend
    from tuner.profiles import reference_bundle as rb

    seen: list = []
    monkeypatch.setattr("tuner.actions.verify.bisect_trial", _fake_trial(seen))
    backend = sim_backend(tmp_path, vmin_mv=-30)
    other = replace(backend.device("sim0"), serial="SIM-9999-00")  # same model, another card: a verify
    path = save_profile(build_profile("carried", other, backend.knob("sim0"), -25, kernel="6.14.0-test"))
    rb.write_beside(bundle(tmp_path / "recorded"), path)
    app = make_app(tmp_path, backend=backend, samples=0, verify_duration_s=30.0)
    await _verify_from_the_profiles_screen(app)
    assert [t["workload"].record for t in seen] == [None], "a stock reference was recorded instead of the bundled one"
    [trial] = seen
    assert trial["workload"].reference is not None and trial["workload"].reference.name.startswith("trajectory-")
    assert backend.knob("sim0").current == 0
