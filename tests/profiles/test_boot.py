"""`apply --boot` skip rules, discovery retries, and the systemd unit written by `tuner service`."""

from __future__ import annotations

import json
import os

import pytest

from tests.profiles.helpers import sim, sim_profile, tuner
from tuner.core import paths, system_units
from tuner.core.errors import Unsupported
from tuner.profiles import boot, build_profile, save_profile
from tuner.tuning import journal

BOOT_ID = "11111111-2222-3333-4444-555555555555"


@pytest.fixture
def fake_root(boot):
    """A fake /proc with a boot id and a plain kernel command line."""
    boot(BOOT_ID)
    (boot.root / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz root=UUID=abc ro quiet splash\n")
    return boot.root


def _boot(capsys, *extra):
    return tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "--boot", "--boot-wait", "0", *extra)


def _write_journal(boot_id, device="sim0", setting=-80):
    directory = paths.state_dir() / "journal"
    directory.mkdir(parents=True, exist_ok=True)
    trial = {"session": "s1", "device": device, "setting": setting, "phase": "refine", "boot_id": boot_id,
             "pid": 999999, "started_at": 0}
    (directory / f"{device}.json").write_text(json.dumps({"version": 1, "session": "s1", "device": device,
                                                          "state": "active", "params": {}, "trials": [],
                                                          "open_trial": trial}))


def test_boot_applies_a_system_profile_to_its_own_card_only(capsys, fake_root):
    save_profile(sim_profile("mine", value=-45), system=True)
    save_profile(sim_profile("user-only", device_index=1, value=-20))  # the user store is not read at boot
    code, _out, err = _boot(capsys)
    assert code == 0, err
    assert "tuner: boot: applied 'mine' to sim0" in err
    assert sim().knob("sim0").current == -45 and sim().knob("sim1").current == 0


def test_boot_skips_with_tuner_reset_on_the_kernel_command_line(capsys, fake_root):
    (fake_root / "proc/cmdline").write_text("root=/dev/sda1 ro tuner.reset quiet\n")
    save_profile(sim_profile("mine", value=-45), system=True)
    code, _out, err = _boot(capsys)
    assert code == 0
    assert err.strip() == ("tuner: boot: skipped: the kernel command line contains tuner.reset; leaving the cards "
                           "at stock")
    assert sim().knob("sim0").current == 0


@pytest.mark.parametrize("cmdline", ["tuner.reset=1", "quiet tuner.reset"])
def test_reset_flag_forms(fake_root, cmdline):
    (fake_root / "proc/cmdline").write_text(cmdline)
    assert boot.reset_requested()


@pytest.mark.parametrize("cmdline", ["tuner.resetx", "notuner.reset", "tuner=reset", ""])
def test_reset_flag_lookalikes(fake_root, cmdline):
    (fake_root / "proc/cmdline").write_text(cmdline)
    assert not boot.reset_requested()


def test_boot_skips_after_a_trial_left_open_by_the_previous_boot(capsys, fake_root):
    _write_journal("00000000-dead-boot-0000-000000000000")
    save_profile(sim_profile("mine", value=-45), system=True)
    code, _out, err = _boot(capsys)
    assert code == 0
    assert "skipped: a tuning trial was still open when the previous boot ended (device sim0, setting -80" in err
    assert sim().knob("sim0").current == 0


def test_a_trial_open_in_this_boot_does_not_block(capsys, fake_root):
    _write_journal(BOOT_ID)  # a bisect running right now, not a crashed boot
    save_profile(sim_profile("mine", value=-45), system=True)
    code, _out, err = _boot(capsys)
    assert code == 0 and "applied 'mine'" in err


def test_open_trial_comes_from_the_journal_module(fake_root):
    _write_journal("old-boot")
    assert journal.trial_open_at_previous_boot()["setting"] == -80
    assert "setting -80" in boot.skip_reason()


def test_boot_skips_a_profile_for_another_card(capsys, fake_root):
    save_profile(sim_profile("elsewhere", seed=9, value=-45), system=True)  # serial SIM-0009-00: not here
    code, _out, err = _boot(capsys)
    assert code == 0
    assert "skipped 'elsewhere': its card (simulated 0000:0000/0000:0000 simulated @? #SIM-0009-00) is not in" in err
    assert sim().knob("sim0").current == 0


def test_boot_applies_the_named_system_profile_not_a_user_profile_of_the_same_name(capsys, fake_root):
    """The unit runs `apply --boot NAME` as root with the installer's XDG_CONFIG_HOME pinned: the user store there
    is the installer's to edit, and `service install` copied NAME into the system store, which is what boots."""
    save_profile(sim_profile("mine", value=-45), system=True)
    save_profile(sim_profile("mine", value=-70))  # same name, same card, in the (user-writable) user store
    code, _out, err = _boot(capsys, "mine")
    assert code == 0, err
    assert sim().knob("sim0").current == -45


def test_boot_with_no_profiles(capsys, fake_root):
    code, _out, err = _boot(capsys)
    assert code == 0 and "no profiles in the system store" in err


