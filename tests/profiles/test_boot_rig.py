"""The boot service with rig profiles, and tuner.actions.boot_service as the UI calls it."""

from __future__ import annotations

import json

import pytest

from tests.profiles.helpers import sim, sim_profile, tuner
from tests.profiles.test_rig_apply import save_rig, settings
from tuner.actions import boot_service
from tuner.core import exit_codes, paths
from tuner.core.errors import PermissionDenied
from tuner.profiles import boot, save_profile

BOOT_ID = "11111111-2222-3333-4444-555555555555"


@pytest.fixture
def fake_root(boot):
    boot(BOOT_ID)
    (boot.root / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz root=UUID=abc ro quiet\n")
    return boot.root


@pytest.fixture
def root(monkeypatch):
    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: True)


@pytest.fixture
def simulated_install(monkeypatch):
    """These tests follow install -> boot run -> status on the simulated rig; the boot service refuses a simulated
    profile in real use (boot_service.refuse_simulated, tested on its own in test_boot.py), so it is lifted here."""
    monkeypatch.setattr("tuner.actions.boot_service.refuse_simulated", lambda profile: None)


def _boot(capsys, *extra, gpus: int = 3):
    return tuner(capsys, "--simulate", "--sim-gpus", str(gpus), "apply", "--boot", "--boot-wait", "0", *extra)


def _system_rig(**kw):
    profile = save_rig(**kw)
    save_profile(profile, system=True, overwrite=True)
    return profile


def test_boot_applies_every_part_of_a_rig_to_its_own_card(capsys, fake_root):
    _system_rig()
    code, out, err = _boot(capsys, "--json")
    assert code == 0, err
    for i, (dev, value) in enumerate((("sim0", -40), ("sim1", -55), ("sim2", -30))):
        assert f"tuner: boot: applied 'rig' card[{i}] to {dev}" in err and f"{value:+d} mV (read back)" in err
    assert [r["status"] for r in json.loads(out)["boot"]] == ["applied"] * 3
    assert settings() == [-40, -55, -30]


def test_boot_skips_a_missing_card_says_so_applies_the_others_and_fails_the_unit(capsys, fake_root):
    _system_rig()
    code, out, err = _boot(capsys, "--json", gpus=2)
    assert code == exit_codes.HARDWARE
    assert ("tuner: boot: missing card: 'rig' card[2] not applied: its card (serial SIM-0000-02, slot ?) is not in "
            "this machine; the rig's other cards are still applied") in err
    assert [r["status"] for r in json.loads(out)["boot"]] == ["applied", "applied", "missing"]
    assert settings(gpus=2) == [-40, -55]


def test_boot_never_gives_a_part_to_another_card_in_its_slot(capsys, fake_root, monkeypatch):
    """No --force at boot: a card whose serial differs, sitting in the part's slot, stays at stock."""
    from dataclasses import replace

    from tuner.backends.simulated import SimulatedBackend

    backend = sim(gpus=3)
    devs = [replace(d, pci_slot=f"0000:0{i + 3}:00.0") for i, d in enumerate(backend.devices())]
    devs[0] = replace(devs[0], serial="THE-OLD-CARD")
    _system_rig(devices=devs)
    original = SimulatedBackend.devices
    monkeypatch.setattr(SimulatedBackend, "devices", lambda self: [
        replace(d, pci_slot=f"0000:0{i + 3}:00.0") for i, d in enumerate(original(self))])
    code, _out, err = _boot(capsys)
    assert code == exit_codes.HARDWARE
    assert "'rig' card[0] not applied: sim0 is not the card it was proven on (serial THE-OLD-CARD)" in err
    assert settings() == [0, -55, -30]


def test_boot_skip_rules_hold_for_a_rig(capsys, fake_root):
    (fake_root / "proc/cmdline").write_text("quiet tuner.reset\n")
    _system_rig()
    code, _out, err = _boot(capsys)
    assert code == 0 and "skipped: the kernel command line contains tuner.reset" in err
    assert settings() == [0, 0, 0]


