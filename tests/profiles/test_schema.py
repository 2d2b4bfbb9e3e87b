"""Schema v1: round trips, the shipped example, and what validation says about each kind of mistake."""

from __future__ import annotations

import tomllib

import pytest

from tests.profiles.helpers import EXAMPLE, NV_KNOB, RTX4090, sim_profile
from tuner.profiles import Profile, ProfileError, build_profile, load_profile, save_profile

TRIALS = [
    {"setting": 0, "phase": "baseline", "verdict": "pass", "duration_s": 60, "tok_s": 1000.5, "power_w": 250.0,
     "tok_per_j": 4.0, "max_temp_c": 70.0},
    {"setting": -60, "phase": "coarse", "verdict": "fail", "reason": "canary mismatch", "fault_step": 12,
     "duration_s": 3.5, "tok_s": None},
]
TUNING = {"baseline_tok_s": 1000.5, "tuned_tok_s": 1001, "baseline_power_w": 250, "tuned_power_w": 220.25,
          "efficiency_gain_pct": 12.5, "first_failure": -60, "lowest_pass": -55, "confirmed": -55, "margin": 10,
          "step": 5, "resolution": 5, "trial_duration_s": 60, "confirm_duration_s": 600, "preset": "tiny",
          "mode": "train", "dtype": "fp32", "trials": TRIALS, "tuned_tok_per_j": None}


def test_round_trip_save_load_equal():
    profile = sim_profile("round-trip", tuning=TUNING)
    path = save_profile(profile)
    loaded = load_profile("round-trip")
    assert loaded == profile
    assert loaded.source == path
    assert load_profile(str(path)) == profile
    assert Profile.from_toml(profile.to_toml()) == profile


def test_unknown_tuning_values_are_omitted_and_ints_become_floats():
    doc = sim_profile("t", tuning=TUNING).to_dict()
    assert "tuned_tok_per_j" not in doc["tuning"]
    assert "tok_s" not in doc["tuning"]["trials"][1]
    assert doc["tuning"]["tuned_tok_s"] == 1001.0 and isinstance(doc["tuning"]["tuned_tok_s"], float)
    assert doc["device"]["vendor"] == "simulated"


def test_saved_text_is_plain_toml_with_every_section():
    text = sim_profile("t", tuning=TUNING).to_toml()
    data = tomllib.loads(text)
    assert set(data) == {"profile", "device", "setting", "tuning"}
    assert data["profile"]["schema"] == 1
    assert data["setting"] == {"kind": "voltage_offset", "unit": "mV", "value": -45}
    assert data["tuning"]["trials"][1]["verdict"] == "fail"


def test_nvidia_profile_records_the_lock_clock():
    profile = build_profile("nv", RTX4090, NV_KNOB, 150, kernel="6.14")
    assert profile.setting.lock_clock_mhz == 2500
    assert Profile.from_toml(profile.to_toml()) == profile


def test_shipped_example_loads_and_says_it_is_an_example():
    profile = load_profile(str(EXAMPLE))
    assert (profile.device.vendor, profile.device.od_format, profile.setting.value) == ("amd", "rdna4", -45)
    assert "NOT A RECOMMENDATION" in EXAMPLE.read_text().upper()
    assert profile.tuning.confirmed + profile.tuning.margin == profile.setting.value  # backed off by the margin


def test_build_profile_refuses_a_bad_name():
    with pytest.raises(ProfileError, match="bad profile name"):
        sim_profile("../evil")


def _doc(**overrides) -> dict:
    doc = sim_profile("v").to_dict()
    for dotted, value in overrides.items():
        section, key = dotted.split("__")
        if value is ...:
            doc[section].pop(key)
        else:
            doc[section][key] = value
    return doc


@pytest.mark.parametrize(("overrides", "message"), [
    ({"setting__value": "abc"}, "setting.value: expected an integer, got a string 'abc'"),
    ({"setting__value": -45.0}, "setting.value: expected an integer, got a number -45.0"),
    ({"setting__value": True}, "setting.value: expected an integer, got a boolean True"),
    ({"setting__value": 300}, "setting.value: +300 mV would raise the voltage above stock (overvolt)"),
    ({"setting__value": -10**30}, "setting.value: "),
    ({"setting__value": ...}, "setting.value: missing"),
    ({"setting__unit": "MHz"}, "setting.unit: a voltage_offset is in mV"),
    ({"setting__kind": "fan_speed"}, "setting.kind: expected one of voltage_offset, clock_offset"),
    ({"setting__lock_clock_mhz": 2000}, "setting.lock_clock_mhz: only a clock_offset"),
    ({"setting__extra": 1}, "setting.extra: unknown key"),
    ({"device__vendor": "intel"}, "device.vendor: expected one of amd, nvidia, simulated"),
    ({"device__pci_id": "zz:1"}, "device.pci_id: 'zz:1' is not in the form 1002:7550"),
    ({"device__name": "x" * 1100}, "device.name: string is 1100 characters long, the limit is 1024"),
    ({"device__name": "a\x1bb"}, "device.name: control characters are not allowed"),
    ({"profile__created": "yesterday"}, "profile.created: expected a date-time"),
    ({"profile__schema": 0}, "profile.schema: 0 is outside 1..2"),
    ({"profile__schema": 2}, "profile.schema: a single-card profile ([device], [setting]) is schema 1, got 2"),
    ({"profile__schema": 3}, "profile.schema: this profile uses schema 3; tuner 0.1.0 reads schema 2"),
    ({"profile__name": "a/b"}, "profile.name: bad profile name 'a/b'"),
])
def test_validation_names_the_key(overrides, message):
    with pytest.raises(ProfileError) as info:
        Profile.from_dict(_doc(**overrides))
    assert message in info.value.one_line()
    assert "\n" not in info.value.one_line()


