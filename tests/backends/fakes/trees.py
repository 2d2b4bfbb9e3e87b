"""Plain-file fake sysfs trees, one per overdrive format, written by hand from the kernel's format strings
(control.md §2.3): NUL padding between sections, `Mhz`/`MHz` and `mV`/`mv` mixed, varying column widths.
The numbers are made up; they only need the shape of each generation."""

from __future__ import annotations

from pathlib import Path

NUL = "\0" * 37

OD_TEXT = {
    "rdna4": (
        "OD_SCLK_OFFSET:\n0Mhz\nOD_MCLK:\n0: 97Mhz\n1: 1300MHz\n"
        + NUL
        + "OD_VDDGFX_OFFSET:\n0mV\n"
        + NUL
        + "OD_RANGE:\nSCLK_OFFSET:    -400Mhz        900Mhz\nMCLK:      97Mhz       1400Mhz\n"
        "VDDGFX_OFFSET:    -200mv          0mv\n" + NUL
    ),
    "rdna3": (
        "OD_SCLK:\n0: 600Mhz\n1: 2800Mhz\nOD_MCLK:\n0: 97Mhz\n1: 1200MHz\n"
        + NUL
        + "OD_VDDGFX_OFFSET:\n0mV\n"
        + NUL
        + "OD_RANGE:\nSCLK:     600Mhz       4000Mhz\nMCLK:      97Mhz       1400Mhz\n"
        "VDDGFX_OFFSET:    -400mv          0mv\n" + NUL * 3
    ),
    "rdna2": (
        "OD_SCLK:\n0: 500Mhz\n1: 2400Mhz\nOD_MCLK:\n0: 97Mhz\n1: 1000MHz\n"
        + NUL
        + "OD_VDDGFX_OFFSET:\n0mV\n"
        + NUL
        + "OD_RANGE:\nSCLK:     500Mhz       2900Mhz\nMCLK:     670Mhz       1080Mhz\n"
        + NUL
    ),
    "rdna3-early": (
        "OD_SCLK:\n0: 500Mhz\n1: 2900Mhz\nOD_MCLK:\n0: 97Mhz\n1: 1250MHz\nOD_VDDC_CURVE:\n"
        + "".join(f"{i}: 0mv\n" for i in range(6))
        + "OD_RANGE:\nSCLK: 500Mhz 4500Mhz\nMCLK: 97Mhz 1400Mhz\nVDDC_CURVE: -300mv 0mv"  # no final newline
    ),
    "vega20-navi1x": (
        "OD_SCLK:\n0: 700Mhz\n1: 2000Mhz\nOD_MCLK:\n1: 900MHz\nOD_VDDC_CURVE:\n0: 700MHz 720mV\n"
        "1: 1400MHz 820mV\n2: 2000MHz 1150mV\nOD_RANGE:\nSCLK:     700Mhz       2100Mhz\n"
        "MCLK:     625Mhz        950Mhz\n"
        + "".join(
            f"VDDC_CURVE_SCLK[{i}]:     700Mhz       2100Mhz\nVDDC_CURVE_VOLT[{i}]:     730mV        1180mV\n"
            for i in range(3)
        )
    ),
    "gcn": (
        "OD_SCLK:\n"
        + "".join(
            f"{i}:     {mhz:>6}MHz     {mv:>6}mV\n"
            for i, (mhz, mv) in enumerate(
                [
                    (300, 740),
                    (600, 760),
                    (900, 900),
                    (1100, 1100),
                    (1200, 1130),
                    (1250, 1140),
                    (1300, 1150),
                    (1350, 1160),
                ]
            )
        )
        + "OD_MCLK:\n0:        300Mhz        740mV\n1:       1750Mhz        950mV\n"
        "OD_RANGE:\nSCLK:     300MHz       2000MHz\nMCLK:     300MHz       2250MHz\nVDDC:     740mV        1200mV\n"
    ),
    "apu": "OD_SCLK:\n0: 400Mhz\n1: 2600Mhz\nOD_RANGE:\nSCLK: 400MHz 2600Mhz\n",
}

# Shapes the fakes above are too kind for, written from the kernel's format strings (navi10_print_clk_levels):
# a Navi1x stock curve whose lowest point lies below the printed clock range (as on an RX 5500 XT: the kernel
# prints the firmware's point 0 unchanged while `vc` range-checks every write against VDDC_CURVE_SCLK[i]).
NAVI1X_OUT_OF_RANGE = (
    "OD_SCLK:\n0: 600Mhz\n1: 1800Mhz\nOD_MCLK:\n1: 875MHz\nOD_VDDC_CURVE:\n0: 600MHz 705mV\n"
    "1: 1200MHz 790mV\n2: 1800MHz 1100mV\nOD_RANGE:\nSCLK:     800Mhz       2100Mhz\n"
    "MCLK:     625Mhz        930Mhz\n"
    + "".join(
        f"VDDC_CURVE_SCLK[{i}]:     800Mhz       2100Mhz\nVDDC_CURVE_VOLT[{i}]:     700mV        1150mV\n"
        for i in range(3)
    )
)

