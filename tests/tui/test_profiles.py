"""Profiles screen: save (from a bisect result), apply (identity rules + keep-or-revert), export, import, delete."""

from __future__ import annotations

from tests.tui.helpers import make_app, open_profiles, screen_text, sim_backend, until
from tuner.app.state import BisectState, CardState
from tuner.profiles import build_profile, list_profiles, save_profile
from tuner.screens.dialogs import ConfirmDialog, KeepOrRevertDialog, TextInputDialog


def _save(backend, name: str, value: int, *, serial: str | None = None):
    device = backend.device("sim0")
    if serial:
        from dataclasses import replace

        device = replace(device, serial=serial)
    return save_profile(build_profile(name, device, backend.knob("sim0"), value))


async def _type(pilot, text: str):
    await pilot.press(*[("full_stop" if c == "." else "slash" if c == "/" else c) for c in text])


def _finished(setting: int) -> BisectState:
    """The App's state after a bisect of sim0 that recommended `setting` (the job ended: its outcome is there)."""
    from tuner.tuning.events import Recommendation
    from tuner.tuning.job import BisectOutcome, CardOutcome

    rec = Recommendation(device="sim0", unit="mV", setting=setting, confirmed=setting - 10, lowest_pass=setting - 10,
                         first_failure=setting - 15, margin=10, edge=False)
    card = CardOutcome("recommended", 0, None, recommendation=rec)
    return BisectState(device_ids=("sim0",), cards={"sim0": CardState("sim0", recommendation=rec)},
                       outcome=BisectOutcome("recommended", 0, {"sim0": card}, {"sim0": setting}))


async def test_save_recommendation_as_profile(app):
    async with app.run_test(size=(80, 24)) as pilot:
        app.bisect = _finished(-40)
        await pilot.press("3", "v")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog), what="the save dialog")
        assert isinstance(app.screen, TextInputDialog)
        await pilot.press("ctrl+a", "ctrl+k")
        await _type(pilot, "mycard")
        await pilot.press("enter")
        await pilot.pause()
    [profile] = list_profiles()
    assert (profile.name, profile.setting.value, profile.device.serial) == ("mycard", -40, "SIM-0000-00")


async def test_save_waits_for_the_bisect_to_end(app):
    """The recommendation arrives a moment before the job ends with its outcome (the evidence a profile records):
    until then `v` says so and saves nothing."""
    from dataclasses import replace

    async with app.run_test(size=(80, 24)) as pilot:
        app.bisect = replace(_finished(-40), outcome=None, running=True)
        await pilot.press("3", "v")
        await pilot.pause()
        assert not isinstance(app.screen, TextInputDialog)
    assert list_profiles() == []


async def test_apply_profile_on_the_same_card_then_keep(app, backend):
    _save(backend, "mine", -25)
    async with app.run_test(size=(100, 30)) as pilot:
        await open_profiles(pilot, app)
        sentence = "On sim0: the same card (serial matches). Press a to apply it"
        await until(pilot, lambda: sentence in str(app.screen.query_one("#profile-detail").render()),
                    what="the profile's detail (a worker reads it)")
        detail = str(app.screen.query_one("#profile-detail").render())
        assert "SAME CARD" not in detail and "#SIM" not in detail  # sentences, not enum names or fingerprints
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: isinstance(app.screen, KeepOrRevertDialog), what="the keep-or-revert dialog")
        assert isinstance(app.screen, KeepOrRevertDialog)
        assert backend.knob("sim0").current == -25
        await pilot.press("k")
        await app.workers.wait_for_complete()
        await pilot.pause()
    assert backend.knob("sim0").current == -25


async def test_profile_from_another_card_needs_a_trial(app, backend):
    _save(backend, "theirs", -25, serial="SIM-9999-00")
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the verify-first question")
        assert isinstance(app.screen, ConfirmDialog)  # verify first? default No
        await pilot.press("escape")
        await pilot.pause()
    assert backend.knob("sim0").current == 0


async def test_export_delete_import(app, backend, tmp_path):
    _save(backend, "roundtrip", -30)
    out = tmp_path / "exported.toml"
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog), what="the export dialog")
        await pilot.press("ctrl+a", "ctrl+k")
        app.screen.query_one("Input").value = str(out)
        await pilot.press("enter")
        await until(pilot, out.exists, what="the export (a worker writes it)")

        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the delete question")
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await until(pilot, lambda: list_profiles() == [], what="the delete (a worker removes it)")
        await until(pilot, lambda: app.screen.query_one("#profiles-table").row_count == 0, what="the emptied list")

        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog), what="the import dialog")
        app.screen.query_one("Input").value = str(out)
        await pilot.press("enter")
        await until(pilot, lambda: app.screen.query_one("#profiles-table").row_count == 1, what="the imported row")
        assert [p.name for p in list_profiles()] == ["roundtrip"]


