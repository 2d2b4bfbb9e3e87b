"""Every view of a profile says how strong its evidence is (issue 21 item 8): a profile proven with `--tolerance`
(its TOML records `sensitivity = "reduced"` on the search and on every trial) says "sensitivity reduced
(--tolerance)" in `tuner profile show`, on the Profiles screen and when `tuner apply` applies it; a rig profile
says it of the parts that were. One rule (tuner.profiles.evidence), asked by every view."""

from __future__ import annotations

import json

import pytest

from tests.profiles.helpers import sim, sim_profile, tuner
from tuner.profiles import RigPart, build_rig_profile, evidence, save_profile

REDUCED = "sensitivity reduced (--tolerance)"


def _trials(sensitivity: str | None) -> list[dict]:
    extra = {"sensitivity": sensitivity} if sensitivity else {}
    return [{"setting": 0, "phase": "baseline", "verdict": "pass", **extra},
            {"setting": -50, "phase": "coarse", "verdict": "fail", "reason": "mismatch", **extra},
            {"setting": -35, "phase": "confirm", "verdict": "pass", **extra}]


def _tuning(sensitivity: str | None) -> dict:
    return {"confirmed": -35, "margin": 10, "sensitivity": sensitivity, "trials": _trials(sensitivity)}


def _single(name: str, sensitivity: str | None):
    return save_profile(sim_profile(name, value=-45, tuning=_tuning(sensitivity)), overwrite=True)


def _rig(name: str = "rig", sensitivities=("full", "reduced")):
    backend = sim(gpus=2)
    parts = [RigPart(d, backend.knob(d.id), -40, _tuning(s))
             for d, s in zip(backend.devices(), sensitivities, strict=True)]
    return save_profile(build_rig_profile(name, parts, kernel="6.14.0-test"), overwrite=True)


# --- the rule ----------------------------------------------------------------------------------------------------
def _part(tuning):
    return sim_profile("p", tuning=tuning).parts[0]


@pytest.mark.parametrize(("tuning", "expected"), [
    (_tuning("reduced"), "reduced"),
    (_tuning("full"), "full"),
    ({**_tuning("full"), "trials": [*_trials("full"), {"setting": -40, "phase": "refine", "verdict": "pass",
                                                        "sensitivity": "reduced"}]}, "reduced"),  # one trial is enough
    ({"confirmed": -35, "sensitivity": "reduced"}, "reduced"),  # the search's own record, without trials
    (_tuning(None), None),  # written before the tuner recorded it: not known, not claimed
    (None, None),  # not from a bisect: no evidence at all
])
def test_any_trial_compared_with_a_tolerance_makes_the_evidence_reduced(tuning, expected):
    part = _part(tuning)
    assert evidence.sensitivity(part) == expected
    words = evidence.strength(part)
    assert (words is not None and REDUCED in words) is (expected == "reduced")
    assert words is None if tuning is None else words is not None


# --- tuner profile show --------------------------------------------------------------------------------------------
def test_show_says_reduced_for_a_tolerance_profile(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    _single("tol", "reduced")
    code, out, err = tuner(capsys, "profile", "show", "tol")
    assert code == 0, err
    text = " ".join(out.split())
    assert f"evidence {REDUCED}" in text, out
    assert "1.9 % of consequential single-bit flips" in text  # what the weaker comparison costs, as measured


def test_show_says_full_sensitivity_and_never_reduced_for_a_bitwise_profile(capsys):
    _single("bitwise", "full")
    code, out, _err = tuner(capsys, "profile", "show", "bitwise")
    assert code == 0 and "evidence     full sensitivity (bit for bit)" in out and "reduced" not in out


def test_show_json_says_it_too(capsys):
    _single("tol", "reduced")
    _single("bitwise", "full")
    assert json.loads(tuner(capsys, "profile", "show", "tol", "--json")[1])["sensitivity"] == "reduced"
    assert json.loads(tuner(capsys, "profile", "show", "bitwise", "--json")[1])["sensitivity"] == "full"


def test_rig_show_says_it_per_part(capsys):
    _rig()
    code, out, err = tuner(capsys, "profile", "show", "rig")
    assert code == 0, err
    card0, card1 = out.split("\n  card[")[1:]
    assert REDUCED not in " ".join(card0.split()) and "full sensitivity (bit for bit)" in card0
    assert REDUCED in " ".join(card1.split())
    assert json.loads(tuner(capsys, "profile", "show", "rig", "--json")[1])["sensitivity"] == "reduced"


# --- tuner apply ---------------------------------------------------------------------------------------------------
def test_apply_says_reduced_when_it_applies_a_tolerance_profile(capsys):
    _single("tol", "reduced")
    code, out, err = tuner(capsys, "--simulate", "apply", "tol", "--device", "sim0", "--yes")
    assert code == 0, err
    assert REDUCED in err and sim().knob("sim0").current == -45
    code, out, err = tuner(capsys, "--simulate", "apply", "tol", "--device", "sim0", "--yes", "--json")
    assert code == 0 and json.loads(out)["applied"] and REDUCED in err  # warnings go to stderr, beside the JSON


def test_apply_of_a_bitwise_profile_says_nothing_of_it(capsys):
    _single("bitwise", "full")
    code, _out, err = tuner(capsys, "--simulate", "apply", "bitwise", "--device", "sim0", "--yes")
    assert code == 0 and "reduced" not in err


def test_rig_apply_names_the_part_proven_with_a_tolerance(capsys):
    _rig()
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "rig", "--yes")
    assert code == 0, err
    [line] = [line for line in err.splitlines() if REDUCED in line]
    assert "card[1]" in line and "card[0]" not in line
    code, out, _err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "rig", "--yes", "--json")
    assert code == 0 and [w for w in json.loads(out)["warnings"] if REDUCED in w] == [line.split("warning: ")[1]]


# --- the Profiles screen -----------------------------------------------------------------------------------------
async def _detail_when(app, pilot, wanted: str, timeout_s: float = 10.0) -> str:
    """The detail's text once it shows `wanted` (or as it is when the generous timeout ends)."""
    import asyncio

    detail = ""
    for _ in range(int(timeout_s / 0.05)):
        detail = " ".join(str(app.screen.query_one("#profile-detail").render()).split())
        if wanted in detail:
            break
        await asyncio.sleep(0.05)
    return detail


async def test_the_profiles_screen_says_reduced_for_a_single_card_and_per_rig_card(tmp_path):
    from tests.tui.helpers import make_app, open_profiles, sim_backend

    backend = sim_backend(tmp_path, gpus=2)
    save_profile(build_rig_profile("a-rig", [RigPart(backend.device(f"sim{i}"), backend.knob(f"sim{i}"), -40,
                                                     _tuning(s)) for i, s in enumerate(("full", "reduced"))]))
    save_profile(sim_profile("b-tol", tuning=_tuning("reduced")))
    save_profile(sim_profile("c-bitwise", tuning=_tuning("full")))
    app = make_app(tmp_path, backend=backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_profiles(pilot, app)
        rig = await _detail_when(app, pilot, "card[1]: -40 mV")
        assert "card[1]: -40 mV on Simulated" in rig and REDUCED in rig.split("card[1]:")[1], rig
        assert REDUCED not in rig.split("card[1]:")[0]
        await pilot.press("down")
        single = await _detail_when(app, pilot, "b-tol")
        assert f"Evidence: {REDUCED}" in single, single
        await pilot.press("down")
        bitwise = await _detail_when(app, pilot, "c-bitwise")
        assert "Evidence: full sensitivity (bit for bit)" in bitwise and "reduced" not in bitwise, bitwise