SLOTS = {fmt: f"0000:{0x10 + i:02x}:00.0" for i, fmt in enumerate(OD_TEXT)}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_card(
    root: Path,
    index: int,
    fmt: str | None,
    *,
    vendor: str = "0x1002",
    slot: str | None = None,
    symlink: bool = True,
    od: bool = True,
    device: str = "0x7550",
    od_text: str | None = None,
    fan: str = "pwm",
) -> Path:
    """One card: `sys/class/drm/cardN -> ../../devices/.../cardN` and its PCI device directory.
    With symlink=False the device directory is a plain directory and the slot comes from uevent.

    `fan` is what amdgpu's hwmon shows for the fan (drivers/gpu/drm/amd/pm/amdgpu_pm.c, hwmon_attributes_visible
    and amdgpu_hwmon_get_pwm1/_pwm1_max/_fan1_input/_fan1_max):
    - "pwm": `pwm1` (0..255), `pwm1_max` (always "255"), `fan1_input` and `fan1_max` (RPM);
    - "no-pwm1-max": `pwm1` without `pwm1_max` (hidden when the fan can be neither queried nor managed by
      percent; the hwmon ABI, Documentation/ABI/testing/sysfs-class-hwmon `pwmY`, says 255 is 100 %);
    - "rpm": `pwm1` present but unreadable (its read bits cleared when the ASIC cannot report a PWM value:
      the caller sets `FakeKernelIO.read_errors`), `fan1_input` / `fan1_max` in RPM;
    - "zero-rpm": fan stop at idle, `pwm1` 0 and `fan1_input` 0;
    - "none": no fan attribute at all (`adev->pm.no_fan`, and APUs): the kernel hides every pwm1*/fan1* file.
    VRAM comes in bytes (`mem_info_vram_used` / `mem_info_vram_total`, amdgpu_vram_mgr.c, "%llu\\n").
    `power1_cap` is not written here: tests add it (microwatts) where they need it."""
    slot = slot or SLOTS.get(fmt or "", f"0000:{0x40 + index:02x}:00.0")
    drm = root / "sys/class/drm"
    if symlink:
        dev = root / "sys/devices/pci0000:00" / slot
        card = dev / "drm" / f"card{index}"
        card.mkdir(parents=True)
        drm.mkdir(parents=True, exist_ok=True)
        (drm / f"card{index}").symlink_to(card)
        (card / "device").symlink_to(dev)
    else:
        dev = drm / f"card{index}" / "device"
        dev.mkdir(parents=True)
    write(dev / "vendor", f"{vendor}\n")
    write(dev / "device", f"{device}\n")
    write(dev / "subsystem_vendor", "0x1da2\n")
    write(dev / "subsystem_device", "0xe490\n")
    write(dev / "uevent", f"DRIVER=amdgpu\nPCI_CLASS=30000\nPCI_SLOT_NAME={slot}\n")
    write(dev / "vbios_version", "113-FAKE-100\n")
    write(dev / "gpu_busy_percent", "37\n")
    write(dev / "power_dpm_force_performance_level", "auto\n")
    write(dev / "mem_info_vram_total", f"{16 * 1024**3}\n")  # 16 GiB in bytes
    write(dev / "mem_info_vram_used", f"{1536 * 1024**2}\n")  # 1.5 GiB in bytes
    if od and (fmt or od_text):
        write(dev / "pp_od_clk_voltage", od_text or OD_TEXT[fmt])
    hw = dev / "hwmon/hwmon4"
    for name, value in {
        "in0_input": "812",
        "in0_label": "vddgfx",
        "power1_average": "55000000",
        "temp1_input": "41000",
        "temp1_label": "edge",
        "temp2_input": "47000",
        "temp2_label": "junction",
        "temp3_input": "52000",
        "temp3_label": "mem",
        "freq1_input": "2450000000",
        "freq2_input": "1250000000",
    }.items():
        write(hw / name, value + "\n")
    fans = {
        "pwm": {"pwm1": "77", "pwm1_max": "255", "pwm1_min": "0", "fan1_input": "1100", "fan1_max": "3300"},
        "no-pwm1-max": {"pwm1": "77", "fan1_input": "1100"},
        "rpm": {"pwm1": "0", "fan1_input": "1100", "fan1_max": "3300", "fan1_min": "0"},
        "zero-rpm": {"pwm1": "0", "pwm1_max": "255", "fan1_input": "0", "fan1_max": "3300"},
        "none": {},
    }[fan]
    for name, value in fans.items():
        write(hw / name, value + "\n")
    # a connector: also matches card*, must be ignored
    (drm / f"card{index}-DP-1").mkdir(parents=True, exist_ok=True)
    return dev


def make_tree(root: Path, formats: list[str | None], *, mask: str = "0xfff7ffff", **kw) -> list[Path]:
    write(root / "sys/module/amdgpu/parameters/ppfeaturemask", mask + "\n")
    if not int(mask, 16) & 0x4000:  # as amdgpu: no pp_od_clk_voltage with Overdrive off (bit 14; control.md §2,
        kw["od"] = False             # amdgpu_pm.c default_attr_update)
    write(root / "proc/sys/kernel/osrelease", "6.14.0-fake\n")
    return [make_card(root, i, fmt, **kw) for i, fmt in enumerate(formats)]


def two_rdna4_cards_without_serials(root: Path):
    """An AMD backend over two RDNA4 cards in slots 03 and 04 whose amdsmi serial is its "N/A" placeholder (the
    backend's strict fake kernel behind each OD file), and the two slots."""
    from tests.backends.fakes.fake_amdsmi import fake_amdsmi
    from tests.backends.fakes.fake_kernel import FakeKernelIO, FakeOdKernel
    from tuner.backends import amd
    from tuner.backends.amd_sysfs import amd_card_dirs

    make_tree(root, [])
    slots = ["0000:03:00.0", "0000:04:00.0"]
    for i, slot in enumerate(slots):
        make_card(root, i, "rdna4", slot=slot)
    dirs = amd_card_dirs(root)
    kernels = FakeKernelIO({d / "pp_od_clk_voltage": FakeOdKernel(OD_TEXT["rdna4"]) for d in dirs})
    return amd.AmdBackend(dirs, root=root, sysfs=kernels, amdsmi=fake_amdsmi(dict.fromkeys(slots, "N/A"))), slots
