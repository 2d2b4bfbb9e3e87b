import json

import pytest

from tests.cli_helpers import run_tuner
from tuner.actions import doctor
from tuner.actions.doctor import FAIL, INFO, OK, WARN, run_checks


def amd_tree(root, *, mask="0xfff7bfff", od=None, cards=1):
    """amdgpu's sysfs as the driver makes it: `pp_od_clk_voltage` only where the mask has the overdrive bit 0x4000
    (../shared/reference/control.md section 2: amdgpu_pm.c default_attr_update removes the file otherwise).
    `od=False`: missing even with the bit (RDNA3 before kernel 6.7, section 1.8); a file with the bit off cannot
    happen, so it is refused here."""
    bit = bool(int(mask, 16) & 0x4000)
    if od and not bit:
        raise ValueError(f"no driver makes pp_od_clk_voltage with ppfeaturemask {mask} (overdrive bit 0x4000 off)")
    od = bit if od is None else od
    (root / "sys/module/amdgpu/parameters").mkdir(parents=True)
    (root / "sys/module/amdgpu/parameters/ppfeaturemask").write_text(mask + "\n")
    for n in range(cards):
        dev = root / f"sys/class/drm/card{n}/device"
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x1002\n")
        if od:
            (dev / "pp_od_clk_voltage").write_text("OD_VDDGFX_OFFSET:\n0mV\n")
    return root


class FakeNvml:
    def __init__(self, driver="560.35.03", persistence=(0,), fail_init=False):
        self.driver, self.persistence, self.fail_init = driver, persistence, fail_init
        self.shutdown_called = False

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        return len(self.persistence)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA GeForce RTX 4090"

    def nvmlDeviceGetPersistenceMode(self, h):
        return self.persistence[h]


CPU_TORCH = {"torch": "2.13.0+cpu", "cuda": None, "hip": None, "devices": []}
CUDA_TORCH = {"torch": "2.13.0", "cuda": "12.8", "hip": None, "devices": [
    {"index": 0, "name": "RTX 4090", "capability": [8, 9], "bf16": True, "pci_bus_id": "0000:01:00.0"}]}


def checks_by_name(checks):
    return {c.name: c for c in checks}


def run(tmp_path, **kw):
    kw.setdefault("root", tmp_path)
    kw.setdefault("nvml", FakeNvml(fail_init=True))
    kw.setdefault("torch_probe", lambda: CPU_TORCH)
    kw.setdefault("env", {})
    kw.setdefault("euid", 1000)
    return checks_by_name(run_checks(**kw))


def test_overdrive_off_gives_the_exact_mask_to_add(tmp_path):
    checks = run(tmp_path, root=amd_tree(tmp_path, od=False))
    assert checks["amdgpu overdrive"].status == FAIL
    assert "amdgpu.ppfeaturemask=0xfff7ffff" in checks["amdgpu overdrive"].remedy
    assert checks["amd card card0"].status == FAIL and "overdrive is off" in checks["amd card card0"].detail
    # a GPU is present, so a CPU-only torch is a problem worth a warning
    assert checks["torch build"].status == WARN


def test_overdrive_on_and_file_present(tmp_path):
    checks = run(tmp_path, root=amd_tree(tmp_path, mask="0xffffffff"))
    assert checks["amdgpu overdrive"].status == OK
    assert checks["amd card card0"].status in (OK, WARN)  # writable as root, not as a user


def test_a_missing_overdrive_file_with_the_bit_already_set_is_not_told_to_set_it(tmp_path):
    """The mask has the overdrive bit and pp_od_clk_voltage is still missing (RDNA3 before kernel 6.7, control.md
    section 1.8): adding the same ppfeaturemask and rebooting changes nothing, and overdrive is not off."""
    checks = run(tmp_path, root=amd_tree(tmp_path, mask="0xffffffff", od=False))
    assert checks["amdgpu overdrive"].status == OK
    card = checks["amd card card0"]
    assert card.status == FAIL and "overdrive is off" not in card.detail
    assert "ppfeaturemask=" not in card.remedy and "kernel" in card.remedy


