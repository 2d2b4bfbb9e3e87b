"""`tuner profile list|show|export|import|delete` through the real entry point."""

from __future__ import annotations

import json

from tests.profiles.helpers import EXAMPLE, sim_profile, tuner
from tuner.core import paths
from tuner.profiles import build_profile, load_profile, save_profile


def test_list_show_export_import_delete(capsys, tmp_path):
    save_profile(sim_profile("mine", tuning={"lowest_pass": -50, "margin": 5, "trials": [
        {"setting": -50, "phase": "refine", "verdict": "pass", "tok_s": 900.0}]}))
    code, out, err = tuner(capsys, "profile", "list")
    assert code == 0 and "mine" in out and "[SIMULATED]" in out and "-45 mV" in out
    code, out, err = tuner(capsys, "profile", "list", "--json")
    doc = json.loads(out)
    assert doc["profiles"][0]["name"] == "mine" and doc["profiles"][0]["setting"]["value"] == -45
    assert doc["profiles"][0]["profile"]["created"].endswith("Z")
    code, out, err = tuner(capsys, "profile", "show", "mine")
    assert code == 0 and "lowest pass -50" in out and "refine" in out
    code, out, err = tuner(capsys, "profile", "show", "mine", "--toml")
    assert load_profile("mine").to_toml() == out

    exported = tmp_path / "mine.toml"
    code, out, err = tuner(capsys, "profile", "export", "mine", str(exported))
    assert code == 0 and exported.exists()
    code, out, err = tuner(capsys, "profile", "import", str(exported), "--name", "copy", "--json")
    assert code == 0 and json.loads(out)["imported"] == "copy"
    assert load_profile("copy").setting == load_profile("mine").setting

    code, out, err = tuner(capsys, "profile", "delete", "copy")
    assert code == 0 and not (paths.user_profiles_dir() / "copy.toml").exists()
    code, out, err = tuner(capsys, "profile", "delete", "copy")
    assert code == 2 and "no profile named 'copy'" in err


def test_list_reports_a_bad_file_without_failing(capsys):
    save_profile(sim_profile("good"))
    (paths.user_profiles_dir() / "broken.toml").write_text("[profile]\nschema = 1\n")
    code, out, err = tuner(capsys, "profile", "list")
    assert code == 0 and "good" in out
    assert "broken.toml" in err and "device: missing section" in err


def test_import_the_shipped_example(capsys):
    code, out, err = tuner(capsys, "profile", "import", str(EXAMPLE))
    assert code == 0, err
    assert "imported 'example-rdna4' (AMD Radeon RX 9070 XT, -45 mV)" in out


def test_import_into_the_system_store(capsys):
    save_profile(sim_profile("mine"))
    code, _out, _err = tuner(capsys, "profile", "import", str(paths.user_profiles_dir() / "mine.toml"), "--system")
    assert code == 0 and (paths.system_profiles_dir() / "mine.toml").exists()


def test_boot_logs_a_profile_the_card_refuses(capsys):
    save_profile(sim_profile("offstep", value=-47), system=True)  # valid TOML, but not on the 5 mV step
    code, _out, err = tuner(capsys, "--simulate", "apply", "--boot", "--boot-wait", "0")
    assert code == 2
    assert "tuner: boot: could not apply 'offstep' to sim0: -47 mV is not on this card's 5 mV step" in err


def test_export_over_a_linked_reference_place_writes_nothing(capsys, tmp_path):
    """`profile export NAME PATH --overwrite` where PATH's reference place (PATH.ref) is a symbolic link: the
    refusal came after the profile was written, so a refused export left half of itself behind."""
    from tests.screen.helpers import bundle
    from tuner.profiles import reference_bundle as rb

    stored = save_profile(sim_profile("carried"))
    rb.write_beside(bundle(tmp_path), stored)
    out = tmp_path / "out" / "carried.toml"
    out.parent.mkdir()
    (tmp_path / "elsewhere.ref").write_bytes(b"not yours")
    rb.sidecar_path(out).symlink_to(tmp_path / "elsewhere.ref")
    code, _out, err = tuner(capsys, "profile", "export", "carried", str(out), "--overwrite")
    assert code == 2 and "symbolic link" in err and "Traceback" not in err
    assert not out.exists(), "the profile was written before the refusal"
    assert (tmp_path / "elsewhere.ref").read_bytes() == b"not yours"


def test_show_escapes_format_characters_in_every_field_of_a_hostile_file(capsys):
    """A profile file's text may hold a bidi override (U+202E) or a C1 control (U+009B, CSI): the card's name is
    escaped (ProfileDevice.label), but `profile show` printed its VBIOS, driver, kernel and trial reasons as they
    were, to the terminal."""
    from dataclasses import replace

    from tests.profiles.helpers import sim

    backend = sim()
    odd = "X\u202eY\x9b2J"
    device = replace(backend.device("sim0"), vbios=odd, driver_version=odd, serial=odd)
    save_profile(build_profile("odd", device, backend.knob("sim0"), -30, kernel=odd, tuning={
        "preset": odd, "trials": [{"setting": -30, "phase": "confirm", "verdict": "fail", "reason": odd}]}))
    code, out, err = tuner(capsys, "profile", "show", "odd")
    assert code == 0, err
    assert "\u202e" not in out and "\x9b" not in out
    assert "X\\u202eY\\x9b2J" in out
