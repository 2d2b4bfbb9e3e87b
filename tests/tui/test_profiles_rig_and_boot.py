"""Profiles screen (issue 15 item 4, issue 16): the efficiency with the setting it was measured at, rig profiles
(every card's part, the rig's evidence, one keep-or-revert for the whole rig) and apply-at-boot (b) through
tuner.actions.boot_service, with no real systemd (TUNER_SYSTEMD_DIR points into the test's directories)."""

from __future__ import annotations

from tests.tui.helpers import make_app, open_profiles, sim_backend, until
from tuner.core import paths
from tuner.profiles import build_profile, save_profile
from tuner.profiles.boot import unit_path
from tuner.profiles.build import RigPart, build_rig_profile
from tuner.screens.dialogs import ConfirmDialog, KeepOrRevertDialog

TUNING = {"baseline_tok_per_j": 23.81, "tuned_tok_per_j": 25.12, "efficiency_gain_pct": 5.5, "confirmed": -50,
          "margin": 10,
          "trials": [{"setting": 0, "phase": "baseline", "verdict": "pass", "tok_per_j": 23.81},
                     {"setting": -50, "phase": "confirm", "verdict": "pass", "tok_per_j": 25.12},
                     {"setting": -60, "phase": "coarse", "verdict": "fail", "reason": "mismatch"}]}


def _detail(app) -> str:
    return str(app.screen.query_one("#profile-detail").render())


def _detail_says(app, text: str) -> bool:
    """The Profiles screen is up and its detail shows `text` (whitespace as one space: it wraps)."""
    found = app.screen.query("#profile-detail")
    return bool(found) and text in " ".join(str(found.first().render()).split())


def _real_card_profile(backend, monkeypatch, name: str = "mine"):
    """The boot service never takes a simulated profile or a simulated session (tuner.actions.boot_service): the
    install tests stand in a real card's profile and an App on real cards (its backend says so)."""
    from tests.profiles.helpers import AMD_KNOB, RX9070

    monkeypatch.setattr(backend, "simulated", False)
    return save_profile(build_profile(name, RX9070, AMD_KNOB, -40))


async def _install_from_profiles(pilot, app):
    """Open Profiles, press b on the selected profile and answer yes: the install has run (or was refused)."""
    await open_profiles(pilot, app)
    await app.workers.wait_for_complete()
    await until(pilot, lambda: _detail_says(app, "boot service"), what="the profile's boot-service line")
    await pilot.press("b")
    await pilot.pause()
    await pilot.press("y")
    await app.workers.wait_for_complete()
    await pilot.pause()


def _rig(backend, name: str = "rig", values=(-40, -30)):
    parts = [RigPart(backend.device(f"sim{i}"), backend.knob(f"sim{i}"), v, tuning=TUNING)
             for i, v in enumerate(values)]
    return save_profile(build_rig_profile(name, parts, rig={"confirm_duration_s": 300.0, "attempts": 2,
                                                            "backend": "gloo", "mode": "mixed", "preset": "tiny"}))


async def test_the_efficiency_is_shown_with_the_setting_it_was_measured_at(app, backend):
    save_profile(build_profile("mine", backend.device("sim0"), backend.knob("sim0"), -40, tuning=TUNING))
    async with app.run_test(size=(100, 30)) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: _detail_says(app, "Efficiency:"), what="the profile's detail")
        detail = _detail(app)
        # measured at -50 mV (the confirm trial), not at the saved -40 mV; rounded, labelled, simulated caveat
        assert "Efficiency: tok/J 25.1 at -50 mV (+5.5 % vs stock, 23.8); measured on a SIMULATED card" in detail


def _rig_on_two_cards(tmp_path):
    """Two simulated cards, the rig profile proven on them saved, and an App on them."""
    backend = sim_backend(tmp_path, gpus=2)
    _rig(backend)
    return backend, make_app(tmp_path, backend=backend, samples=2)