async def test_import_of_a_bad_file_is_a_notification(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[profile]\nname = 'x'\n")
    app = make_app(tmp_path, backend=sim_backend(tmp_path), samples=1)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await open_profiles(pilot, app)
        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog), what="the import dialog")
        app.screen.query_one("Input").value = str(bad)
        await pilot.press("enter")
        await until(pilot, lambda: any("schema" in n.message or "missing" in n.message for n in app._notifications),
                    what="the import's error (from a worker)")
        assert list_profiles() == []


async def test_a_card_name_that_looks_like_markup_is_listed_as_written(app, backend):
    """The wide table's card column shows the card's name from the profile file (any text but control characters):
    `[bold]` in it was read as a style and `[/]` crashed the App (MarkupError) at 120 columns."""
    from dataclasses import replace

    device = replace(backend.device("sim0"), name="Radeon [/] [bold]Pro")
    save_profile(build_profile("odd-name", device, backend.knob("sim0"), -30))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: "Radeon [/] [bold]Pro [SIMULATED]" in screen_text(app),
                    what="the card's name as written")


async def test_the_verify_question_quotes_the_profiles_serial_as_written(app, backend):
    """Another card of the same model: the question names the profile's serial (any text the file holds); `[b]`
    in it was eaten as a style (the dialog said `serial SN7`), and a `[/]` left over crashed the App."""
    from textual.widgets import Static

    _save(backend, "theirs", -25, serial="SN[b]7[/]")
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the verify question")
        question = app.screen.query_one("#question", Static)
        await until(pilot, lambda: "(serial SN[b]7[/]," in str(question.render()), what="the serial as written")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmDialog), what="the question to close")
    assert backend.knob("sim0").current == 0


async def test_a_card_name_with_format_characters_cannot_reorder_the_screen(app, backend):
    """A profile file's card name may hold any character but ASCII controls: a bidi override (U+202E) or a C1
    control (U+009B, CSI) went to the terminal as they were, in the table and the detail, where a card's own name
    has them escaped (DeviceInfo.label)."""
    from dataclasses import replace

    device = replace(backend.device("sim0"), name="Radeon\u202eXT\x9b2J")
    save_profile(build_profile("odd-chars", device, backend.knob("sim0"), -30))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: screen_text(app).count("Radeon\\u202eXT\\x9b2J") == 2,
                    what="the name escaped, in the table and the detail")
        assert "\u202e" not in screen_text(app) and "\x9b" not in screen_text(app)


async def test_export_delete_import_carry_the_bundled_reference(app, backend, tmp_path):
    """docs/tui.md: the Profiles screen's `e` is "the same as `tuner profile export NAME`", which writes the stock
    reference beside the exported file; `i` carries one back into the store and `del` removes it with its profile.
    The screen wrote the TOML alone, so a round trip through it lost the reference (and a delete left it behind,
    to sit beside the next profile of that name)."""
    from tests.screen.helpers import bundle
    from tuner.profiles import reference_bundle as rb

    stored = _save(backend, "carried", -30)
    rb.write_beside(bundle(tmp_path), stored)
    out = tmp_path / "out" / "exported.toml"
    out.parent.mkdir()
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog), what="the export dialog")
        app.screen.query_one("Input").value = str(out)
        await pilot.press("enter")
        await until(pilot, out.exists, what="the export (a worker writes it)")
        await until(pilot, lambda: not isinstance(app.screen, TextInputDialog), what="the export's end")
        assert rb.sidecar_path(out).exists(), "the export left its stock reference behind"

        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the delete question")
        await pilot.press("y")
        await until(pilot, lambda: list_profiles() == [], what="the delete (a worker removes it)")
        await until(pilot, lambda: not rb.sidecar_path(stored).exists(), what="the reference removed with it")

        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, TextInputDialog), what="the import dialog")
        app.screen.query_one("Input").value = str(out)
        await pilot.press("enter")
        await until(pilot, lambda: app.screen.query_one("#profiles-table").row_count == 1, what="the imported row")
    assert rb.reference_beside(stored) is not None, "the import left the stock reference behind"


async def test_delete_removes_the_selected_row_not_a_namesake_in_the_other_store(app, backend):
    """A user profile and a system (boot) profile may share a name; `tuner profile list` and this screen show both.
    `del` on the system row deleted the user one (the user store is looked up first): the wrong file, gone."""
    from tuner.profiles import store

    device, knob = backend.device("sim0"), backend.knob("sim0")
    save_profile(build_profile("twin", device, knob, -20))
    save_profile(build_profile("twin", device, knob, -40), system=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: app.screen.query_one("#profiles-table").row_count == 2, what="both rows")
        await pilot.press("down")
        selected = app.screen.selected()
        assert selected is not None and store.is_system(selected) and selected.setting.value == -40
        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the delete question")
        await pilot.press("y")
        await until(pilot, lambda: len(list_profiles()) == 1, what="the delete (a worker removes it)")
    [left] = list_profiles()
    assert (left.setting.value, store.is_system(left)) == (-20, False), "the user's namesake was deleted instead"