def test_install_status_remove_through_the_action_api(capsys, fake_root, root, simulated_install):
    save_rig()  # in the user store; install copies it to the system store
    result = boot_service.install("rig")
    assert result.changed and result.profile == "rig"
    assert result.profile_path == paths.system_profiles_dir() / "rig.toml" and result.profile_path.exists()
    assert "apply --boot rig\n" in boot.unit_path().read_text()
    assert any("rig of 3 cards: -40, -55, -30 mV" in m for m in result.messages)
    st = boot_service.status()
    assert (st.installed, st.profile, st.last_run) == (True, "rig", None)
    assert [(p.name, p.cards) for p in st.system_profiles] == [("rig", 3)]
    assert st.enabled is None and st.active is None  # systemd cannot be asked here: unknown, not "disabled"
    assert st.next_boot_skips is None

    code, _out, _err = _boot(capsys, gpus=2)  # the boot run records how it ended
    assert code == exit_codes.HARDWARE
    last = boot_service.status(simulated=True).last_run  # a simulated run's own record
    assert last is not None and not last.ok and last.exit_code == exit_codes.HARDWARE
    assert any("missing card: 'rig' card[2]" in line for line in last.lines)

    removed = boot_service.remove()
    assert removed.changed and not boot.unit_path().exists()
    assert (paths.system_profiles_dir() / "rig.toml").exists()  # profiles are kept
    assert not boot_service.remove().changed  # nothing to do is not an error
    assert not boot_service.status().installed


def test_install_every_system_profile_and_a_single_card_one(root, fake_root):
    save_profile(sim_profile("mine", value=-45), system=True)
    result = boot_service.install()
    assert result.profile is None and result.profile_path is None
    assert boot_service.status().profile is None
    assert boot_service.status().system_profiles[0].summary.endswith("[SIMULATED], -45 mV")


def test_install_and_remove_need_root(monkeypatch):
    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: False)
    with pytest.raises(PermissionDenied, match="needs root"):
        boot_service.install()
    with pytest.raises(PermissionDenied, match="needs root"):
        boot_service.remove()
    assert not boot.unit_path().exists()


def test_install_with_nothing_to_apply_is_refused_without_cli_words(root):
    with pytest.raises(boot_service.NoSystemProfiles) as info:
        boot_service.install()
    assert "--" not in info.value.one_line()  # the UI shows it as it is: no command-line flags in it


def test_service_status_cli_shows_the_rig_and_the_last_run(capsys, fake_root, root, simulated_install):
    save_rig()
    assert tuner(capsys, "service", "install", "--profile", "rig")[0] == 0
    _boot(capsys)
    code, out, _err = tuner(capsys, "--simulate", "--sim-gpus", "3", "service", "status")  # the simulated run's
    assert code == 0
    assert "rig (rig of 3 cards: -40, -55, -30 mV)" in out
    assert "last boot" in out and ": ok" in out and "applied 'rig' card[1] to sim1" in out
    doc = json.loads(tuner(capsys, "--simulate", "--sim-gpus", "3", "service", "status", "--json")[1])
    assert doc["profile"] == "rig" and doc["last_run"]["exit_code"] == 0


def test_a_boot_run_that_errors_is_recorded_too(capsys, fake_root):
    code, _out, err = _boot(capsys, "no-such-profile")
    assert code == exit_codes.USAGE and "no profile named 'no-such-profile'" in err
    last = boot_service.status(simulated=True).last_run
    assert last is not None and last.exit_code == exit_codes.USAGE
    assert last.lines[-1].startswith("error: no profile named 'no-such-profile'")


def test_a_card_whose_setting_cannot_be_read_fails_alone_the_others_still_apply(capsys, fake_root, monkeypatch):
    """Each card is applied on its own (boot_apply's docstring): one card whose knob cannot be read (the driver
    lost it, a missing overdrive file) is that card's error, not the end of the boot run for every card."""
    from tuner.backends.simulated import SimulatedBackend
    from tuner.core.errors import DeviceLost

    _system_rig()
    original = SimulatedBackend.knob

    def knob(self, device_id):
        if device_id == "sim1":
            raise DeviceLost("sim1: the card stopped answering", "reboot")
        return original(self, device_id)

    monkeypatch.setattr(SimulatedBackend, "knob", knob)
    code, out, err = _boot(capsys, "--json")
    assert code == exit_codes.HARDWARE, err
    assert out, err
    assert [r["status"] for r in json.loads(out)["boot"]] == ["applied", "error", "applied"]
    monkeypatch.setattr(SimulatedBackend, "knob", original)
    assert settings() == [-40, 0, -30]