async def test_a_rig_profile_shows_every_card_and_the_rig_evidence_and_applies_as_one(tmp_path):
    backend, app = _rig_on_two_cards(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: _detail_says(app, "Press a to apply every card"), what="the rig's detail")
        # the card cell is plain text (never markup): "[SIMULATED]" in a str cell would be read as a tag
        assert [str(cell) for cell in app.screen.query_one("#profiles-table").get_row_at(0)[1:]] == [
            "rig", "2 cards [SIMULATED]"]
        detail = " ".join(_detail(app).split())
        assert "A rig profile: 2 cards, applied together with one keep-or-revert for the whole rig" in detail
        assert ("Confirmed together: every card at its setting at once for 5m (mixed load, preset tiny, gloo "
                "collectives), passing on attempt 2") in detail
        assert "card[0]: -40 mV on " in detail and "SIM-0000-00); Efficiency: tok/J 25.1 at -50 mV" in detail
        assert "card[1]: -30 mV on " in detail
        assert "On this machine: card[0] → sim0, card[1] → sim1. Press a to apply every card" in detail
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, KeepOrRevertDialog)
        question = str(app.screen.query_one("#keep-question").render())
        assert "sim0 -40 mV, sim1 -30 mV" in question and "Revert puts every card back" in question
        assert (backend.knob("sim0").current, backend.knob("sim1").current) == (-40, -30)
        await pilot.press("k")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.pending is None
        assert (app.histories["sim0"].knob.current, app.histories["sim1"].knob.current) == (-40, -30)
    assert (backend.knob("sim0").current, backend.knob("sim1").current) == (-40, -30)


async def test_a_rig_parts_setting_and_unit_stay_on_one_line_at_80_columns(tmp_path):
    import re

    _backend, app = _rig_on_two_cards(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: _detail_says(app, "card[1]:"), what="the rig's parts")
        widget = app.screen.query_one("#profile-detail")
        lines = [line.plain.rstrip() for line in widget.render().wrap(widget.content_size.width)]
        # each part's setting starts its line, so the wrap never leaves "-40" at a line's end and "mV" on the next
        # (Textual's wrap breaks at any whitespace, the no-break space included)
        starts = [line for line in lines if line.startswith("card[")]
        assert [re.match(r"card\[\d\]: [+-]\d+ mV on ", line) is not None for line in starts] == [True, True], lines


async def test_an_unconfirmed_rig_apply_reverts_every_card_when_the_countdown_ends(tmp_path, clock):
    backend = sim_backend(tmp_path, gpus=3)
    _rig(backend, values=(-40, -30, -20))
    app = make_app(tmp_path, backend=backend, clock=clock, samples=2)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, KeepOrRevertDialog)
        assert [backend.knob(f"sim{i}").current for i in range(3)] == [-40, -30, -20]
        clock.advance(14.0)
        # the countdown has ticked on the advanced clock (its line says 1 s left) and has not reverted: not yet
        await until(pilot, lambda: "Reverting in 1 s" in str(app.screen.query_one("#countdown").render()),
                    what="the countdown's tick at 14 s")
        assert isinstance(app.screen, KeepOrRevertDialog) and backend.knob("sim0").current == -40
        clock.advance(1.5)
        await until(pilot, lambda: not isinstance(app.screen, KeepOrRevertDialog) and app.pending is None
                    and [backend.knob(f"sim{i}").current for i in range(3)] == [0, 0, 0]
                    and [app.histories[f"sim{i}"].knob.current for i in range(3)] == [0, 0, 0],
                    what="the revert at 15 s, read back and shown")
        await app.workers.wait_for_complete()
        assert [backend.knob(f"sim{i}").current for i in range(3)] == [0, 0, 0]
        assert [app.histories[f"sim{i}"].knob.current for i in range(3)] == [0, 0, 0]