@pytest.mark.parametrize("what", ["fifo", "zero"])
def test_a_special_file_at_pp_od_clk_voltage_is_not_ready(tmp_path, what):
    """`tuner set` refuses a FIFO or /dev/zero at pp_od_clk_voltage (one line, exit 4: kernel_files); the doctor
    only asked whether the path existed and was writable, and answered `ok ... present and writable`."""
    import os

    root = amd_tree(tmp_path, mask="0xffffffff")
    od = root / "sys/class/drm/card0/device/pp_od_clk_voltage"
    od.unlink()
    os.mkfifo(od) if what == "fifo" else od.symlink_to("/dev/zero")
    card = run(tmp_path, root=root)["amd card card0"]
    assert card.status == FAIL and "not a sysfs" in card.detail, card


def test_no_gpu_at_all_is_a_failure_with_a_remedy(tmp_path):
    """`tuner list` exits 4 with "no supported GPU found" here; doctor must not say all is well (issue 15)."""
    checks = run(tmp_path)
    assert checks["amdgpu"].status == INFO and checks["nvidia driver"].status == INFO
    assert checks["torch build"].status == INFO
    assert checks["gpu"].status == FAIL and "no supported GPU found" in checks["gpu"].detail
    assert "tuner --simulate" in checks["gpu"].remedy
    assert [c.name for c in checks.values() if c.status == FAIL] == ["gpu"]
    assert "gpu" not in run(tmp_path, simulate=True)  # the simulated GPU is a GPU
    assert "gpu" not in run(tmp_path, nvml=FakeNvml(persistence=(1,)))


