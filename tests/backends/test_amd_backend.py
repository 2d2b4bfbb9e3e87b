"""AMD backend: discovery, exact kernel command sequences, the write protocol, errors, allow-list, telemetry."""

from __future__ import annotations

import io
import sys
import types

import pytest

from tuner.backends import amd
from tuner.backends.amd_sysfs import (
    WRITABLE_FILES,
    KernelRejected,
    SysfsIO,
    amd_card_dirs,
    read_ppfeaturemask,
)
from tuner.core.errors import DeviceLost, NotApplied, OutOfRange, PermissionDenied, Unsupported
from tuner.core.models import same_serial

from .conftest import amd_on_fake_kernel
from .fakes.fake_kernel import FakeKernelIO, FakeOdKernel
from .fakes.trees import OD_TEXT, make_card, make_tree


def test_discovery_skips_connectors_and_other_vendors_and_reads_slots(tmp_path):
    make_tree(tmp_path, ["rdna4"])
    make_card(tmp_path, 1, None, vendor="0x10de")
    make_card(tmp_path, 2, "rdna3", symlink=False, slot="0000:0a:00.0")
    dirs = amd_card_dirs(tmp_path)
    assert [d.parent.name for d in dirs][-1] == "card2" and len(dirs) == 2
    backend = amd.discover(root=tmp_path)
    assert [d.id for d in backend.devices()] == ["0000:10:00.0", "0000:0a:00.0"]
    dev = backend.devices()[0]
    assert (dev.vendor, dev.pci_id, dev.subsystem_id, dev.od_format, dev.vbios) == (
        "amd",
        "1002:7550",
        "1da2:e490",
        "rdna4",
        "113-FAKE-100",
    )


def test_no_card_means_none(tmp_path):
    assert amd.discover(root=tmp_path) is None
    assert read_ppfeaturemask(tmp_path) is None


def test_ppfeaturemask_hex_and_decimal(tmp_path):
    make_tree(tmp_path, [], mask="0xfff7bfff")
    assert read_ppfeaturemask(tmp_path) == 0xFFF7BFFF
    (tmp_path / "sys/module/amdgpu/parameters/ppfeaturemask").write_text(f"{0xFFF7BFFF}\n")
    assert read_ppfeaturemask(tmp_path) == 0xFFF7BFFF


def test_rdna4_apply_and_reset_commands(tmp_path):
    backend, fio = amd_on_fake_kernel(tmp_path, ["rdna4"])
    dev = backend.devices()[0].id
    backend.apply(dev, -50)
    backend.reset(dev)
    assert fio.commands() == ["vo -50", "c", "vo 0", "c"]  # reset touches only the voltage (not `r`)
    kernel = next(iter(fio.kernels.values()))
    assert kernel.received == ["vo -50\n", "c\n", "vo 0\n", "c\n"]  # one command per write


def test_navi1x_apply_moves_top_points_and_reset(tmp_path):
    backend, fio = amd_on_fake_kernel(tmp_path, ["vega20-navi1x"])
    dev = backend.devices()[0].id
    knob = backend.apply(dev, -60)
    assert knob.current == -60
    backend.reset(dev)
    assert fio.commands() == ["vc 1 1400 760", "vc 2 2000 1090", "c", "r", "c"]


def test_a_restore_the_card_does_not_take_is_not_called_restored(tmp_path):
    """A set that fails puts the previous value back, and that write is verified like every other: navi10's `r`
    restores the kernel's boot table (navi10_od_edit_dpm_table, the fake's "navi10" variant), and a curve another
    tool lowered before the tuner first saw the card (recorded then as its stock) is not that table. The restore
    said nothing while the card read +20 mV; `reset` reads back the same and refuses to call it stock."""
    make_tree(tmp_path, ["vega20-navi1x"])
    [card_dir] = amd_card_dirs(tmp_path)
    kernel = FakeOdKernel(OD_TEXT["vega20-navi1x"])
    for command in (b"vc 2 2000 1130\n", b"c\n"):  # another tool's undervolt of the top point, before first contact
        kernel.write(command)
    kernel.received.clear()
    fio = FakeKernelIO({card_dir / "pp_od_clk_voltage": kernel})
    backend = amd.discover(root=tmp_path, sysfs=fio)
    dev = backend.devices()[0].id
    assert backend.knob(dev).current == 0
    kernel.reject_commits = 1  # the SMU refuses the upload (EINVAL on `c`): the restore runs
    with pytest.raises(NotApplied) as e:
        backend.apply(dev, -30)
    assert fio.commands() == ["vc 1 1400 790", "vc 2 2000 1100", "c", "r", "c"]
    assert backend.knob(dev).current == 20  # not the +0 mV put back
    assert "restoring +0 mV also failed" in e.value.message and "+20 mV" in e.value.message, e.value.message
    assert e.value.remedy == "run `sudo tuner reset` or reboot"


