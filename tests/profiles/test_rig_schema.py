"""Rig profiles (schema 2): round trips through the store, strict validation with key paths, and single-card
files (schema 1) read exactly as before."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from tests.profiles.helpers import AMD_KNOB, EXAMPLE, NV_KNOB, RTX4090, RX9070, sim
from tuner.profiles import Profile, ProfileError, RigPart, build_rig_profile, load_profile, save_profile

V1_FILE = Path(__file__).parent / "data" / "v1-sim.toml"  # written by the tuner before rig profiles existed
TRIALS = [{"setting": 0, "phase": "baseline", "verdict": "pass", "duration_s": 10.0, "tok_s": 100.0},
          {"setting": -60, "phase": "coarse", "verdict": "fail", "reason": "canary mismatch", "tok_s": None}]
RIG = {"confirm_duration_s": 20.0, "attempts": 2, "backend": "gloo", "mode": "mixed", "tok_s": None}


def sim_parts(gpus: int = 3, values=(-40, -55, -30)) -> list[RigPart]:
    backend = sim(gpus=gpus)
    return [RigPart(d, backend.knob(d.id), values[i], {"confirmed": values[i] - 10, "margin": 10, "trials": TRIALS})
            for i, d in enumerate(backend.devices())]


def rig_profile(name: str = "rig", **kw) -> Profile:
    return build_rig_profile(name, sim_parts(), rig=RIG, kernel="6.14.0-test", **kw)


def test_rig_profile_round_trips_through_the_store():
    profile = rig_profile()
    path = save_profile(profile)
    loaded = load_profile("rig")
    assert loaded == profile and loaded.source == path
    assert loaded.is_rig and [p.setting.value for p in loaded.parts] == [-40, -55, -30]
    assert [p.device.serial for p in loaded.parts] == ["SIM-0000-00", "SIM-0000-01", "SIM-0000-02"]
    assert loaded.parts[1].tuning.trials[1].reason == "canary mismatch"
    assert loaded.rig.backend == "gloo" and loaded.rig.attempts == 2 and loaded.rig.tok_s is None
    assert loaded.device == loaded.parts[0].device  # the first card stands for the rig in one-line summaries


def test_rig_toml_is_one_card_table_per_card_at_schema_2():
    data = tomllib.loads(rig_profile().to_toml())
    assert set(data) == {"profile", "rig", "card"}
    assert data["profile"]["schema"] == 2
    assert [c["setting"]["value"] for c in data["card"]] == [-40, -55, -30]
    assert set(data["card"][0]) == {"device", "setting", "tuning"}
    assert "tok_s" not in data["rig"]  # unknown evidence is left out (TOML has no null)


def test_rig_of_mixed_real_cards_keeps_each_cards_own_knob():
    profile = build_rig_profile("mixed", [RigPart(RX9070, AMD_KNOB, -45), RigPart(RTX4090, NV_KNOB, 150)],
                                kernel="6.14")
    amd, nv = profile.parts
    assert (amd.setting.unit, nv.setting.unit, nv.setting.lock_clock_mhz) == ("mV", "MHz", 2500)
    assert Profile.from_toml(profile.to_toml()) == profile


def test_single_card_profile_is_one_part_and_still_schema_1():
    profile = load_profile(str(EXAMPLE))
    assert not profile.is_rig and profile.meta.schema == 1
    (part,) = profile.parts
    assert (part.device, part.setting, part.tuning) == (profile.device, profile.setting, profile.tuning)


def test_old_v1_files_load_unchanged():
    """The shipped example and a file the previous tuner wrote read as before, and write back byte for byte."""
    example = load_profile(str(EXAMPLE))
    assert (example.device.serial, example.setting.value, len(example.tuning.trials)) == (
        "EXAMPLE-0000000000000000", -45, 7)
    assert example.to_dict()["device"] == tomllib.loads(EXAMPLE.read_text())["device"]
    old = load_profile(str(V1_FILE))
    assert old.to_toml() == V1_FILE.read_text()
    assert old.to_dict() == tomllib.loads(V1_FILE.read_text())
    assert (old.meta.schema, old.setting.value, old.tuning.trials[1].fault_step) == (1, -45, 12)


def test_renamed_rig_profile_keeps_its_cards():
    profile = rig_profile().renamed("other")
    assert profile.name == "other" and len(profile.parts) == 3 and profile.rig.backend == "gloo"


def _rig_doc() -> dict:
    return rig_profile().to_dict()


def _set(doc: dict, dotted: str, value) -> dict:
    *path, last = dotted.split(".")
    node = doc
    for key in path:
        node = node[int(key)] if key.isdigit() else node[key]
    index = int(last) if last.isdigit() else last
    if value is ...:
        del node[index]
    else:
        node[index] = value
    return doc


@pytest.mark.parametrize(("dotted", "value", "message"), [
    ("card.1.setting.value", "abc", "card[1].setting.value: expected an integer, got a string 'abc'"),
    ("card.2.setting.value", 50, "card[2].setting.value: +50 mV would raise the voltage above stock (overvolt)"),
    ("card.0.setting.unit", "MHz", "card[0].setting.unit: a voltage_offset is in mV"),
    ("card.1.device.vendor", "intel", "card[1].device.vendor: expected one of amd, nvidia, simulated"),
    ("card.1.device.serial", "SIM-0000-00", "card[1].device.serial: 'SIM-0000-00' is card[0]'s too"),
    ("card.2.device.serial", ..., "card[2].device: needs a serial or a pci_slot"),
    ("card.0.device.colour", "red", "card[0].device.colour: unknown key"),
    ("card.0.fans", {}, "card[0].fans: unknown key"),
    ("card.1.setting", ..., "card[1].setting: missing"),
    ("card.1.tuning.trials.1.verdict", "ok", "card[1].tuning.trials[1].verdict: expected one of pass"),
    ("card.1", 5, "card[1]: expected a table, got an integer 5"),
    ("card", [], "card: a rig profile holds 1..64 cards, got 0"),
    ("card", {"device": {}}, "card: expected an array of tables ([[card]]), got a table"),
    ("rig.backend", "mpi", "rig.backend: expected one of gloo, nccl, rccl, got 'mpi'"),
    ("rig.attempts", 0, "rig.attempts: 0 is outside 1..10000"),
    ("rig.confirm_duration_s", float("nan"), "rig.confirm_duration_s: expected a finite number, got nan"),
    ("rig.colour", "red", "rig.colour: unknown key"),
    ("profile.schema", 1, "profile.schema: a rig profile ([[card]] tables) is schema 2, got 1"),
    ("device", {"vendor": "amd"}, "device: unknown section"),
])
def test_rig_validation_names_the_key(dotted, value, message):
    with pytest.raises(ProfileError) as info:
        Profile.from_dict(_set(_rig_doc(), dotted, value))
    assert message in info.value.one_line()
    assert "\n" not in info.value.one_line()


def test_build_rig_profile_refuses_what_could_not_be_applied():
    with pytest.raises(ProfileError, match="at least one card"):
        build_rig_profile("r", [])
    part = sim_parts()[0]
    with pytest.raises(ProfileError, match=r"card\[1\].device.serial: 'SIM-0000-00' is card\[0\]'s too"):
        build_rig_profile("r", [part, part])
    anonymous = replace(part, device=replace(part.device, serial=None, pci_slot=None))
    with pytest.raises(ProfileError, match=r"card\[0\].device: needs a serial or a pci_slot"):
        build_rig_profile("r", [anonymous])
    with pytest.raises(ProfileError, match=r"rig\.world: unknown key"):
        build_rig_profile("r", [part], rig={"world": 3})
    with pytest.raises(ProfileError, match="bad profile name"):
        build_rig_profile("../r", [part])


def test_two_cards_in_one_slot_are_refused_even_without_serials():
    a = RigPart(replace(RX9070, serial=None), AMD_KNOB, -40)
    b = RigPart(replace(RX9070, serial=None, id="x"), AMD_KNOB, -45)
    with pytest.raises(ProfileError, match=r"card\[1\].device.pci_slot: '0000:03:00.0' is card\[0\]'s too"):
        build_rig_profile("r", [a, b])


def test_a_rig_file_is_refused_by_a_reader_of_schema_1_for_its_version():
    """What an older tuner (SCHEMA_VERSION 1) says: the version check runs before any key is looked at."""
    from tuner.profiles import schema

    doc = _rig_doc()
    old = schema.SCHEMA_VERSION
    try:
        schema.SCHEMA_VERSION = 1
        with pytest.raises(ProfileError, match=r"uses schema 2; tuner .* reads schema 1") as info:
            Profile.from_dict(doc)
        assert info.value.remedy == "upgrade the tuner to read it"
    finally:
        schema.SCHEMA_VERSION = old