def test_a_simulated_boot_run_keeps_the_real_record_and_its_own_says_simulated(capsys, fake_root, root,
                                                                                 simulated_install):
    """`tuner --simulate apply --boot` wrote the record the real boot run writes: a plain `service status` then
    showed the simulated run as the machine's last boot, unlabelled, and the real record was gone."""
    from tuner.actions import boot_apply

    real = {"finished_at": 1.0e9, "exit_code": 0, "skipped": None, "lines": ["applied the real card"], "mode": "boot"}
    boot_apply.last_run_path().parent.mkdir(parents=True, exist_ok=True)
    boot_apply.last_run_path().write_text(json.dumps(real))
    save_rig()
    assert tuner(capsys, "service", "install", "--profile", "rig")[0] == 0
    assert _boot(capsys)[0] == 0
    assert json.loads(boot_apply.last_run_path().read_text()) == real  # the machine's record is untouched
    code, out, _err = tuner(capsys, "service", "status")
    assert code == 0 and "applied the real card" in out and "applied 'rig' card[1] to sim1" not in out
    code, out, _err = tuner(capsys, "--simulate", "--sim-gpus", "3", "service", "status")
    [last] = [line for line in out.splitlines() if line.startswith("last boot")]
    assert code == 0 and "SIMULATED" in last and "applied 'rig' card[1] to sim1" in out
    doc = json.loads(tuner(capsys, "--simulate", "--sim-gpus", "3", "service", "status", "--json")[1])
    assert doc["last_run"]["simulated"] is True and doc["last_run"]["exit_code"] == 0


def _pinned_record(tmp_path, monkeypatch, capsys):
    """The unit installed from one state folder (the installer's, as root's /root/.local/state is), its boot run's
    record there, and the status then asked from another user's state folder."""
    from tuner.actions import boot_apply

    save_rig()
    assert tuner(capsys, "service", "install", "--profile", "rig")[0] == 0
    record = {"finished_at": 1.0e9, "exit_code": 0, "skipped": None, "lines": ["applied the real card"],
              "mode": "boot"}
    pinned = boot_apply.last_run_path()
    pinned.parent.mkdir(parents=True, exist_ok=True)
    pinned.write_text(json.dumps(record))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "another-user-state"))
    assert boot_apply.last_run_path() != pinned
    return pinned


def test_service_status_reads_the_last_boot_run_where_the_unit_records_it(capsys, fake_root, root, simulated_install,
                                                                          tmp_path, monkeypatch):
    """The boot unit pins XDG_STATE_HOME to the installer's (root's, with `sudo tuner service install`): its record
    is there, not in the state folder of whoever asks for the status. A user's status said nothing of it."""
    _pinned_record(tmp_path, monkeypatch, capsys)
    code, out, _err = tuner(capsys, "service", "status")
    assert code == 0 and "applied the real card" in out, out
    assert boot_service.status().last_run is not None


def test_a_last_boot_run_only_root_can_read_is_said_so(capsys, fake_root, root, simulated_install, tmp_path,
                                                       monkeypatch):
    """As a user sees root's record (under /root, mode 0700): not "no boot run", but where it is and how to read it.
    The read refusal stands in for the kernel's (the tests run as root, whom permissions do not stop)."""
    from tuner.core import state_files

    pinned = _pinned_record(tmp_path, monkeypatch, capsys)
    real_read = state_files.read_file

    def as_a_user(path, limit):
        if path == pinned:
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path, limit)

    monkeypatch.setattr(state_files, "read_file", as_a_user)
    code, out, _err = tuner(capsys, "service", "status")
    [last] = [line for line in out.splitlines() if line.startswith("last boot")]
    assert code == 0 and str(pinned) in last and "sudo tuner service status" in last, out
    doc = json.loads(tuner(capsys, "service", "status", "--json")[1])
    assert doc["last_run"] is None and str(pinned) in doc["last_run_unreadable"]
