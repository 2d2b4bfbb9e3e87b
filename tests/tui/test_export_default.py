"""Issue 24: one default for an export with no path given (tuner.actions.exports): the current directory, shown
in full in the UI's prompt, the same from the Profiles screen and the CLI (which had no default)."""

from __future__ import annotations

from tests.profiles.helpers import tuner
from tests.tui.helpers import make_app, open_profiles, screen_text, until
from tuner.actions.exports import profile_export_path
from tuner.profiles import build_profile, save_profile
from tuner.screens.dialogs import TextInputDialog


async def test_profiles_offers_the_full_default_path_and_writes_there(tmp_path, monkeypatch, backend):
    monkeypatch.chdir(tmp_path)
    save_profile(build_profile("mine", backend.device("sim0"), backend.knob("sim0"), -40))
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: "mine" in screen_text(app))
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog))
        field = app.screen.query_one("Input")
        assert field.value == str(tmp_path / "mine.toml") == str(profile_export_path("mine"))
        await pilot.press("enter")
        await until(pilot, lambda: (tmp_path / "mine.toml").exists())


def test_the_cli_writes_to_the_same_default(tmp_path, monkeypatch, capsys, backend):
    monkeypatch.chdir(tmp_path)
    save_profile(build_profile("mine", backend.device("sim0"), backend.knob("sim0"), -40))
    code, out, err = tuner(capsys, "profile", "export", "mine")
    assert code == 0, err
    assert (tmp_path / "mine.toml").exists() and str(tmp_path / "mine.toml") in out


def test_tuner_report_without_a_file_writes_the_default_in_the_current_directory(tmp_path, monkeypatch, capsys,
                                                                                  in_process_backend):
    from tuner.actions.exports import report_export_path
    from tuner.tuning.journal import Journal

    monkeypatch.chdir(tmp_path)
    session = Journal.create("sim0", params={}, knob={"unit": "mV"}, backend=in_process_backend)
    session.begin_trial("baseline", setting=0)
    session.finish_trial({"setting": 0, "unit": "mV", "phase": "baseline", "verdict": "pass"})
    code, out, err = tuner(capsys, "--simulate", "report")
    assert code == 0, err
    expected = report_export_path("sim0", session.doc["session"])
    assert expected.parent == tmp_path and expected.exists() and str(expected) in out


async def test_profiles_export_with_the_current_directory_gone_asks_for_a_path_and_keeps_running(
        tmp_path, monkeypatch, backend):
    """The shell's directory was removed under the UI (another shell's `rm -rf`): there is no default in it, so `e`
    asks for a path with none filled in and says why, instead of an exception that ends the UI with a traceback."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    save_profile(build_profile("mine", backend.device("sim0"), backend.knob("sim0"), -40))
    app = make_app(tmp_path, backend=backend, samples=1)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: "mine" in screen_text(app))
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog) or app.return_code is not None,
                    what="the export dialog (or the UI's end)")
        assert app.return_code is None and app.is_running
        assert app.screen.query_one("Input").value == ""
        assert "current directory" in screen_text(app)
        app.screen.query_one("Input").value = str(tmp_path / "mine.toml")
        await pilot.press("enter")
        await until(pilot, lambda: (tmp_path / "mine.toml").exists(), what="the export (a worker writes it)")
