"""A FIFO or /dev/zero where a sysfs or proc file should be never hangs a command or fills its memory (issue 28,
item 8): each read refuses anything but a regular file (tuner.core.kernel_files).

Each command runs in a real subprocess with a deadline far above its normal run time (a second or two): today's
code blocks on the FIFO until the deadline kills it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.backends.fakes.trees import make_tree
from tests.cli_helpers import REPO

DEADLINE_S = 60  # a hang is a hang: the commands below take a second or two


def _tuner(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    try:
        return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                              timeout=DEADLINE_S, env=full, cwd=REPO, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`tuner {' '.join(args)}` hung for {DEADLINE_S} s")


def _plant(path, what: str) -> None:
    path.unlink(missing_ok=True)
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("what", ["fifo", "zero"])
@pytest.mark.parametrize("attribute", ["pp_od_clk_voltage", "vendor"])
def test_list_status_set_reset_refuse_a_special_file_at_an_attribute(tmp_path, what, attribute):
    (dev,) = make_tree(tmp_path, ["rdna4"])
    _plant(dev / attribute, what)
    env = {"TUNER_SYSFS_ROOT": str(tmp_path)}
    for args in (["list"], ["status"], ["set", "--offset", "-30", "--yes"], ["reset"]):
        proc = _tuner(*args, env=env)
        assert "Traceback" not in proc.stderr, proc.stderr
        if attribute == "vendor":  # the card is not recognised as AMD's: "no supported GPU" (4)
            assert proc.returncode == 4, (args, proc.stderr)
        elif args == ["list"]:  # the card is listed, its knob row says why it cannot be used
            assert proc.returncode == 0 and "not a sysfs or proc file" in proc.stdout, proc.stdout
        else:
            assert proc.returncode == 4, (args, proc.returncode, proc.stderr)
            assert proc.stderr.count("\n") == 1 and "not a sysfs or proc file" in proc.stderr, proc.stderr


@pytest.mark.parametrize("what", ["fifo", "zero"])
def test_a_special_boot_id_reads_as_unknown_without_hanging(boot, what, in_process_backend):
    """The boot id is read wherever a journal's open trial is judged: `status` over a trial left open."""
    from tuner.tuning import journal

    j = journal.Journal.create("sim0", params={}, knob={}, backend=in_process_backend)
    j.begin_trial("coarse", setting=-10)
    boot_id = boot.root / "proc/sys/kernel/random/boot_id"
    _plant(boot_id, what)
    proc = _tuner("--simulate", "status", env={"TUNER_SYSFS_ROOT": str(boot.root)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "a coarse trial at -10 mV did not finish" in proc.stderr  # an unknown boot: the safe answer


def test_the_boot_id_reader_refuses_special_files_at_once(tmp_path):
    from tuner.core import kernel_files

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero", tmp_path):
        with pytest.raises(kernel_files.NotAKernelFile):
            kernel_files.read_bytes(path, timeout_s=DEADLINE_S)


def test_stress_refuses_a_fifo_given_as_its_reference(tmp_path):
    """`tuner reference show` and `tuner screen` refuse a FIFO where a reference file should be; `tuner stress
    --reference FIFO` started the engine, whose read of the reference blocked until something wrote to the FIFO: the
    command hung, nothing ran (a device node such as /dev/zero would have been read until memory ran out)."""
    fifo = tmp_path / "stock.ref"
    os.mkfifo(fifo)
    proc = _tuner("--simulate", "stress", "--device", "sim0", "--steps", "5", "--reference", str(fifo), env={})
    assert proc.returncode == 2 and "a FIFO" in proc.stdout + proc.stderr, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("attribute", ["vendor", "class", "efivar"])
def test_doctor_refuses_a_fifo_under_the_sysfs_root_without_hanging(tmp_path, attribute):
    """`tuner doctor` looks for an NVIDIA card no driver took (`sys/bus/pci/devices/*/vendor`, `class`) and reads
    the Secure Boot EFI variable: each read went straight to `Path.read_text`/`read_bytes`, whose open of a FIFO
    waits for a writer, so the doctor hung instead of reading through tuner.core.kernel_files."""
    from tuner.actions.doctor import EFI_SECURE_BOOT

    dev = tmp_path / "sys/bus/pci/devices/0000:01:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030000\n")
    efivar = tmp_path / EFI_SECURE_BOOT
    efivar.parent.mkdir(parents=True)
    efivar.write_bytes(b"\x06\x00\x00\x00\x01")
    _plant(efivar if attribute == "efivar" else dev / attribute, "fifo")
    proc = _tuner("doctor", env={"TUNER_SYSFS_ROOT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""})
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 4 and "[FAIL] gpu: no supported GPU found" in proc.stdout, proc.stdout