def test_discovery_retries_until_the_driver_is_up(capsys):
    attempts, slept = [], []
    clock = iter(range(1000)).__next__

    def open_backend():
        attempts.append(1)
        if len(attempts) < 3:
            raise Unsupported("no supported GPU found")
        return "backend"

    got = boot.discover(open_backend, lambda b: True, wait_s=30, interval_s=3, sleep=slept.append, clock=clock)
    assert got == "backend" and len(attempts) == 3 and slept == [3, 3]
    assert capsys.readouterr().err.count("waiting for the GPU driver (no supported GPU found)") == 2


def test_discovery_gives_up_with_the_last_error():
    def never():
        raise Unsupported("no supported GPU found")

    with pytest.raises(Unsupported):
        boot.discover(never, lambda b: True, wait_s=0, sleep=lambda s: None)


# --- the unit and `tuner service` -----------------------------------------------------------------------------


def test_unit_text():
    text = system_units.apply_unit(["/opt/venv/bin/python", "-m", "tuner", "apply", "--boot"],
                                   {"XDG_STATE_HOME": "/root/.local/state", "ODD": "50% off"})
    lines = text.splitlines()
    for expected in ["[Unit]", ("After=sysinit.target sockets.target systemd-modules-load.service "
                     "systemd-udev-trigger.service"), "DefaultDependencies=no",
                     "ConditionPathIsDirectory=/sys/class/drm", "ConditionKernelCommandLine=!tuner.reset",
                     "[Service]", "Type=oneshot", "RemainAfterExit=yes",
                     "ExecStart=/opt/venv/bin/python -m tuner apply --boot",
                     "Environment=XDG_STATE_HOME=/root/.local/state", "Environment='ODD=50%% off'",
                     "StandardError=journal", "[Install]", "WantedBy=multi-user.target"]:
        assert expected in lines, expected


def _real_profile(name: str = "mine"):
    from tests.profiles.helpers import AMD_KNOB, RX9070

    return save_profile(build_profile(name, RX9070, AMD_KNOB, -45, kernel="6.14.0-test"))


def test_service_install_needs_root(capsys, monkeypatch):
    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: False)
    _real_profile("mine")
    code, _out, err = tuner(capsys, "service", "install", "--profile", "mine")
    assert code == 3
    assert err.strip().startswith("tuner: error: installing the boot service needs root") and "sudo" in err
    assert not boot.unit_path().exists() and not paths.system_profiles_dir().exists()
    code, _out, err = tuner(capsys, "service", "uninstall")
    assert code == 3


def test_service_install_status_uninstall(capsys, monkeypatch):
    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: True)
    _real_profile("mine")
    code, out, err = tuner(capsys, "service", "install", "--profile", "mine")
    assert code == 0, err
    text = boot.unit_path().read_text()
    assert "apply --boot mine\n" in text and f"XDG_STATE_HOME={paths.state_dir().parent}" in text
    assert (paths.system_profiles_dir() / "mine.toml").exists()
    code, out, err = tuner(capsys, "service", "status", "--json")
    doc = json.loads(out)
    assert doc["installed"] and doc["system_profiles"][0]["name"] == "mine" and doc["next_boot_skips"] is None
    code, out, err = tuner(capsys, "service", "uninstall")
    assert code == 0 and not boot.unit_path().exists()
    assert (paths.system_profiles_dir() / "mine.toml").exists()  # profiles are kept


def test_service_install_without_profiles_is_refused(capsys, monkeypatch):
    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: True)
    code, _out, err = tuner(capsys, "service", "install")
    assert code == 2 and "no profiles" in err and not boot.unit_path().exists()


def test_default_unit_path_is_etc_systemd(monkeypatch):
    monkeypatch.delenv("TUNER_SYSTEMD_DIR")
    assert str(boot.unit_path()) == "/etc/systemd/system/tuner-apply.service"
    assert os.environ.get("TUNER_SYSTEMD_DIR") is None


@pytest.mark.parametrize("root", [True, False])
def test_a_simulated_profile_or_session_never_installs_the_boot_service(capsys, monkeypatch, root):
    """The unit acts on the real machine at every boot: a profile measured on a SIMULATED card, or a --simulate
    session, is refused in one line (exit 2) before anything is written, as root too (a simulated session run as
    root once wrote and enabled a real unit in /etc)."""
    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: root)
    save_profile(sim_profile("simmed"))
    _real_profile("real")
    for argv, why in ((("service", "install", "--profile", "simmed"), "was measured on a SIMULATED card"),
                      (("--simulate", "service", "install", "--profile", "real"), "runs on SIMULATED cards")):
        code, _out, err = tuner(capsys, *argv)
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and why in err and "nothing installed" in err
        assert not boot.unit_path().exists() and not paths.system_profiles_dir().exists()