async def test_a_rig_profile_whose_card_is_missing_is_refused_and_nothing_changes(tmp_path):
    backend = sim_backend(tmp_path, gpus=3)
    _rig(backend, values=(-40, -30, -20))
    small = sim_backend(tmp_path / "two", gpus=2)  # the third card is gone
    app = make_app(tmp_path, backend=small, samples=1)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: _detail_says(app, "cannot be applied (card[2]'s card is not in this machine)"),
                    what="the missing card's refusal in the detail")
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert not isinstance(app.screen, KeepOrRevertDialog)
        assert any("card[2]" in n.message and "not in this machine" in n.message for n in app._notifications)
    assert [small.knob(f"sim{i}").current for i in range(2)] == [0, 0]


async def test_b_installs_the_boot_service_for_the_profile_shows_its_status_and_removes_it(app, backend,
                                                                                        monkeypatch):
    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: True)
    _real_card_profile(backend, monkeypatch)
    async with app.run_test(size=(100, 30)) as pilot:
        await open_profiles(pilot, app)
        await app.workers.wait_for_complete()
        await until(pilot, lambda: _detail_says(app, "the boot service is not installed; b installs it for this "
                                                     "profile"), what="the boot service's status")
        await pilot.press("b")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)  # asks first; No is the default
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert not unit_path().exists()
        await pilot.press("b")
        await pilot.pause()
        await pilot.press("y")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: _detail_says(app, "installed and applies 'mine' at every boot. b removes it."),
                    what="the installed status")
        assert unit_path().exists() and "apply --boot mine" in unit_path().read_text()
        await pilot.press("b")
        await pilot.pause()
        assert "Remove the boot service?" in str(app.screen.query_one("#question").render())
        await pilot.press("y")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: _detail_says(app, "the boot service is not installed"), what="the removal")
        assert not unit_path().exists()


async def test_installing_the_boot_service_without_root_is_one_line_and_installs_nothing(app, backend,
                                                                                      monkeypatch):
    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: False)
    _real_card_profile(backend, monkeypatch)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await _install_from_profiles(pilot, app)
        errors = [n.message for n in app._notifications if n.severity == "error"]
        assert errors == [("boot service: installing the boot service needs root (it writes "
                           f"{unit_path().parent}); run it with sudo")]
    assert not unit_path().exists()


async def test_the_last_boot_run_and_its_result_are_in_the_detail(app, backend, monkeypatch):
    import time

    save_profile(build_profile("mine", backend.device("sim0"), backend.knob("sim0"), -40))
    record = {"finished_at": time.time(), "exit_code": 3, "skipped": None,
              "lines": ["tuner: boot: missing card: 'mine' not applied"]}
    monkeypatch.setattr("tuner.actions.boot_service.last_run_doc", lambda path: record)
    async with app.run_test(size=(100, 30)) as pilot:
        await open_profiles(pilot, app)
        await app.workers.wait_for_complete()
        # the simulated cards' own record (a `--simulate apply --boot` run), said so
        await until(pilot, lambda: _detail_says(app, "Last SIMULATED boot run"), what="the last boot run")
        detail = " ".join(_detail(app).split())
        assert ": failed (exit 3). tuner: boot: missing card: 'mine' not applied" in detail


async def test_a_failing_systemctl_after_install_is_one_line_not_its_raw_stderr(app, backend, monkeypatch):
    """As root on a box without systemd as init (a container), systemctl prints several lines: one toast line."""
    import subprocess

    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: True)
    monkeypatch.setattr("tuner.actions.boot_service._live_systemd", lambda: True)
    stderr = ("System has not been booted with systemd as init system (PID 1). Can't operate.\n"
              "Failed to connect to bus: Host is down\n")
    monkeypatch.setattr("tuner.actions.boot_service.subprocess.run",
                        lambda args, **kw: subprocess.CompletedProcess(args, 1, "", stderr))
    _real_card_profile(backend, monkeypatch)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await _install_from_profiles(pilot, app)
        warnings = [n.message for n in app._notifications if n.severity == "warning"]
        assert warnings and all("\n" not in w for w in warnings)
        assert any("Can't operate. Failed to connect to bus" in w for w in warnings)


