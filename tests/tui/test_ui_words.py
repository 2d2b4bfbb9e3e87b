"""Issue 24: UI messages speak the UI: no CLI flag (`--floor` is the form's floor field, `--resume` is u), and
no "on the Bisect screen" while you are on it. Every notice goes through tuner.app.words (TunerApp.notify)."""

from __future__ import annotations

import re

from tests.tui.helpers import until
from tuner.app.words import for_people
from tuner.screens import messages as msg
from tuner.tuning.job import BisectParams

FLAG = re.compile(r"(?<![`\w])--[a-z]")


def _flags(text: str) -> list[str]:
    """The CLI flags `text` names outside a whole command in backticks (a shell line is plainly one)."""
    return FLAG.findall(re.sub(r"`[^`]*`", "", text))


def _said(app) -> list[str]:
    return [n.message for n in app._notifications]


async def test_a_refused_floor_names_the_forms_field_not_the_cli_flag(app):
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect")
        app.start_bisect(("sim0",), BisectParams(floor=-10_000))
        await until(pilot, lambda: any("outside this card's range" in m for m in _said(app)))
        [said] = [m for m in _said(app) if "outside this card's range" in m]
        assert "floor -10000 mV is outside" in said and not _flags(said), said


async def test_the_resume_key_is_said_from_where_you_are(app):
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.current_mode == "bisect")
        app.post_message(msg.Noted("the bisect stopped; resume with --resume"))
        await until(pilot, lambda: "the bisect stopped; u resumes it" in _said(app))
        await pilot.press("1")
        await until(pilot, lambda: app.current_mode == "dashboard")
        app.post_message(msg.Noted("the bisect stopped; resume with --resume"))
        await until(pilot, lambda: "the bisect stopped; u resumes it on the Bisect screen (3)" in _said(app))


def test_no_cli_flag_is_left_in_the_cores_messages_that_reach_the_ui():
    """The core's messages a UI action can get back (tuner.tuning.plan, job, rig, journal, load_check,
    actions.profile_apply), as they are worded there."""
    messages = [
        "--step 7 mV is not a positive multiple of this card's 5 mV step; use a multiple of 5",
        "--step 10 is not a multiple of --resolution 3; e.g. --step 10 --resolution 5",
        "--floor +10 mV is not an undervolt; give a value beyond stock (+0) in the undervolt direction",
        "too short; give --trial and --confirm of at least 1 s (the defaults are 5m and 30m)",
        ("an unfinished rig bisect exists for sim0,sim1; continue it with --resume or discard it with --restart "
        "(the unsafe lists are kept)"),
        ("an unfinished bisect session exists for sim0 (s1); continue the rig with --resume, or start afresh with "
        "--restart (the unsafe lists are kept)"),
        "no unfinished bisect session for sim0; start a new one without --resume",
        ("-70 mV is at or beyond -60 mV, which failed hard on sim0 (hang: x); choose a less aggressive value, or "
        "pass --ignore-unsafe if you are sure"),
        ("the stress load is light: 40 W of 300 W; likely cause: the 'tiny' preset is a light load: use --preset "
        "nanochat. A pass under a light load says little about a heavy one"),
        ("refusing to apply 'x' to sim0: other; nothing was applied; tune this card with `tuner bisect`, or pass "
        "--force (and ideally --verify DUR)"),
        ("refusing to apply 'x' to sim0: other; nothing was applied; --force does not override a vendor or knob "
        "mismatch; tune this card with `tuner bisect`"),
        ("refusing to apply card[2]: its card is not in this machine; nothing was applied; check `tuner list`, or "
        "pass --force to apply the other parts and skip this one"),
    ]
    for text in messages:
        for here in ("bisect", "profiles", None):
            said = for_people(text, here=here)
            assert not _flags(said), (here, said)
            assert here != "bisect" or "Bisect screen" not in said, said
    # a whole command in backticks is plainly a shell line: left as it is
    assert for_people("then `tuner bisect --device sim0 --resume`") == "then `tuner bisect --device sim0 --resume`"


# Issue 24: what the Bisect screen and the bisect job's life can show, as tuner.tuning.job / plan word it
BISECT_LIFECYCLE = [
    ("--resume and --restart exclude each other; pick one", "resume (u) and restart (n)"),
    ("too short; give --trial and --confirm of at least 1 s (the defaults are 5m and 30m)", "trial and confirm"),
    ("stopped; resume with --resume", "u resumes it"),
    ("--device names a card twice or none: sim0,sim0; name each card once, or use --device all", "ALL CARDS"),
    ("the engine ran with reduced sensitivity without --tolerance (a silent downgrade)", "`--tolerance`"),
    ("3 compared steps: give a longer --trial / --confirm", "trial / confirm"),
    ("a bound needs the length of a deciding trial (--trial) of at least 1 s; give --trial, e.g. 5m", "(trial)"),
    ("the stock reference of this session is lost; run the baseline again (--restart)", "(n restarts it)"),
    ("--step 10 is not a multiple of --resolution 3; e.g. --step 10 --resolution 5", "step 10 resolution 5"),
    ("--margin 3 is not a positive multiple of this card's 5 mV step", "margin 3"),
    ("no unfinished bisect session for sim0; start a new one without --resume", "start a new one with b"),
]


def test_every_bisect_lifecycle_message_is_said_in_the_screens_words():
    for text, kept in BISECT_LIFECYCLE:
        said = for_people(text, here="bisect")
        assert not _flags(said) and "Bisect screen" not in said and kept in said, (text, said)
        elsewhere = for_people(text)
        assert not _flags(elsewhere), (text, elsewhere)