def test_cli_doctor_without_a_gpu_exits_4(tmp_path):
    proc = run_tuner("doctor", env={"TUNER_SYSFS_ROOT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "[FAIL] gpu: no supported GPU found" in proc.stdout and "not ready to tune" in proc.stdout


def test_nvidia_persistence_off_and_old_driver(tmp_path):
    nvml = FakeNvml(persistence=(0, 1))
    checks = run(tmp_path, nvml=nvml, torch_probe=lambda: CUDA_TORCH)
    assert checks["nvidia driver"].status == OK
    assert checks["nvidia gpu 0 persistence"].status == WARN
    assert "nvidia-smi -pm 1" in checks["nvidia gpu 0 persistence"].remedy
    assert checks["nvidia gpu 1 persistence"].status == OK
    assert checks["torch build"].status == OK and "CUDA 12.8" in checks["torch build"].detail
    assert "capability 8.9" in checks["torch device 0"].detail and nvml.shutdown_called
    assert run(tmp_path, nvml=FakeNvml(driver="535.1"))["nvidia driver"].status == WARN
    assert run(tmp_path, nvml=FakeNvml(driver="510.47"))["nvidia driver"].status == FAIL


def test_an_nvidia_gpu_that_fell_off_the_bus_is_a_check_not_a_traceback(tmp_path):
    """NVML answers GpuIsLost for a card that fell off the bus (Xid 79) on every per-device call (the fake follows
    the NVML reference): the doctor, run exactly then, must name that card and still check the others."""
    from tests.backends.fakes.fake_pynvml import FakeGpu, make_fake_nvml

    m = make_fake_nvml([FakeGpu(bus_id=b"00000000:2C:00.0", lost=True), FakeGpu(bus_id=b"00000000:2B:00.0")])
    checks = run(tmp_path, nvml=m)
    lost = checks["nvidia gpu 0"]
    assert lost.status == FAIL and lost.remedy
    assert checks["nvidia gpu 1 persistence"].status in (OK, WARN)


@pytest.mark.parametrize("call", ["nvmlSystemGetDriverVersion", "nvmlDeviceGetCount"])
def test_an_nvml_that_loads_but_does_not_answer_is_a_check_not_a_traceback(tmp_path, call):
    """nvmlInit can succeed and the next call still fail (the NVML reference lists NVML_ERROR_UNKNOWN, "on any
    unexpected error", for nvmlDeviceGetCount; the fake raises what real NVML raises): the doctor must say so in its
    NVIDIA check line, with a remedy, and go on with the others."""
    from tests.backends.fakes.fake_pynvml import CODES, make_fake_nvml

    m = make_fake_nvml(fail={call: CODES["NVML_ERROR_UNKNOWN"]})
    checks = run(tmp_path, nvml=m, torch_probe=lambda: CUDA_TORCH)
    failed = [c for c in checks.values() if c.name.startswith("nvidia") and c.status == FAIL]
    assert failed and all(c.remedy for c in failed), checks
    assert checks["torch build"].status == OK and not m.initialised  # the others checked; NVML shut down


def test_a_persistence_mode_nvml_does_not_report_is_not_said_to_be_off(tmp_path):
    """nvmlDeviceGetPersistenceMode answers NVML_ERROR_NOT_SUPPORTED "if the device does not support this feature"
    (the NVML reference): the doctor read that as a mode it could not know and still said "persistence mode off"."""
    from tests.backends.fakes.fake_pynvml import CODES, make_fake_nvml

    m = make_fake_nvml(fail={"nvmlDeviceGetPersistenceMode": CODES["NVML_ERROR_NOT_SUPPORTED"]})
    check = run(tmp_path, nvml=m)["nvidia gpu 0 persistence"]
    assert check.status == WARN and "off" not in check.detail and "NVML" in check.detail, check


@pytest.mark.parametrize("driver", ["", "unknown", "R560", "²"])
def test_a_driver_version_that_is_not_a_number_is_a_warning_not_a_traceback(tmp_path, driver):
    checks = run(tmp_path, nvml=FakeNvml(driver=driver))
    assert checks["nvidia driver"].status == WARN and checks["nvidia driver"].remedy
    assert checks["nvidia gpu 0 persistence"].status == WARN  # the cards are still checked


def test_hidden_devices_root_and_broken_torch(tmp_path):
    checks = run(tmp_path, env={"CUDA_VISIBLE_DEVICES": ""}, euid=1000,
                 torch_probe=lambda: {"torch": None, "error": "ImportError: libcudart.so.12"})
    assert checks["env CUDA_VISIBLE_DEVICES"].status == WARN
    assert checks["privileges"].status == WARN and "sudo" in checks["privileges"].remedy
    assert checks["torch"].status == FAIL and "libcudart" in checks["torch"].detail
    assert run(tmp_path, euid=0)["privileges"].status == OK


def test_cli_doctor_json_against_a_fake_tree(tmp_path):
    amd_tree(tmp_path, od=False)
    proc = run_tuner("doctor", "--json", env={"TUNER_SYSFS_ROOT": str(tmp_path)})
    doc = json.loads(proc.stdout)
    assert proc.returncode == 4 and doc["ok"] is False
    overdrive = next(c for c in doc["checks"] if c["name"] == "amdgpu overdrive")
    assert "amdgpu.ppfeaturemask=0xfff7ffff" in overdrive["remedy"]


def test_real_torch_probe_runs_in_a_subprocess():
    result = doctor.probe_torch()
    assert result.get("torch"), result  # torch is a dependency, so the probe must find it


# --- issue 23: the build a machine needs, Secure Boot, overdrive per boot setup, other tools, a half install -------


def test_the_readme_section_the_doctor_names_exists():
    from pathlib import Path

    from tuner.actions import doctor

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert f"'{doctor.INSTALL_SECTION}'" in doctor.ENGINE_REMEDY
    assert f"\n## {doctor.INSTALL_SECTION}\n" in readme or f"\n### {doctor.INSTALL_SECTION}\n" in readme


def _card(root, vendor, index=0):
    d = root / f"sys/class/drm/card{index}/device"
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")


def test_the_torch_build_the_machine_needs_against_the_installed_one(tmp_path):
    from tuner.actions.doctor import FAIL, OK, WARN, check_torch_build

    _card(tmp_path, "0x10de")
    c = check_torch_build({"torch": "2.13.0+cpu"}, tmp_path, {})
    assert c.status == WARN and "needs the CUDA build (NVIDIA card at card0); installed: CPU-only" in c.detail
    assert "install-system.sh" in c.remedy
    assert check_torch_build({"torch": "2.13.0", "cuda": "12.8"}, tmp_path, {}).status == OK
    assert check_torch_build({"torch": None}, tmp_path, {}).status == FAIL


def _unbound_nvidia(root):
    dev = root / "sys/bus/pci/devices/0000:01:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030000\n")


def test_secure_boot_with_an_unsigned_nvidia_module_names_mok_enrolment(tmp_path):
    from tuner.actions.doctor import EFI_SECURE_BOOT, FAIL, check_secure_boot

    assert check_secure_boot(tmp_path, which=lambda _: None) == []  # no NVIDIA card: nothing to say
    _unbound_nvidia(tmp_path)
    (c,) = check_secure_boot(tmp_path, which=lambda _: None)
    assert c.name == "nvidia module" and "modprobe nvidia" in c.remedy  # Secure Boot unknown or off
    efivar = tmp_path / EFI_SECURE_BOOT
    efivar.parent.mkdir(parents=True)
    efivar.write_bytes(b"\x06\x00\x00\x00\x01")
    (c,) = check_secure_boot(tmp_path, which=lambda _: None)
    assert (c.name, c.status) == ("secure boot", FAIL) and "mokutil --import" in c.remedy and "Secure Boot is on" \
        in c.detail


@pytest.mark.parametrize("line", [
    # linux kernel/module/signing.c module_sig_check: with module.sig_enforce, pr_notice("Loading of %s is rejected")
    "Loading of unsigned module is rejected",
    "Loading of module with unavailable key is rejected",
    # security/lockdown/lockdown.c lockdown_is_locked_down: "Lockdown: %s: %s is restricted; see man
    # kernel_lockdown.7", lockdown_reasons[LOCKDOWN_MODULE_SIGNATURE] = "unsigned module loading"
    "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7",
])
def test_an_unbound_nvidia_card_whose_module_this_boot_refused_names_mok_enrolment(tmp_path, monkeypatch, line):
    """No Secure Boot flag to read (no efivars, no mokutil), but this boot's kernel log says a module was refused
    for its signature: the lines the kernel itself prints."""
    import subprocess

    from tuner.actions import doctor

    asked = []

    def journalctl(*command):
        asked.append(command)
        return subprocess.CompletedProcess(command, 0, f"kernel: {line}\n", "")

    _unbound_nvidia(tmp_path)
    monkeypatch.setattr(doctor, "_run", journalctl)
    (c,) = doctor.check_secure_boot(tmp_path, which=lambda name: f"/usr/bin/{name}" if name == "journalctl" else None)
    assert (c.name, c.status) == ("secure boot", doctor.FAIL) and "refused" in c.detail
    assert "mokutil --import" in c.remedy and asked == [("journalctl", "-k", "-b", "--no-pager", "-q")]


@pytest.mark.parametrize("log", [
    "",
    # modprobe's own words (strerror(EKEYREJECTED)), on its stderr: never a kernel line
    "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service",
    # kernel/module/main.c without enforcement: the module still loads (tainted), so it is not why a card is unbound
    "nvidia: module verification failed: signature and/or required key missing - tainting kernel",
])
def test_an_unbound_nvidia_card_without_a_refused_module_in_the_kernel_log_gets_the_generic_remedy(tmp_path,
                                                                                                   monkeypatch, log):
    import subprocess

    from tuner.actions import doctor

    _unbound_nvidia(tmp_path)
    monkeypatch.setattr(doctor, "_run", lambda *command: subprocess.CompletedProcess(command, 0, log + "\n", ""))
    (c,) = doctor.check_secure_boot(tmp_path, which=lambda name: f"/usr/bin/{name}" if name == "journalctl" else None)
    assert c.name == "nvidia module" and "modprobe nvidia" in c.remedy


@pytest.mark.parametrize(("tool", "expected"), [
    ("kernelstub", "sudo kernelstub -a amdgpu.ppfeaturemask=0xfff7ffff"),
    ("rpm-ostree", "sudo rpm-ostree kargs --append=amdgpu.ppfeaturemask=0xfff7ffff"),
    (None, "GRUB_CMDLINE_LINUX"),
])
def test_overdrive_instructions_for_each_boot_setup_and_modprobe_d(tmp_path, tool, expected):
    from tuner.actions.doctor import ppfeaturemask_remedy

    text = ppfeaturemask_remedy(0xFFF7BFFF, tmp_path, which=lambda name: "/usr/bin/x" if name == tool else None)
    assert expected in text and "/etc/modprobe.d/amdgpu-overdrive.conf" in text and "update-initramfs" in text
    (tmp_path / "boot/loader/entries").mkdir(parents=True)
    assert "systemd-boot" in ppfeaturemask_remedy(0xFFF7BFFF, tmp_path, which=lambda _: None)


def test_other_tools_are_named_with_the_files_they_may_write():
    from tuner.actions import other_tools
    from tuner.actions.doctor import WARN, check_other_tools

    (c,) = check_other_tools([other_tools.Found(other_tools.TOOLS[1], ("process 77",))])
    assert c.status == WARN and "corectrl_helper (CoreCtrl; process 77)" in c.detail and "/sys" in c.detail


def test_a_half_installed_system_is_named(tmp_path):
    from tuner.actions.doctor import FAIL, INFO, check_system_install
    from tuner.core import system_units

    assert check_system_install(tmp_path)[0].status == INFO
    units = system_units.system_units(prefix=str(tmp_path / "gone"), group="tunertest-nogroup")
    for name, text in units.items():
        (tmp_path / name).write_text(text)
    (c,) = check_system_install(tmp_path, group_exists=lambda g: False)
    assert c.status == FAIL and "half-installed" in c.detail and "which is missing" in c.detail
    assert "group tunertest-nogroup, which does not exist" in c.detail and "install-system.sh" in c.remedy


def test_a_unit_path_that_is_a_directory_is_a_check_not_a_traceback(tmp_path):
    """A unit name the doctor finds in the systemd directory but cannot read as a file (a directory there; a FIFO
    would hang `read_text`): `IsADirectoryError` escaped `check_system_install` and `tuner doctor` tracebacked."""
    from tuner.actions.doctor import FAIL, check_system_install
    from tuner.core import system_units

    (tmp_path / system_units.UNIT_NAMES[0]).mkdir()
    (c,) = check_system_install(tmp_path, group_exists=lambda g: True)
    assert c.status == FAIL and system_units.UNIT_NAMES[0] in c.detail and "directory" in c.detail, c
    assert "install-system.sh" in c.remedy


def test_a_whole_install_under_a_prefix_the_units_quote_is_whole(tmp_path):
    """The units quote their program (a prefix with a space, a `%` doubled for systemd): the doctor reads the
    program as systemd does, not up to the first space, and does not call a whole install half-installed."""
    from tuner.actions.doctor import OK, check_system_install
    from tuner.core import system_units

    prefix = tmp_path / "under volt 100%"
    (prefix / "bin").mkdir(parents=True)
    for program in ("python", "tuner-helper"):
        (prefix / "bin" / program).write_text("")
    for name, text in system_units.system_units(prefix=str(prefix), group="tuner").items():
        (tmp_path / name).write_text(text)
    (c,) = check_system_install(tmp_path, group_exists=lambda g: True)
    assert c.status == OK, c.detail


def test_a_user_the_root_helper_lets_in_is_not_told_to_use_sudo(tmp_path, monkeypatch):
    """With a helper that serves this user, settings are applied without root: the privileges and card checks say
    so instead of "run `sudo tuner ...`" (the helper's own check is what decides)."""
    amd_tree(tmp_path, mask="0xffffffff")  # overdrive on: the card's file is there, its permissions are the question
    monkeypatch.setattr(doctor.os, "access", lambda _path, _mode: False)  # as a user sees a root-owned 0644 file
    monkeypatch.setattr(doctor, "check_helper", lambda _sim: doctor.Check("helper", WARN, "the helper refused this "
                                                                          "user", "ask to be added to its group"))
    refused = run(tmp_path)
    assert refused["privileges"].status == WARN and "sudo" in refused["privileges"].remedy
    assert refused["amd card card0"].status == WARN and "sudo" in refused["amd card card0"].remedy
    monkeypatch.setattr(doctor, "check_helper", lambda _sim: doctor.Check("helper", OK, "tuner-helper 0.1.0 serves"))
    served = run(tmp_path)
    assert served["privileges"].status == OK and "root helper" in served["privileges"].detail
    assert not served["privileges"].remedy
    assert served["amd card card0"].status == OK and "root helper" in served["amd card card0"].detail


def test_a_foreign_server_on_the_helper_socket_is_a_check_not_a_traceback(tmp_path, monkeypatch):
    """Another program (or a helper of another protocol) on the socket answers a well-formed reply whose result is
    not a hello: `msgspec.ValidationError` escaped the client's `ask` and `tuner doctor` died with a traceback."""
    import socket
    import threading

    path = tmp_path / "h.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.makefile("rb").readline()
            conn.sendall(b'{"id": 1, "ok": true, "result": {"protocol": "two", "backend": 7}}\n')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv("TUNER_HELPER_SOCKET", str(path))
    try:
        c = doctor.check_helper()
    finally:
        thread.join(timeout=30)
        listener.close()
    assert c.status == WARN and str(path) in c.detail and c.remedy, c


def test_a_simulated_helper_is_not_said_to_write_this_machines_cards(tmp_path, monkeypatch):
    """A helper started with --simulate (TUNER_HELPER_SOCKET names it) drives SIMULATED cards: the doctor said the
    real card's pp_od_clk_voltage was written by "the root helper" and that settings need no root, which only a
    helper of real cards makes true (a silent downgrade of both checks)."""
    import os
    import threading

    from tuner.backends.simulated import SimulatedBackend
    from tuner.helper.server import HelperServer, bind_listener
    from tuner.helper.service import HelperService
    from tuner.helper.state import MachineState

    amd_tree(tmp_path / "sysroot", mask="0xffffffff")  # overdrive on: the card's file is there
    state = MachineState(tmp_path / "state")
    state.create()
    service = HelperService(SimulatedBackend(state_path=tmp_path / "sim.json"), state, group="tuner",
                            log=lambda line: None)
    listener, lock_fd = bind_listener(tmp_path / "run/h.sock", os.getgid())
    server = HelperServer(service, listener, os.getgid())
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    monkeypatch.setenv("TUNER_HELPER_SOCKET", str(tmp_path / "run/h.sock"))
    monkeypatch.setattr(doctor.os, "access", lambda _path, _mode: False)  # as a user sees a root-owned 0644 file
    try:
        checks = run(tmp_path, root=tmp_path / "sysroot")
    finally:
        server.stop.set()
        thread.join(timeout=30)
        listener.close()
        os.close(lock_fd)
    assert checks["amd card card0"].status == WARN, checks["amd card card0"]
    assert checks["privileges"].status == WARN and "sudo" in checks["privileges"].remedy, checks["privileges"]
    assert "SIMULATED" in checks["helper"].detail and checks["helper"].status == WARN, checks["helper"]