def test_gcn_lower_states_follow_and_floor_at_vddc_min(tmp_path):
    backend, fio = amd_on_fake_kernel(tmp_path, ["gcn"])
    backend.apply(backend.devices()[0].id, -30)
    assert fio.commands()[:2] == ["s 1 600 740", "s 2 900 870"] and fio.commands()[-1] == "c"


@pytest.mark.parametrize(("fmt", "expected"), [
    ("vega20-navi1x", ["vc 1 1400 825", "vc 2 2000 1155", "c"]),
    ("gcn", [f"s {i} {mhz} {mv + 5}" for i, mhz, mv in
             ((1, 600, 760), (2, 900, 900), (3, 1100, 1100), (4, 1200, 1130), (5, 1250, 1140), (6, 1300, 1150),
              (7, 1350, 1160))] + ["c"]),
])
def test_an_overvolt_asked_for_on_a_curve_is_written(tmp_path, fmt, expected):
    # The knob's range reaches above stock (VDDC_CURVE_VOLT[2] / VDDC up to 1180 / 1200 mV) and --allow-overvolt
    # asks for it: the raised points are written, not silently left out and then reported as refused by the card.
    backend, fio = amd_on_fake_kernel(tmp_path, [fmt])
    dev = backend.devices()[0].id
    assert backend.knob(dev).max > 5
    assert backend.apply(dev, 5, allow_overvolt=True).current == 5
    assert fio.commands() == expected


def test_rdna2_range_is_built_in_and_flagged(tmp_path):
    backend, _ = amd_on_fake_kernel(tmp_path, ["rdna2"])
    knob = backend.knob(backend.devices()[0].id)
    assert (knob.min, knob.max, knob.range_source) == (-200, 0, "built-in")
    with pytest.raises(OutOfRange):
        backend.apply(backend.devices()[0].id, -250)


def test_buffered_multi_command_write_is_rejected_by_the_kernel():
    kernel = FakeOdKernel(OD_TEXT["rdna4"])
    with pytest.raises(OSError) as e:
        kernel.write(b"vo -50\nc\n")
    assert e.value.errno == 22 and kernel.committed.vddgfx_offset_mv == 0


def test_overdrive_off_names_the_kernel_parameter(tmp_path):
    make_tree(tmp_path, ["rdna3"], mask="0xfff7bfff", od=False)
    backend = amd.discover(root=tmp_path)
    with pytest.raises(Unsupported) as e:
        backend.knob(backend.devices()[0].id)
    assert "amdgpu.ppfeaturemask=0xfff7ffff" in e.value.remedy and e.value.exit_code == 4


def test_the_fake_tree_has_no_overdrive_file_when_the_mask_turns_overdrive_off(tmp_path):
    """As amdgpu: pp_od_clk_voltage exists only when Overdrive is enabled (ppfeaturemask bit 14; control.md §2,
    amdgpu_pm.c default_attr_update), so a fake card under the default mask has none."""
    [dev] = make_tree(tmp_path, ["rdna4"], mask="0xfff7bfff")
    assert not (dev / "pp_od_clk_voltage").exists()


def test_a_missing_overdrive_file_with_the_bit_already_set_is_not_told_to_set_it(tmp_path):
    """The mask has the overdrive bit and pp_od_clk_voltage is still missing (RDNA3 before kernel 6.7, LACT #205,
    control.md): adding the same ppfeaturemask and rebooting changes nothing. `tuner doctor` says so; `list`, `set`
    and `status` (this backend) told the user to add `amdgpu.ppfeaturemask=0xffffffff`, the mask already there."""
    make_tree(tmp_path, ["rdna3"], mask="0xffffffff", od=False)
    backend = amd.discover(root=tmp_path)
    with pytest.raises(Unsupported) as e:
        backend.knob(backend.devices()[0].id)
    assert "ppfeaturemask=" not in e.value.remedy and "kernel" in e.value.remedy and e.value.exit_code == 4


