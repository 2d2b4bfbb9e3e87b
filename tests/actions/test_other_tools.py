"""Other tools that write the same settings (tuner.actions.other_tools): found by process and by unit, a bisect
refuses beside one that may change the same card, `--ignore-other-tools` goes on and the profile records it."""

from __future__ import annotations

import os

import pytest

from tests.backends.fakes.trees import SLOTS, make_tree
from tests.cli_helpers import run_tuner
from tests.fake_other_tools import fake_lactd  # noqa: F401 - a fixture
from tests.profiles.helpers import sim
from tuner.actions import other_tools
from tuner.core.models import DeviceInfo


def test_a_running_lactd_makes_a_bisect_of_a_real_card_refuse_naming_it(tmp_path, fake_lactd):  # noqa: F811
    make_tree(tmp_path / "root", ["rdna4"])
    slot = SLOTS["rdna4"]
    proc = run_tuner("bisect", "--device", slot, "--yes", "--trial", "10s",
                     env={"TUNER_SYSFS_ROOT": str(tmp_path / "root")})
    assert proc.returncode == 6, proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1
    assert f"lactd (LACT; process {fake_lactd.pid}) is running and may write {slot}'s settings" in err
    assert "pp_od_clk_voltage" in err and "--ignore-other-tools" in err
    assert "OD_VDDGFX_OFFSET:\n0mV" in (tmp_path / f"root/sys/devices/pci0000:00/{slot}/pp_od_clk_voltage") \
        .read_text()  # nothing written


def test_detection_by_process_name_executable_command_and_unit():
    procs = [(10, "lact", ["/usr/bin/lact", "daemon"]), (11, "bash", ["bash"]),
             (12, "corectrl_helper", ["/usr/libexec/corectrl_helper"]), (13, "python3", ["/usr/bin/nvidia-powerd"])]
    found = {f.tool.name: f.how for f in other_tools.detect(procs, unit_active=lambda u: u == "lactd.service")}
    assert found == {"lactd": ("process 10", "unit lactd.service active"), "corectrl_helper": ("process 12",),
                     "nvidia-powerd": ("process 13",)}
    assert other_tools.detect([(1, "lact", ["/usr/bin/lact", "gui"])], unit_active=lambda u: False) == []


def _lactd():
    return [other_tools.Found(other_tools.TOOLS[0], ("process 4242",))]


def _powerd():
    return [other_tools.Found(other_tools.TOOLS[2], ("unit nvidia-powerd.service active",))]


class _OneCard:
    def __init__(self, vendor: str, simulated: bool = False):
        self.info = DeviceInfo(id="0000:03:00.0", vendor=vendor, name="card", simulated=simulated)

    def device(self, device_id):
        return self.info


def test_only_a_tool_that_may_change_that_card_refuses_and_never_for_a_simulated_card():
    with pytest.raises(other_tools.OtherToolRunning) as e:
        other_tools.refuse_before_bisect(_OneCard("amd"), ["0000:03:00.0"], found=_lactd(), ignore=False)
    assert e.value.exit_code == 6 and "stop lactd" in e.value.remedy
    other_tools.refuse_before_bisect(_OneCard("amd"), ["0000:03:00.0"], found=_powerd(), ignore=False)  # NVIDIA's
    other_tools.refuse_before_bisect(_OneCard("amd", simulated=True), ["0000:03:00.0"], found=_lactd(),
                                     ignore=False)
    backend = sim()
    other_tools.refuse_before_bisect(backend, ["sim0"], ignore=False)  # no process scan for simulated cards


def test_ignoring_goes_on_and_is_kept_for_the_profile(monkeypatch):
    monkeypatch.setattr(other_tools, "_ignored", {})
    monkeypatch.setenv(other_tools.IGNORE_ENV, "1")
    other_tools.refuse_before_bisect(_OneCard("nvidia"), ["0000:03:00.0"], found=_powerd())
    assert other_tools.ignored_for("0000:03:00.0") == (
        "nvidia-powerd (NVIDIA Dynamic Boost; unit nvidia-powerd.service active)",)
    assert other_tools.warnings_for(_OneCard("nvidia"), ["0000:03:00.0"], found=_powerd())[0].startswith(
        "nvidia-powerd (NVIDIA Dynamic Boost; unit nvidia-powerd.service active) is running and may change")