async def test_b_on_simulated_cards_is_not_offered_and_says_why_before_any_question(app, backend, monkeypatch):
    """As root, a simulated session once installed and enabled a real unit in /etc for a simulated profile; then
    it asked for confirmation and only refused after it (issue 24). Now `b` is not in the key bar, the detail says
    why, and the key answers with the reason, without a question; nothing is written."""
    from tests.tui.helpers import until
    from tuner.widgets.key_bar import KeyBar

    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: True)
    save_profile(build_profile("mine", backend.device("sim0"), backend.knob("sim0"), -40))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: "b is not offered for this profile here" in " ".join(_detail(app).split()))
        assert "SIMULATED" in _detail(app)
        bar = app.screen.query_one(KeyBar).plain
        assert "b At boot" not in bar and "a Apply" in bar
        await pilot.press("b")
        await until(pilot, lambda: any("SIMULATED" in n.message for n in app._notifications))
        assert not isinstance(app.screen, ConfirmDialog)
        [notice] = [n for n in app._notifications if "SIMULATED" in n.message]
        assert notice.severity == "warning" and "\n" not in notice.message
    assert not unit_path().exists() and not paths.system_profiles_dir().exists()


async def test_b_is_offered_for_a_real_cards_profile_on_real_cards(app, backend, monkeypatch):
    from tests.tui.helpers import until
    from tuner.widgets.key_bar import KeyBar

    _real_card_profile(backend, monkeypatch)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: "b At boot" in app.screen.query_one(KeyBar).plain)
        assert "not offered" not in _detail(app)


def _visible_rows(app) -> list[str]:
    """The Profiles table's rows as the terminal shows them (what is scrolled or cut off is not there)."""
    table = app.screen.query_one("#profiles-table")
    lines = [strip.text for strip in table.render_lines(table.region.reset_offset)]
    return lines[1:1 + table.row_count]  # below the header


async def test_a_simulated_profile_says_so_in_its_row_at_80_and_120_columns(tmp_path):
    """SIMULATED is labelled wherever a profile measured on a simulated card is shown: the list's row too, at the
    SSH default 80x24 (no card column there) and at 120x40 (a rig's "N cards" said no more), even with a long
    name."""
    backend = sim_backend(tmp_path, gpus=2)
    _rig(backend)
    save_profile(build_profile("a-rather-long-profile-name-for-the-lab-card", backend.device("sim0"),
                               backend.knob("sim0"), -40))
    for size in ((80, 24), (120, 40)):
        app = make_app(tmp_path, backend=backend, samples=2)
        async with app.run_test(size=size) as pilot:
            await open_profiles(pilot, app)
            await until(pilot, lambda app=app: app.screen.query_one("#profiles-table").row_count == 2, what="two rows")
            await pilot.pause()
            rows = _visible_rows(app)
            assert len(rows) == 2 and all("SIMULATED" in row for row in rows), (size, rows)


async def test_a_simulated_profile_still_says_so_in_its_row_after_the_terminal_is_resized(tmp_path):
    """The rows are laid out for the width they were filled at: a resize within the same layout (120 to 100, 99 to
    80 columns) lays them out again, so the cut name never pushes SIMULATED out of view."""
    backend = sim_backend(tmp_path, gpus=2)
    _rig(backend)
    save_profile(build_profile("a-rather-long-profile-name-for-the-lab-card", backend.device("sim0"),
                               backend.knob("sim0"), -40))
    app = make_app(tmp_path, backend=backend, samples=2)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_profiles(pilot, app)
        await until(pilot, lambda: app.screen.query_one("#profiles-table").row_count == 2, what="two rows")
        for size in ((100, 30), (99, 30), (80, 24)):
            await pilot.resize_terminal(*size)
            await until(pilot, lambda size=size: app.size == size, what="the new size")
            await pilot.pause()
            rows = _visible_rows(app)
            assert len(rows) == 2 and all("SIMULATED" in row for row in rows), (size, rows)
