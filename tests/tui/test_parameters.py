"""Issue 21 item 3: each bisect and stress parameter is declared once (tuner.actions.parameters). The CLI's options
and the Bisect screen's fields come from that one declaration, and a bad value is refused by both in the same words,
after the flag on the command line and the field's label on the form."""

from __future__ import annotations

import argparse

import pytest
from textual.widgets import Input

from tests.profiles.helpers import tuner
from tests.tui.helpers import make_app, sim_backend, until
from tuner.actions import parameters
from tuner.cli import build_parser
from tuner.core.errors import UsageError
from tuner.screens.bisect import FIELDS, BisectScreen

COMMANDS = {"bisect": parameters.BISECT, "stress": parameters.STRESS_LENGTH + parameters.STRESS}
# one bad text per form field, each of another kind of mistake
BAD = {"step": "abc", "resolution": "1_0", "margin": "-٣", "floor": "1.5", "trial": "5minutes", "confirm": "0.5",
       "mode": "fast"}


def _options(command: str) -> dict[str, argparse.Action]:
    parser = build_parser(only=command)
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {flag: a for a in subparsers.choices[command]._actions for flag in a.option_strings}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_declared_parameter_is_an_option_of_its_command(command):
    options = _options(command)
    for p in COMMANDS[command]:
        assert p.flag in options, p.flag
        assert (options[p.flag].dest, options[p.flag].help, options[p.flag].default) == (p.id, p.help, p.default)


def test_the_bisect_form_has_a_field_for_each_parameter_with_a_label_and_only_those():
    assert sorted(p.id for p in FIELDS) == sorted(p.id for p in parameters.BISECT if p.label)
    assert set(BAD) == {p.id for p in FIELDS}


def test_each_fields_help_names_the_default_a_blank_field_shows(tmp_path):
    knob = sim_backend(tmp_path).knob("sim0")  # mV, as the help's first default
    for p in FIELDS:
        shown = p.placeholder(knob)
        assert shown == "none" or f"default {shown}" in p.help, (p.id, shown, p.help)


def _problem(p: parameters.Parameter) -> str:
    with pytest.raises(UsageError) as refused:
        p.parse(BAD[p.id])
    return refused.value.one_line()


@pytest.mark.parametrize("field_id", BAD)
def test_the_cli_refuses_a_bad_value_after_its_flag(capsys, field_id):
    p = next(p for p in FIELDS if p.id == field_id)
    code, _out, err = tuner(capsys, "--simulate", "bisect", "--device", "sim0", p.flag, BAD[field_id], "--yes")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{p.flag}: {_problem(p)}" in err


async def test_the_form_refuses_each_bad_value_in_the_clis_words_after_its_label(tmp_path, boot):
    app = make_app(tmp_path, samples=1)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, BisectScreen), what="the Bisect screen")
        for p in FIELDS:
            for other in FIELDS:
                app.screen.query_one(f"#in-{other.id}", Input).value = BAD[p.id] if other is p else ""
            app.clear_notifications()
            await pilot.press("b")
            said = f"{p.label}: {_problem(p)}"
            await until(pilot, lambda said=said: [n.message for n in app._notifications] == [said],
                        what=f"the {p.id} field refused")
        assert not app.bisect.running and app.bisect.outcome is None


def test_the_preset_choices_are_the_engines_presets():
    # the CLI and TUI listed the presets a second time (tuner/actions/parameters.py): a preset added to the engine
    # was refused by --preset, one removed was offered and failed later in the engine
    from tuner.actions import parameters
    from tuner.engine.options import PRESETS

    assert parameters.PRESET.choices == tuple(PRESETS)
