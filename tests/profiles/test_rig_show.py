"""`tuner profile show|list|import` on a rig profile: one block per card, wrapped to the terminal."""

from __future__ import annotations

import pytest

from tests.profiles.helpers import EXAMPLE, tuner
from tests.profiles.test_rig_apply import save_rig

LONG = ("loss diverged from the stock reference at step 412: 2.718281 vs 2.718282 (relative difference 3.7e-7, "
        "bit-exact comparison), the canary agreed")


@pytest.mark.parametrize("columns", [80, 120])
def test_show_has_one_block_per_card_and_fits_the_terminal(capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    from tests.profiles.helpers import sim
    from tuner.profiles import RigPart, build_rig_profile, save_profile

    backend = sim(gpus=3)
    trials = [{"setting": 0, "phase": "baseline", "verdict": "pass", "duration_s": 10.0, "tok_s": 100.0},
              {"setting": -60, "phase": "coarse", "verdict": "fail", "reason": LONG, "duration_s": 3.0}]
    parts = [RigPart(d, backend.knob(d.id), v, {"confirmed": v - 10, "margin": 10, "trials": trials})
             for d, v in zip(backend.devices(), (-40, -55, -30), strict=True)]
    save_profile(build_rig_profile("rig", parts, rig={"backend": "gloo", "attempts": 2, "confirm_duration_s": 20.0},
                                   kernel="6.14.0-a-rather-long-kernel-release-string-for-wrapping"))
    code, out, err = tuner(capsys, "profile", "show", "rig")
    assert code == 0, err
    lines = out.splitlines()
    assert all(len(line) <= columns for line in lines), [line for line in lines if len(line) > columns]
    assert "  rig          3 cards: -40 mV, -55 mV, -30 mV" in lines
    text = " ".join(out.split())
    assert "one data-parallel job over gloo, 2 attempts" in text
    # no dtype recorded: the engine chose (`--dtype auto`), which is what the line says, not "dtype ?"
    assert "dtype auto" in text and "dtype ?" not in text
    blocks = out.split("\n  card[")[1:]
    assert len(blocks) == 3
    for i, (serial, value) in enumerate((("SIM-0000-00", -40), ("SIM-0000-01", -55), ("SIM-0000-02", -30))):
        block = " ".join(blocks[i].split())  # wrapped lines and aligned columns read as one text
        assert block.startswith(f"{i}]") and f"serial {serial}" in block
        assert f"setting voltage_offset {value:+d} mV" in block and f"confirmed {value - 10:+d}" in block
        assert "[SIMULATED]" in block
        assert "the canary agreed" in block  # the long reason is given in full below the table


def test_list_and_import_name_a_rig_as_a_rig(capsys, tmp_path):
    save_rig()
    code, out, _err = tuner(capsys, "profile", "list")
    assert code == 0 and "rig of 3 cards" in out and "-40, -55, -30 mV" in out
    assert tuner(capsys, "profile", "export", "rig", str(tmp_path / "r.toml"))[0] == 0
    code, out, err = tuner(capsys, "profile", "import", str(tmp_path / "r.toml"), "--name", "rig2")
    assert code == 0, err
    assert "imported 'rig2' (rig of 3 cards [SIMULATED], -40, -55, -30 mV)" in out


def test_single_card_show_is_unchanged(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert tuner(capsys, "profile", "import", str(EXAMPLE))[0] == 0
    code, out, _err = tuner(capsys, "profile", "show", "example-rdna4")
    assert code == 0
    assert "  device       AMD Radeon RX 9070 XT (amd, 1002:7550 / 1da2:e490)" in out
    assert "  setting      voltage_offset -45 mV" in out
    assert "  search       first failure -70, lowest pass -65, confirmed -65, margin 20 mV" in out
    assert "card[" not in out


def test_list_labels_a_simulated_rig_simulated(capsys, tmp_path):
    """A single simulated card's row says [SIMULATED] in `profile list`; a rig measured on simulated cards said
    only `rig of 3 cards`, as if it were real hardware (and so did `profile import`)."""
    save_rig()
    code, out, _err = tuner(capsys, "profile", "list")
    [row] = [line for line in out.splitlines() if line.startswith("rig ")]
    assert code == 0 and "rig of 3 cards [SIMULATED]" in row
    assert tuner(capsys, "profile", "export", "rig", str(tmp_path / "r.toml"))[0] == 0
    code, out, err = tuner(capsys, "profile", "import", str(tmp_path / "r.toml"), "--name", "rig2")
    assert code == 0 and "(rig of 3 cards [SIMULATED], " in out, err
