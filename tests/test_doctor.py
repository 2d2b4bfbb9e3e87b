import json

from tests.cli_helpers import run_tuner
from tuner.actions import doctor
from tuner.actions.doctor import FAIL, INFO, OK, WARN, run_checks


def amd_tree(root, *, mask="0xfff7bfff", od=True, cards=1):
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
