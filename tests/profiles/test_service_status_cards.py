"""`tuner service status`, per card (issue 23): applied as the profile says, not applied (and why), changed by
something else since (found vs installed), or missing (and how long the boot waited); on a fake sysfs tree with the
real AMD backend, and with --simulate against the system store."""

from __future__ import annotations

import json

import pytest

from tests.backends.fakes.trees import SLOTS, make_tree
from tests.profiles.helpers import sim, sim_profile, tuner
from tuner.actions import boot_apply
from tuner.backends import open_backend
from tuner.profiles import build_profile, save_profile


def _card_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("card ")]


def test_simulated_cards_against_the_system_store(capsys, boot):
    save_profile(sim_profile("mine", value=-50), system=True)
    code, out, err = tuner(capsys, "--simulate", "service", "status")
    assert code == 0, err
    (line,) = _card_lines(out)
    assert "mine on sim0 Simulated RDNA-class GPU [SIMULATED]: not applied (the boot service is not installed" in line
    assert "reads +0 mV, the profile says -50 mV" in line
    sim().apply("sim0", -30)
    code, out, _err = tuner(capsys, "--simulate", "service", "status")
    assert "changed since (-30 found, -50 installed)" in _card_lines(out)[0]
    sim().apply("sim0", -50)
    code, out, _err = tuner(capsys, "--simulate", "service", "status", "--json")
    (card,) = json.loads(out)["cards"]
    assert (card["state"], card["found"], card["installed"]) == ("applied", -50, -50)


@pytest.fixture
def amd_tree(tmp_path, monkeypatch, boot):
    root = boot.root
    make_tree(root, ["rdna4"])
    slot = SLOTS["rdna4"]
    backend = open_backend(simulate=False)
    device = backend.device(slot)
    save_profile(build_profile("r9070", device, backend.knob(slot), -50, kernel="6.14.0-test"), system=True)
    return root / f"sys/devices/pci0000:00/{slot}/pp_od_clk_voltage", slot


def test_a_real_backend_card_on_a_fake_tree(capsys, amd_tree):
    od, slot = amd_tree
    code, out, err = tuner(capsys, "service", "status")
    assert code == 0, err
    (line,) = _card_lines(out)
    assert f"r9070 on {slot}" in line and "not applied (the boot service is not installed" in line
    od.write_text(od.read_text().replace("OD_VDDGFX_OFFSET:\n0mV", "OD_VDDGFX_OFFSET:\n-30mV"))
    code, out, _err = tuner(capsys, "service", "status")
    assert "changed since (-30 found, -50 installed)" in _card_lines(out)[0]


def test_not_applied_says_why_from_the_last_boot_run(capsys, amd_tree, monkeypatch):
    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: True)
    code, _out, err = tuner(capsys, "service", "install")
    assert code == 0, err
    boot_apply._record(boot_apply.BootReport(None, (boot_apply.BootCardResult(
        "r9070", "error", 5, device=amd_tree[1], reason="the driver refused the write"),), 5, ()), False)
    code, out, _err = tuner(capsys, "service", "status")
    assert "not applied (this boot did not: the driver refused the write)" in _card_lines(out)[0]


def test_a_missing_card_says_so_and_how_long_the_boot_waited(capsys, boot):
    save_profile(sim_profile("elsewhere", seed=9, value=-45), system=True)  # a card of another machine
    lines: list[str] = []
    report = boot_apply.run_boot_apply(lambda: sim(), wait_s=0.2, log=lines.append)
    assert report.exit_code == 0 and report.waited_s is not None and report.waited_s <= 5
    assert any(line.startswith("waited ") and "--boot-wait" in line for line in lines)
    _code, out, _err = tuner(capsys, "--simulate", "--sim-gpus", "2", "service", "status")
    (line,) = _card_lines(out)
    assert "elsewhere on (no card): missing: its card is not in this machine (the boot waited" in line


def test_without_a_gpu_the_rest_of_the_status_still_shows(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_SYSFS_ROOT", str(tmp_path))
    monkeypatch.setattr("tuner.backends.nvidia.import_nvml", lambda: None)
    code, out, _err = tuner(capsys, "service", "status")
    assert code == 0 and "cards       not read:" in out and "unit " in out


@pytest.mark.parametrize("damage", [{"waited_s": "3 s"}, {"results": 7}, {"results": [{"card": []}]}])
def test_a_last_run_record_with_a_field_of_another_type_is_not_a_traceback(capsys, boot, damage):
    """The last boot run's record is read for the status (`read_last_run`); a field of another type (a hand edit,
    another version's file) raised ValueError ("Unknown format code 'g'") or TypeError ("'int' object is not
    iterable", "unhashable type") out of `service status`: a traceback instead of the cards' states."""
    from tuner.core import kernel_files

    save_profile(sim_profile("elsewhere", seed=9, value=-45), system=True)  # its card is missing: waited_s is read
    save_profile(sim_profile("mine", value=-50), system=True)  # its card is here, not applied: results are read
    path = boot_apply.last_run_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"finished_at": 1.0, "exit_code": 0, "boot_id": kernel_files.boot_id(), "lines": [],
                                "results": [], "waited_s": 1.0, **damage}))
    code, out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "service", "status")
    assert code == 0, err
    assert len(_card_lines(out)) == 2


def test_a_fifo_or_a_link_at_the_last_run_record_is_no_record_not_a_hang(boot, tmp_path):
    """The last boot run's record is a state file: a FIFO there (nothing writes it) hung `service status` and the
    UI's boot panel in the open; a link was followed. Either is read as no record."""
    import os

    from tests.cli_helpers import run_tuner

    save_profile(sim_profile("mine", value=-50), system=True)
    path = boot_apply.last_run_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    done = run_tuner("--simulate", "--sim-gpus", "2", "service", "status", timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(_card_lines(done.stdout)) == 1
    path.unlink()
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(json.dumps({"finished_at": 1.0, "exit_code": 0, "lines": [], "results": []}))
    path.symlink_to(elsewhere)
    assert boot_apply.read_last_run() is None


def test_a_card_that_cannot_be_read_leaves_the_rest_of_the_status(capsys, amd_tree):
    """A card whose knob read fails (a garbled pp_od_clk_voltage, a card fallen off the bus) is when the status is
    asked for: the unit, the profiles and the last boot run still show, and the card's line says why."""
    od, _slot = amd_tree
    od.write_text("garbage\n")
    code, out, err = tuner(capsys, "service", "status")
    assert code == 0, err
    assert "unit " in out and "next boot" in out
    assert "cards       not read: pp_od_clk_voltage does not start with a section header" in out