@pytest.mark.parametrize(("tuning", "message"), [
    ({"baseline_power_w": float("nan")}, "tuning.baseline_power_w: expected a finite number, got nan"),
    ({"tuned_tok_s": float("inf")}, "tuning.tuned_tok_s: expected a finite number, got inf"),
    ({"tuned_tok_s": 1e300}, "tuning.tuned_tok_s: 1e+300 is outside"),
    ({"margin": -5}, "tuning.margin: -5 is outside 0..1000000"),
    ({"trials": {"setting": 1}}, "tuning.trials: expected an array of tables"),
    ({"trials": [{"setting": 0, "phase": "coarse", "verdict": "ok"}]},
     "tuning.trials[0].verdict: expected one of pass, fail, error, inconclusive, got 'ok'"),
    ({"trials": [{"setting": 0, "phase": "coarse"}]}, "tuning.trials[0].verdict: missing"),
    ({"trials": [1, 2]}, "tuning.trials[0]: expected a table, got an integer 1"),
    ({"colour": "red"}, "tuning.colour: unknown key"),
])
def test_tuning_validation(tuning, message):
    doc = _doc()
    doc["tuning"] = tuning
    with pytest.raises(ProfileError) as info:
        Profile.from_dict(doc)
    assert message in info.value.one_line()


def test_newer_schema_is_refused_for_its_version_not_its_new_keys():
    doc = _doc(profile__schema=3)
    doc["fans"] = {"curve": [1, 2]}
    doc["setting"]["new_knob"] = 5
    with pytest.raises(ProfileError) as info:
        Profile.from_dict(doc)
    assert "uses schema 3; tuner 0.1.0 reads schema 2; upgrade the tuner" in info.value.one_line()


@pytest.mark.parametrize(("raw", "message"), [
    (b"\x00\x01\x02\xff" * 10, "binary data (NUL bytes)"),
    (b"\xff\xfe[profile]", "not UTF-8 text"),
    (b"[profile\nname=", "not valid TOML"),
    (b"", "profile.schema: missing"),
    (b"x" * (300 * 1024), "larger than 256 KiB"),
    (b"a = " + b"[" * 5000 + b"]" * 5000, "not valid TOML"),
])
def test_bytes_that_are_not_a_profile(raw, message):
    with pytest.raises(ProfileError) as info:
        Profile.from_bytes(raw)
    assert message in info.value.one_line()


def test_a_very_long_trial_reason_is_cut_not_fatal():
    trials = [{"setting": -60, "phase": "coarse", "verdict": "fail", "reason": "kernel: " + "x" * 5000}]
    profile = sim_profile("long", tuning={"trials": trials})
    assert len(profile.tuning.trials[0].reason) == 1024 and profile.tuning.trials[0].reason.endswith("...")


def test_the_readme_documents_exactly_the_declared_keys():
    """The tables are declared once (tuner/profiles/schema.py); profiles/README.md is checked against them."""
    import re
    from dataclasses import fields

    from tests.profiles.helpers import EXAMPLE
    from tuner.profiles import schema

    readme = (EXAMPLE.parent / "README.md").read_text()
    tables = {"## `[profile]`": schema.ProfileMeta, "## `[device]`": schema.ProfileDevice,
              "## `[setting]`": schema.Setting, "## `[tuning]`": schema.Tuning,
              "### `[[tuning.trials]]`": schema.Trial, "### `[[card]]`": schema.ProfilePart,
              "### `[rig]`": schema.RigEvidence}
    for heading, table in tables.items():
        section = readme.split(heading, 1)[1].split("\n#", 1)[0]
        documented = {key for row in re.findall(r"^\| (.+?) \|", section, re.M) for key in re.findall(r"`(\w+)`", row)}
        assert documented == {f.name for f in fields(table)}, heading