def test_a_simulated_part_of_a_rig_profile_is_refused_too(monkeypatch):
    from tests.profiles.helpers import AMD_KNOB, RX9070, sim
    from tuner.actions import boot_service
    from tuner.core.errors import UsageError
    from tuner.profiles.build import RigPart, build_rig_profile

    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: True)
    backend = sim()
    save_profile(build_rig_profile("mixed", [RigPart(RX9070, AMD_KNOB, -40),
                                             RigPart(backend.device("sim1"), backend.knob("sim1"), -30)]))
    with pytest.raises(UsageError, match="SIMULATED"):
        boot_service.install("mixed")
    assert not boot.unit_path().exists() and not paths.system_profiles_dir().exists()


def test_a_card_that_is_here_but_no_longer_fits_its_profile_is_not_a_skip(capsys, fake_root):
    """The same card (its serial) after a kernel or driver update that changed its overdrive format: the profile
    no longer fits it, so it is not applied, but the card is here: not "not in this machine" with exit 0 (a
    `systemctl status` that says success while the undervolt is gone)."""
    from dataclasses import replace

    backend = sim()
    dev = backend.devices()[0]
    proven = replace(dev, od_format="rdna4-before-the-update")
    save_profile(build_profile("mine", proven, backend.knob(dev.id), -45, kernel="6.14.0-test"), system=True)
    code, _out, err = _boot(capsys)
    assert "is not in this machine" not in err
    assert code != 0 and "overdrive format" in err
    assert sim().knob("sim0").current == 0


def test_boot_logs_the_identity_warnings_that_apply_shows(capsys, fake_root):
    # the same card, but its VBIOS changed since tuning: `tuner apply` warns that the limit can move; at boot, where
    # nobody watches, the log and the last-run record (`tuner service status`) must say it too
    import dataclasses

    from tuner.actions.boot_apply import read_last_run

    backend = sim()
    dev = dataclasses.replace(backend.devices()[0], vbios="SIM.OLD.000")
    save_profile(build_profile("mine", dev, backend.knob("sim0"), -45, kernel="6.14.0-test"), system=True)
    code, _out, err = _boot(capsys)
    assert code == 0 and sim().knob("sim0").current == -45, err
    warning = "VBIOS changed since tuning (SIM.OLD.000 -> SIM.000.000)"
    assert warning in err
    assert any(warning in line for line in read_last_run(simulated=True)["lines"])


def test_boot_never_applies_a_profile_to_another_card_whose_serial_is_a_placeholder(fake_root, tmp_path):
    """amdsmi answers 'N/A' for a serial it cannot read (ROCm/rocm-systems PR #3041): two such cards had the same
    serial, so boot apply found the profile's card "by serial" in the first slot with one, called it the same card,
    and wrote a limit proven on the card in the other slot to it. A placeholder is no serial: found by slot."""
    from tests.backends.fakes.trees import two_rdna4_cards_without_serials
    from tuner.actions.boot_apply import run_boot_apply

    backend, slots = two_rdna4_cards_without_serials(tmp_path / "hw")
    proven_on = backend.devices()[1]  # the card in the second slot
    assert proven_on.pci_slot == slots[1]
    save_profile(build_profile("second", proven_on, backend.knob(proven_on.id), -30, kernel="6.14.0-fake"),
                 system=True)
    report = run_boot_apply(lambda: backend, wait_s=0, log=lambda line: None)
    assert [(r.status, r.device) for r in report.results] == [("applied", slots[1])], report.lines
    assert backend.knob(slots[0]).current == 0
    assert backend.knob(slots[1]).current == -30


def test_boot_never_applies_a_value_on_the_machines_unsafe_list(capsys, fake_root):
    """A value that reset the machine in a trial through the root helper is on the helper's list
    (/var/lib/tuner, keyed by the card): the boot run, in-process as root, holds it too (never re-applied)."""
    from tuner.helper.schema import UnsafeEntry
    from tuner.helper.state import MachineState, card_key

    save_profile(sim_profile("mine", value=-45), system=True)
    machine = MachineState(paths.system_state_dir())
    machine.create()
    card = sim().devices()[0]
    machine.add_unsafe(card_key(card), UnsafeEntry(setting=-45, unit="mV", kind="system-reset", reason="reset in a "
                                                   "verify", device="sim0", serial=card.serial))
    code, _out, err = _boot(capsys)
    assert sim().knob("sim0").current == 0, err
    assert code != 0 and "-45 mV is at or beyond -45 mV, which failed hard on sim0" in err


def test_a_damaged_machine_unsafe_list_applies_nothing_to_its_card_at_boot(capsys, fake_root):
    from tuner.helper.state import MachineState, card_key

    save_profile(sim_profile("mine", value=-45), system=True)
    machine = MachineState(paths.system_state_dir())
    machine.create()
    machine.unsafe_path(card_key(sim().devices()[0])).write_text('{"setting": -4')  # torn by a crash
    code, _out, err = _boot(capsys)
    assert code == 2 and sim().knob("sim0").current == 0, err
    assert "is damaged" in err and "Traceback" not in err
