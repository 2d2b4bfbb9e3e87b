"""NVIDIA at boot as proven (issue 23): the profile's lock clock and offset, both in the log line; persistence mode
turned on (read back) where it is off, or the card left alone with the persistence daemon as the remedy; a driver
with no max boost clock still gets the profile's lock. On the fake NVML (tests/backends/fakes/fake_pynvml.py),
whose driver drops every setting when the last client exits with persistence off, as the real one does."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading

import pytest

from tests.backends.fakes.fake_pynvml import FakeGpu, make_fake_nvml
from tests.profiles.helpers import tuner
from tuner.actions.boot_apply import run_boot_apply
from tuner.backends import nvidia
from tuner.backends.base import CompositeBackend
from tuner.backends.helper_client import HelperBackend
from tuner.backends.simulated import SimulatedBackend
from tuner.helper.server import HelperServer, bind_listener
from tuner.helper.service import HelperService
from tuner.helper.state import MachineState
from tuner.profiles import build_profile, save_profile

LOCK = 2205  # below the fake card's max boost (2520) and the simulated card's table top (2505)


@pytest.fixture
def boot_root(boot):
    boot("11111111-2222-3333-4444-555555555555")
    (boot.root / "proc/cmdline").write_text("root=/dev/sda1 ro quiet\n")
    return boot.root


def _nvml(**gpu):
    m = make_fake_nvml([FakeGpu(**gpu)])
    m.nvmlInit()
    return m


def _install_profile(m, value=120, lock=LOCK):
    backend = nvidia.NvidiaBackend(m)
    dev = backend.devices()[0]
    knob = dataclasses.replace(backend.knob(dev.id), lock_clock_mhz=lock)
    save_profile(build_profile("proven", dev, knob, value, kernel="6.14.0-test"), system=True)
    return dev.id


def _boot(m, lines):
    return run_boot_apply(lambda: nvidia.NvidiaBackend(m), wait_s=0, log=lines.append)


def test_boot_locks_at_the_profiles_clock_applies_its_offset_and_names_both(boot_root):
    m = _nvml()
    dev = _install_profile(m)
    lines: list[str] = []
    report = _boot(m, lines)
    assert report.exit_code == 0, lines
    gpu = m.gpus[0]
    assert gpu.locked[1] == LOCK and gpu.offsets[0] == 120  # not the max boost clock (2520)
    assert (f"applied 'proven' to {dev} NVIDIA GeForce RTX 4090 (fake): +120 MHz at a locked max graphics clock "
            f"of {LOCK} MHz (read back)") in lines
    assert report.results[0].lock_clock_mhz == LOCK


def test_a_driver_without_a_max_boost_clock_still_gets_the_profiles_lock(boot_root):
    m = _nvml(max_boost_mhz=None)
    _install_profile(m)
    lines: list[str] = []
    assert _boot(m, lines).exit_code == 0, lines
    assert m.gpus[0].locked[1] == LOCK and m.gpus[0].offsets[0] == 120


def test_persistence_off_is_turned_on_read_back_and_the_setting_outlives_the_run(boot_root):
    m = _nvml(persistence=0)
    dev = _install_profile(m)
    lines: list[str] = []
    assert _boot(m, lines).exit_code == 0, lines
    assert f"{dev}: turned persistence mode on (read back), so the setting outlives this run" in lines
    m.nvmlShutdown()  # the one-shot job exits: the last NVML client is gone
    assert m.gpus[0].persistence == 1 and m.gpus[0].offsets[0] == 120 and m.gpus[0].locked is not None
    names = [name for name, _ in m.calls]
    assert names.index("nvmlDeviceSetPersistenceMode") < names.index("nvmlDeviceSetGpuLockedClocks")


@pytest.mark.parametrize("gpu", [{"persistence_settable": False}, {"persistence_readback": 0}])
def test_persistence_that_cannot_be_turned_on_leaves_the_card_at_stock_and_names_the_daemon(boot_root, gpu):
    m = _nvml(persistence=0, **gpu)
    dev = _install_profile(m)
    lines: list[str] = []
    report = _boot(m, lines)
    assert report.exit_code in (4, 5) and report.results[0].status == "error"
    line = next(line for line in lines if line.startswith("could not apply"))
    assert dev in line and "nvidia-persistenced" in line and "vanish" in line
    assert m.gpus[0].offsets[0] == 0 and m.gpus[0].locked is None  # nothing written


def test_without_persistence_the_fake_driver_drops_the_setting_when_the_last_client_exits():
    """The fake is as strict as the driver: this is what the boot run prevents."""
    m = _nvml(persistence=0)
    backend = nvidia.NvidiaBackend(m)
    dev = backend.devices()[0].id
    backend.apply(dev, 120)
    assert m.gpus[0].offsets[0] == 120
    m.nvmlShutdown()
    assert m.gpus[0].offsets[0] == 0 and m.gpus[0].locked is None


def test_simulated_nvidia_style_boot_logs_the_offset_and_the_lock_below_the_table_top(capsys, boot_root):
    backend = SimulatedBackend(gpus=1, kind="nvidia")
    knob = dataclasses.replace(backend.knob("sim0"), lock_clock_mhz=LOCK)
    assert backend.knob("sim0").lock_clock_mhz > LOCK  # the table top is 2505
    save_profile(build_profile("sim-proven", backend.device("sim0"), knob, 90, kernel="6.14.0-test"), system=True)
    code, _out, err = tuner(capsys, "--simulate", "--sim-kind", "nvidia", "apply", "--boot", "--boot-wait", "0")
    assert code == 0, err
    assert ("applied 'sim-proven' to sim0 Simulated Ada-class GPU (NVIDIA-style) [SIMULATED]: +90 MHz at a locked "
            f"max graphics clock of {LOCK} MHz (read back)") in err


@contextlib.contextmanager
def _through_helper(m, tmp_path):
    """A real helper server (tuner.helper.server, in a thread of this process, so it drives the same fake NVML)
    on a unix socket; yields a function that opens the HelperBackend the boot run uses (it runs as root here)."""
    state = MachineState(tmp_path / "helper-state")
    state.create()
    service = HelperService(nvidia.NvidiaBackend(m), state, group="root", log=lambda line: None)
    sock_path = tmp_path / "run/helper.sock"
    listener, lock_fd = bind_listener(sock_path, os.getgid())
    server = HelperServer(service, listener, os.getgid())
    thread = threading.Thread(target=server.serve, name="test-helper", daemon=True)
    thread.start()
    opened: list[HelperBackend] = []

    def open_backend() -> HelperBackend:
        opened.append(HelperBackend.connect(sock_path, client="tuner apply --boot"))
        return opened[-1]

    try:
        yield open_backend
    finally:
        for backend in opened:
            backend.close()
        server.stop.set()
        thread.join(timeout=30)
        listener.close()
        os.close(lock_fd)


def test_through_the_helper_persistence_off_is_turned_on_read_back_before_the_write(boot_root, tmp_path):
    m = _nvml(persistence=0)
    dev = _install_profile(m)
    lines: list[str] = []
    with _through_helper(m, tmp_path) as open_backend:
        report = run_boot_apply(open_backend, wait_s=0, log=lines.append)
    assert report.exit_code == 0, lines
    assert f"{dev}: turned persistence mode on (read back), so the setting outlives this run" in lines
    assert not any("could not be checked" in line for line in lines), lines
    assert m.gpus[0].persistence == 1 and m.gpus[0].offsets[0] == 120 and m.gpus[0].locked[1] == LOCK
    names = [name for name, _ in m.calls]
    assert names.index("nvmlDeviceSetPersistenceMode") < names.index("nvmlDeviceSetGpuLockedClocks")


@pytest.mark.parametrize("gpu", [{"persistence_settable": False}, {"persistence_readback": 0}])
def test_through_the_helper_persistence_refused_leaves_the_card_at_stock_and_names_the_daemon(boot_root, tmp_path,
                                                                                             gpu):
    m = _nvml(persistence=0, **gpu)
    dev = _install_profile(m)
    lines: list[str] = []
    with _through_helper(m, tmp_path) as open_backend:
        report = run_boot_apply(open_backend, wait_s=0, log=lines.append)
    assert report.exit_code in (4, 5) and report.results[0].status == "error", lines
    line = next(line for line in lines if line.startswith("could not apply"))
    assert dev in line and "nvidia-persistenced" in line and "vanish" in line
    assert m.gpus[0].offsets[0] == 0 and m.gpus[0].locked is None  # nothing written


def test_on_a_machine_with_amd_and_nvidia_cards_the_boot_still_locks_and_turns_persistence_on(boot_root):
    """A mixed machine's backend is a CompositeBackend: the lock clock and persistence reach the NVIDIA card
    through it, not dropped because the composite itself is no NvidiaBackend."""
    m = _nvml(persistence=0)
    _install_profile(m)
    lines: list[str] = []
    report = run_boot_apply(lambda: CompositeBackend([nvidia.NvidiaBackend(m)]), wait_s=0, log=lines.append)
    assert report.exit_code == 0, lines
    assert m.gpus[0].locked[1] == LOCK and m.gpus[0].offsets[0] == 120 and m.gpus[0].persistence == 1
    assert report.results[0].lock_clock_mhz == LOCK