def test_permission_denied_exit_3(tmp_path):
    backend, fio = amd_on_fake_kernel(tmp_path, ["rdna4"])
    fio.denied |= set(fio.kernels)
    with pytest.raises(PermissionDenied) as e:
        backend.apply(backend.devices()[0].id, -20)
    assert e.value.exit_code == 3 and "root" in e.value.remedy


def test_eperm_while_resetting_is_device_lost(tmp_path):
    backend, fio = amd_on_fake_kernel(tmp_path, ["rdna4"])
    waits: list[float] = []
    backend._sleep = waits.append  # the waits between tries, counted instead of slept (4 s of nothing)
    next(iter(fio.kernels.values())).in_reset = True
    with pytest.raises(DeviceLost):
        backend.apply(backend.devices()[0].id, -20)
    assert waits == [amd.BUSY_WAIT_S] * (amd.BUSY_RETRIES - 1)  # it waited for the reset to end before giving up


def test_einval_points_to_dmesg_and_restores(tmp_path):
    backend, fio = amd_on_fake_kernel(tmp_path, ["rdna3"])
    next(iter(fio.kernels.values())).reject_commits = 1
    with pytest.raises(KernelRejected) as e:
        backend.apply(backend.devices()[0].id, -20)
    assert "dmesg" in e.value.remedy and isinstance(e.value, NotApplied)
    assert fio.commands()[:4] == ["vo -20", "c", "vo 0", "c"]  # the restore writes only the voltage


def test_apu_has_no_voltage_knob(tmp_path):
    backend, fio = amd_on_fake_kernel(tmp_path, ["apu"])
    dev = backend.devices()[0].id
    with pytest.raises(Unsupported):
        backend.apply(dev, -10)
    assert backend.capabilities(dev).can_apply is False and fio.log == []


@pytest.mark.parametrize(("text", "user_edit"), [
    (OD_TEXT["apu"], b"s 1 2400\n"),
    # a dGPU table without a voltage section (the board's FeatureCtrlMask lacks the VF-curve bit: control.md §2.3)
    (("OD_SCLK:\n0: 500Mhz\n1: 2600Mhz\nOD_MCLK:\n0: 97Mhz\n1: 1250MHz\nOD_RANGE:\nSCLK: 500Mhz 3000Mhz\n"
      "MCLK: 97Mhz 1500Mhz\n"), b"s 1 2400\n"),
    # RDNA4 with the clock offset but no OD_VDDGFX_OFFSET section: `vo` gets EINVAL there
    (("OD_SCLK_OFFSET:\n0Mhz\nOD_MCLK:\n0: 97Mhz\n1: 1259MHz\nOD_RANGE:\nSCLK_OFFSET: -500Mhz 1000Mhz\n"
      "MCLK: 97Mhz 1500Mhz\n"), b"s 100\n"),
])
def test_reset_of_a_card_without_a_voltage_knob_writes_nothing(tmp_path, text, user_edit):
    # `r` restores the whole overdrive table: on a card the tuner cannot tune it would only wipe the user's own
    # clock settings. Reset touches only the voltage, and there is none here: unsupported (exit 4), nothing written.
    make_tree(tmp_path, [])
    make_card(tmp_path, 0, None, od_text=text)
    (d,) = amd_card_dirs(tmp_path)
    kernel = FakeOdKernel(text)
    fio = FakeKernelIO({d / "pp_od_clk_voltage": kernel})
    backend = amd.AmdBackend([d], root=tmp_path, sysfs=fio)
    kernel.write(user_edit)  # the user's own clock setting, committed
    kernel.write(b"c\n")
    users = kernel.committed
    with pytest.raises(Unsupported) as e:
        backend.reset(backend.devices()[0].id)
    assert e.value.exit_code == 4
    assert fio.log == [] and kernel.committed == users


def test_nothing_is_written_outside_the_allow_list(tmp_path):
    backend, fio = amd_on_fake_kernel(tmp_path, ["rdna4", "rdna3", "vega20-navi1x", "gcn", "rdna3-early"])
    for dev in backend.devices():
        backend.apply(dev.id, -10)
        backend.telemetry(dev.id)
        backend.capabilities(dev.id)
        backend.reset(dev.id)
    assert fio.log and {p.name for p, _ in fio.log} <= {"pp_od_clk_voltage"} <= WRITABLE_FILES
    assert all(0 < len(data) <= 127 and data.count(b"\n") == 1 for _, data in fio.log)
    with pytest.raises(AssertionError):
        SysfsIO().write_commands(tmp_path / "power1_cap", ["1"])