def test_the_profile_records_what_was_ignored(monkeypatch):
    from tuner.profiles import build_profile

    backend = sim()
    profile = build_profile("p", backend.device("sim0"), backend.knob("sim0"), -45,
                            tuning={"other_tools": ("lactd (LACT; process 4242)",), "confirmed": -45})
    assert profile.parts[0].tuning.other_tools == ("lactd (LACT; process 4242)",)


def test_a_rig_profile_records_what_was_ignored_per_card_as_a_single_card_profile_does(monkeypatch):
    """`--ignore-other-tools` is recorded in the evidence of every profile a bisect saves: a rig's part as a
    single card's (tuner.actions.bisect.card_tuning, one place for both)."""
    from tuner.actions.bisect import rig_profile_from_outcome
    from tuner.tuning.job import BisectOutcome, CardOutcome

    monkeypatch.setattr(other_tools, "_ignored", {})
    other_tools.refuse_before_bisect(_OneCard("amd"), ["sim1"], found=_lactd(), ignore=True)  # what a bisect does
    backend = sim()
    done = CardOutcome("recommended", 0, None)
    rig = rig_profile_from_outcome(backend, BisectOutcome("recommended", 0, per_card={"sim0": done, "sim1": done},
                                                          settings={"sim0": -20, "sim1": -30}), "r")
    assert rig.parts[1].tuning.other_tools == ("lactd (LACT; process 4242)",)
    assert rig.parts[0].tuning is None or rig.parts[0].tuning.other_tools is None


def test_a_later_bisect_of_the_card_beside_no_tool_does_not_inherit_what_an_earlier_one_ignored(monkeypatch):
    """The UI runs many bisects in one process: what an earlier bisect of a card went on beside is that bisect's
    evidence, not the next one's (its profile would claim LACT ran beside it)."""
    monkeypatch.setattr(other_tools, "_ignored", {})
    other_tools.refuse_before_bisect(_OneCard("amd"), ["0000:03:00.0"], found=_lactd(), ignore=True)
    assert other_tools.ignored_for("0000:03:00.0")
    other_tools.refuse_before_bisect(_OneCard("amd"), ["0000:03:00.0"], found=[], ignore=False)  # LACT stopped
    assert other_tools.ignored_for("0000:03:00.0") == ()


def test_at_boot_a_tool_whose_unit_is_enabled_but_not_started_yet_keeps_the_card_alone(boot, monkeypatch, tmp_path):
    """The boot unit runs early (DefaultDependencies=no); LACT's lactd.service is `After=multi-user.target`
    (ilya-zlobintsev/LACT res/lactd.service), so at boot it is enabled and not active yet, then starts and applies
    its own settings over the profile's. The boot run must count it, as it counts a running one (exit 6)."""
    import dataclasses

    from tests.backends.fakes.fake_pynvml import FakeGpu, make_fake_nvml
    from tuner.actions.boot_apply import run_boot_apply
    from tuner.backends import nvidia
    from tuner.profiles import build_profile, save_profile

    boot("11111111-2222-3333-4444-555555555555")
    (boot.root / "proc/cmdline").write_text("root=/dev/sda1 ro quiet\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"  # systemd at boot: lactd.service enabled, not yet active
    systemctl.write_text('#!/bin/sh\ncase "$1 $2" in\n  "is-enabled lactd.service") echo enabled; exit 0 ;;\n'
                         'esac\nexit 3\n')
    systemctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(other_tools, "_systemd_running", lambda: True)
    m = make_fake_nvml([FakeGpu()])
    m.nvmlInit()
    backend = nvidia.NvidiaBackend(m)
    dev = backend.devices()[0]
    knob = dataclasses.replace(backend.knob(dev.id), lock_clock_mhz=2205)
    save_profile(build_profile("proven", dev, knob, 120, kernel="6.14.0-test"), system=True)
    lines: list[str] = []
    report = run_boot_apply(lambda: nvidia.NvidiaBackend(m), wait_s=0, log=lines.append)
    assert report.exit_code == 6, lines
    assert m.gpus[0].offsets[0] == 0
    assert any("lactd (LACT; unit lactd.service enabled" in line for line in lines), lines