def test_real_io_writes_one_command_per_os_write(tmp_path, monkeypatch):
    target = tmp_path / "pp_od_clk_voltage"
    target.write_text("")
    writes = []
    real_write = amd.os.write if hasattr(amd, "os") else None  # noqa: F841
    import tuner.backends.amd_sysfs as sysfs_mod

    monkeypatch.setattr(sysfs_mod.os, "write", lambda fd, data: writes.append(data) or len(data))
    SysfsIO().write_commands(target, ["vo -50", "c"])
    assert writes == [b"vo -50\n", b"c\n"]


def test_hwmon_telemetry_units(tmp_path):
    backend, _ = amd_on_fake_kernel(tmp_path, ["rdna4"])
    t = backend.telemetry(backend.devices()[0].id)
    assert (t.voltage_mv, t.power_w, t.temp_edge_c, t.temp_hotspot_c, t.temp_mem_c) == (812, 55.0, 41, 47, 52)
    assert (t.core_clock_mhz, t.mem_clock_mhz, t.util_pct, t.fan_rpm, t.energy_j) == (
        2450,
        1250,
        37,
        1100,
        None,
    )


def test_amdsmi_import_guard_swallows_keyerror_and_its_stdout(monkeypatch, capsys):
    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name != "amdsmi":
                return None
            import importlib.machinery

            class Loader:
                def create_module(self, spec):
                    return None

                def exec_module(self, module):
                    print("Unable to find libamd_smi.so library try installing amd-smi-lib")
                    raise KeyError("libamd_smi.so")

            return importlib.machinery.ModuleSpec(name, Loader())

    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    assert amd.import_amdsmi() is None
    assert capsys.readouterr().out == ""


def test_amdsmi_enriches_identity_when_present(tmp_path):
    make_tree(tmp_path, ["rdna4"])
    smi = types.SimpleNamespace(
        AmdSmiInitFlags=types.SimpleNamespace(INIT_AMD_GPUS=1),
        amdsmi_init=lambda flags: None,
        amdsmi_get_processor_handles=lambda: ["h0"],
        amdsmi_get_gpu_device_bdf=lambda h: "0000:10:00.0",
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": "Radeon Fake 9070", "asic_serial": "0xABC"},
        amdsmi_get_gpu_vbios_info=lambda h: {"version": "023.008.000.068"},
        amdsmi_get_energy_count=lambda h: {"energy_accumulator": 100000, "counter_resolution": 15.3},
        amdsmi_shut_down=lambda: None,
    )
    backend = amd.AmdBackend(amd_card_dirs(tmp_path), root=tmp_path, amdsmi=smi)
    dev = backend.devices()[0]
    assert (dev.name, dev.serial, dev.vbios) == ("Radeon Fake 9070", "0xABC", "023.008.000.068")
    assert backend.telemetry(dev.id).energy_j == pytest.approx(1.53)
    io.StringIO()  # keep import used


def test_unreadable_read_back_after_a_write_restores(tmp_path, monkeypatch):
    """The write went through but the table cannot be re-read: the card must not stay at an unverified value."""
    backend, fio = amd_on_fake_kernel(tmp_path, ["rdna4"])
    device_id = backend.devices()[0].id
    real_table = backend._table
    calls = {"n": 0}

    def flaky_table(card):
        calls["n"] += 1
        if calls["n"] == 2:  # the read-back right after the commit
            raise Unsupported("pp_od_clk_voltage does not start with a section header")
        return real_table(card)

    monkeypatch.setattr(backend, "_table", flaky_table)
    with pytest.raises(Unsupported):
        backend.apply(device_id, -20)
    assert fio.commands()[:4] == ["vo -20", "c", "vo 0", "c"]  # the restore writes only the voltage
    assert backend.knob(device_id).current == 0


def test_hwmon_power_cap_is_the_power_limit(tmp_path):
    backend, _ = amd_on_fake_kernel(tmp_path, ["rdna4"])
    dev = backend.devices()[0].id
    assert backend.telemetry(dev).power_limit_w is None  # no power1_cap: unknown, not 0
    (avg,) = list(tmp_path.rglob("power1_average"))
    (avg.parent / "power1_cap").write_text("300000000\n")  # microwatts, as amdgpu's hwmon reports it
    assert backend.telemetry(dev).power_limit_w == 300.0


@pytest.mark.parametrize(("smi_serial", "sysfs_serial"), [
    ("N/A", None),  # amdsmi cannot read it (ROCm/rocm-systems PR #3041), no sysfs serial_number
    ("ffffffffffffffff", None),  # older amdsmi printed the placeholder as hex (PR #2269)
    ("0x0000000000000000", None),
    (None, "0000000000000000\n"),  # no amdsmi; amdgpu's serial_number with unique_id left at 0
    (None, "\n"),  # a board without an FRU: serial_number is empty
    (None, " N/A \n"),
])
def test_a_placeholder_serial_is_no_serial(tmp_path, smi_serial, sysfs_serial):
    """amdsmi answers 'N/A' (or, older, a hex placeholder) for a serial it cannot read, and amdgpu's serial_number
    can be all zeros or empty: two such cards had the same serial, so every identity rule (boot apply's card by
    serial, the helper's unsafe list, form memory, the reference cache) called them one card. A placeholder is no
    serial: the cards are told apart by their PCI slot."""
    from tests.backends.fakes.fake_amdsmi import fake_amdsmi
    from tuner.app import form_memory
    from tuner.helper.state import card_key
    from tuner.tuning.reference_cache import card_identity

    make_tree(tmp_path, [])
    slots = ["0000:03:00.0", "0000:04:00.0"]
    for i, slot in enumerate(slots):
        dev = make_card(tmp_path, i, "rdna4", slot=slot)
        if sysfs_serial is not None:
            (dev / "serial_number").write_text(sysfs_serial)
    smi = fake_amdsmi(dict.fromkeys(slots, smi_serial)) if smi_serial is not None else None
    backend = amd.AmdBackend(amd_card_dirs(tmp_path), root=tmp_path, amdsmi=smi)
    a, b = backend.devices()
    assert (a.serial, b.serial) == (None, None)
    assert card_key(a) != card_key(b)
    assert form_memory.card_key(a) != form_memory.card_key(b)
    assert card_identity(a) != card_identity(b)


def test_the_serial_is_the_same_with_and_without_amdsmi(tmp_path):
    """amdsmi's asic_serial is the card's unique_id, which amdgpu prints "%016llx" (drivers/gpu/drm/amd/pm/
    amdgpu_pm.c, amdgpu_get_unique_id) and newer amdsmi releases as unpadded hex (ROCm/amdsmi src/amd_smi/amd_smi.cc,
    amdsmi_get_gpu_asic_info: `ss << std::hex << dv_uid`; old ones "%lu"); `serial_number` is the board's FRU serial
    (amdgpu_fru_eeprom.c), on some server boards only. Without amdsmi the sysfs path took serial_number: one card
    had two serials (a profile made with amdsmi did not match at boot without it; the helper's card_key changed
    between starts and orphaned its unsafe list). The kernel's text is the serial either way; what an older version
    called the card is a former serial (the helper merges lists kept under it), and a profile's serial matches as
    a number."""
    from tests.backends.fakes.fake_amdsmi import fake_amdsmi
    from tuner.helper.state import card_key

    make_tree(tmp_path, [])
    slot = "0000:03:00.0"
    dev = make_card(tmp_path, 0, "rdna4", slot=slot)
    (dev / "unique_id").write_text("0a0b3c4d6e7f8091\n")
    (dev / "serial_number").write_text("PJ0123456789\n")  # the FRU's
    with_smi = amd.AmdBackend(amd_card_dirs(tmp_path), root=tmp_path, amdsmi=fake_amdsmi({slot: "a0b3c4d6e7f8091"}))
    without = amd.AmdBackend(amd_card_dirs(tmp_path), root=tmp_path, amdsmi=None)
    assert with_smi.devices()[0].serial == without.devices()[0].serial == "0a0b3c4d6e7f8091"
    assert card_key(with_smi.devices()[0]) == card_key(without.devices()[0])
    assert with_smi.former_serials(slot) == ("a0b3c4d6e7f8091", "PJ0123456789")
    assert same_serial("a0b3c4d6e7f8091", with_smi.devices()[0].serial)  # a profile an older version made with amdsmi
