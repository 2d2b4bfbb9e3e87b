"""The amdgpu sysfs surface: find cards, read hwmon, and the one seam through which every OD write passes.

All paths are taken under a root (`paths.sysfs_root()`, i.e. `TUNER_SYSFS_ROOT`, default `/`) so tests and dry
runs can point the tuner at a fake tree. Nothing else in the tuner opens files under /sys. Every read goes through
`tuner.core.kernel_files` (regular files only, a size cap, a timeout): a FIFO or /dev/zero where an attribute
should be is refused instead of hanging `list` or filling memory.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
from pathlib import Path
from typing import Any

from tuner.core import kernel_files
from tuner.core.errors import DeviceLost, NotApplied, PermissionDenied, TunerError, Unsupported
from tuner.core.models import Telemetry

AMD_VENDOR_ID = 0x1002
PP_OVERDRIVE_MASK = 0x4000  # bit 14 of amdgpu.ppfeaturemask (amd_shared.h)
PPFEATUREMASK_PATH = "sys/module/amdgpu/parameters/ppfeaturemask"

def _read_text(path: Path) -> str | None:
    try:
        return kernel_files.read_text(path)
    except OSError:
        return None


def amd_card_dirs(root: Path | str) -> list[Path]:
    """`<root>/sys/class/drm/cardN/device` for every amdgpu card (PCI vendor 0x1002), ordered by N.

    A directory is listed once even when two cardN entries point at it (render nodes never do, but be safe).
    """
    found: list[Path] = []
    seen: set[Path] = set()
    for _, device, vendor in kernel_files.drm_cards(root):
        if vendor != AMD_VENDOR_ID:
            continue
        try:
            key = device.resolve()
        except OSError:
            key = device
        if key not in seen:
            seen.add(key)
            found.append(device)
    return found


def read_ppfeaturemask(root: Path | str) -> int | None:
    """The amdgpu module's `ppfeaturemask` (printed in hex, e.g. `0xfff7bfff`), or None when amdgpu is not
    loaded or the value is unreadable."""
    return kernel_files.read_int(Path(root) / PPFEATUREMASK_PATH)


# The mask has the overdrive bit and `pp_od_clk_voltage` is still missing: the same parameter again changes nothing,
# this kernel's amdgpu offers no overdrive for the card (RDNA3 before kernel 6.7, LACT #205; control.md).
NO_OVERDRIVE_FOR_CARD = "this kernel's amdgpu offers no overdrive for this card, although ppfeaturemask has the bit"
OVERDRIVE_OFF = "Overdrive is off"
NO_OVERDRIVE_FOR_CARD_REMEDY = "update the kernel (RDNA3 needs 6.7 or newer), then reboot"


def ppfeaturemask_with_overdrive(mask: int | None) -> str:
    """The `amdgpu.ppfeaturemask=...` to add: the current mask OR 0x4000 (the default mask's when unreadable)."""
    return f"amdgpu.ppfeaturemask={(0xFFF7BFFF if mask is None else mask) | PP_OVERDRIVE_MASK:#010x}"


def overdrive_missing(root: Path | str) -> tuple[str, str]:
    """Why `pp_od_clk_voltage` is missing and the remedy: overdrive off (the exact kernel parameter to add), or,
    when the mask already has the bit, a kernel that offers none for this card."""
    mask = read_ppfeaturemask(root)
    if mask is not None and mask & PP_OVERDRIVE_MASK:
        return NO_OVERDRIVE_FOR_CARD, NO_OVERDRIVE_FOR_CARD_REMEDY
    return OVERDRIVE_OFF, (
        f"add {ppfeaturemask_with_overdrive(mask)} to the kernel command line and reboot "
        "(it enables Overdrive and taints the kernel; see docs/backends.md)"
    )


# --- the I/O seam -------------------------------------------------------------------------------------------------

# Every file the tuner may write under a card's device directory. Anything else is a bug (tests enforce it).
WRITABLE_FILES = frozenset({"pp_od_clk_voltage", "power_dpm_force_performance_level"})


class KernelRejected(NotApplied):
    """The kernel answered EINVAL: out of range, malformed, or the feature is off on this board."""


NOT_AN_ATTRIBUTE_REMEDY = ("a sysfs attribute is a regular file: check the driver (or TUNER_SYSFS_ROOT, when it "
                           "points at a copied tree)")


class NotAnAttribute(Unsupported):
    """Something other than a sysfs attribute sits at the path (a FIFO, a device node, a huge file)."""


class DeviceBusy(DeviceLost):
    """EPERM while root: the GPU is in reset or suspended (`amdgpu_get_pp_od_clk_voltage` returns -EPERM when
    `amdgpu_in_reset()` or `in_suspend`), which is likely right after a too-deep undervolt. `sent` is how many
    commands of the write had been accepted before it (0: nothing staged, safe to retry)."""

    sent: int = 0


class SysfsIO:
    """Reads sysfs text and writes kernel commands. Tests subclass it to put a fake kernel behind the same calls.

    Each command goes out in its own `os.write` on an unbuffered O_WRONLY descriptor: the kernel parses one command
    per write, so a buffered "vo -50\\nc\\n" would arrive as one write and be rejected.
    """

    # A store() takes the same runtime-PM reference and SMU lock as a show(), so a GPU wedged there blocks a write as
    # it blocks a read: the same bound as every read (kernel_files), then the device counts as lost, so `set`, its
    # revert and the helper never hang on one card.
    write_timeout_s: float = kernel_files.READ_TIMEOUT_S

    def is_root(self) -> bool:
        return os.geteuid() == 0 if hasattr(os, "geteuid") else False

    def read_text(self, path: Path) -> str:
        try:
            return kernel_files.read_text(path)
        except OSError as e:
            raise self._error(e, path, None) from None

    def read_attr(self, path: Path) -> str | None:
        """A telemetry attribute, or None when it is absent or the kernel refuses the read (a fan that cannot be
        queried, a GPU in reset): telemetry never fails over one figure."""
        try:
            return self.read_text(path)
        except TunerError:
            return None

    def write_commands(self, path: Path, commands: list[str]) -> None:
        if path.name not in WRITABLE_FILES:
            raise AssertionError(f"refusing to write outside the allow-list: {path}")
        payloads = []
        for command in commands:
            data = (command + "\n").encode("ascii")
            if not 0 < len(data) <= 127:
                raise AssertionError(f"kernel command must be 1..127 bytes: {command!r}")
            payloads.append((command, data))
        waiting_on: dict[str, str | None] = {"command": None}  # None: the open
        try:  # the caller may give up waiting; the worker still closes its descriptor
            kernel_files.within(self.write_timeout_s, lambda: self._write_payloads(path, payloads, waiting_on), path)
        except TimeoutError as timeout:  # the worker's own OSErrors are TunerErrors already (_error)
            raise self._error(timeout, path, waiting_on["command"]) from None

    def _write_payloads(self, path: Path, payloads: list[tuple[str, bytes]],
                        waiting_on: dict[str, str | None]) -> None:
        """Open, write each command (`waiting_on` names the one under way), close."""
        try:
            fd = self._open(path)
        except OSError as e:
            raise self._error(e, path, None) from None
        try:
            for sent, (command, data) in enumerate(payloads):
                waiting_on["command"] = command
                try:
                    written = self._write(fd, data)
                except OSError as e:
                    error = self._error(e, path, command)
                    if isinstance(error, DeviceBusy):
                        error.sent = sent
                    raise error from None
                if written != len(data):
                    raise NotApplied(f"short write of {command!r} to {path}", "see `sudo dmesg | tail`")
        finally:
            self._close(fd)

    # The three calls a fake kernel replaces.
    def _open(self, path: Path) -> int:
        return os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))

    def _write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def _close(self, fd: int) -> None:
        os.close(fd)

    def _error(self, e: OSError, path: Path, command: str | None) -> TunerError:
        what = f"writing {command!r} to {path}" if command else f"accessing {path}"
        if isinstance(e, (kernel_files.NotAKernelFile, kernel_files.TooLarge)):
            return NotAnAttribute(f"{path} is {e.strerror}", NOT_AN_ATTRIBUTE_REMEDY)
        if isinstance(e, TimeoutError):
            return DeviceLost(f"the GPU did not answer {what}: {e.strerror}",
                              "check `sudo dmesg | tail`; the card may be hung (a reboot clears it)")
        if e.errno == errno.ENOENT:
            return Unsupported(f"{path.name} is missing: Overdrive is off on this card", str(path))
        # EPERM is "needs root" only when we are not root; as root the kernel means "GPU in reset/suspended".
        if e.errno == errno.EACCES or (e.errno == errno.EPERM and not self.is_root()):
            return PermissionDenied(
                f"permission denied {what}", "writing GPU settings needs root: run with sudo"
            )
        if e.errno == errno.EPERM:
            return DeviceBusy(
                f"the GPU refused {what} (EPERM as root: it is busy, resetting or suspended)",
                "wait for it to resume, check `sudo dmesg | tail`, then `tuner reset`",
            )
        if e.errno == errno.EINVAL:
            return KernelRejected(
                f"the kernel rejected {what} (EINVAL: out of range or unsupported on this card)",
                "see `sudo dmesg | tail` for the reason",
            )
        if e.errno == errno.EROFS:
            return PermissionDenied(f"{path} is read-only (SR-IOV virtual function?)", "run on the host")
        return NotApplied(f"error {what}: {e.strerror}", "see `sudo dmesg | tail`")


# --- identity and hwmon telemetry -------------------------------------------------------------------------------

_PCI_SLOT = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


def _clean(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip().strip("\0").strip()
    return text or None


def read_value(path: Path) -> str | None:
    """A sysfs attribute, stripped of whitespace and NULs; None when absent or unreadable."""
    return _clean(_read_text(path))


def pci_slot(device_dir: Path) -> str | None:
    """`0000:03:00.0`, from the device symlink's target or, in plain trees, from uevent's PCI_SLOT_NAME."""
    with contextlib.suppress(OSError):
        name = device_dir.resolve().name
        if _PCI_SLOT.fullmatch(name):
            return name.lower()
    uevent = _read_text(device_dir / "uevent") or ""
    for line in uevent.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PCI_SLOT_NAME" and _PCI_SLOT.fullmatch(value.strip()):
            return value.strip().lower()
    return None


def pci_pair(device_dir: Path, vendor_file: str, device_file: str) -> str | None:
    """`1002:7550` from two hex attribute files (`0x1002`, `0x7550`)."""
    vendor, device = read_value(device_dir / vendor_file), read_value(device_dir / device_file)
    try:
        return f"{int(vendor, 16):04x}:{int(device, 16):04x}" if vendor and device else None
    except ValueError:
        return None


def hwmon_dir(device_dir: Path) -> Path | None:
    try:
        dirs = sorted((device_dir / "hwmon").glob("hwmon*"))
    except OSError:
        return None
    return dirs[0] if dirs else None


_TEMP_LABELS = {"edge": "temp_edge_c", "junction": "temp_hotspot_c", "mem": "temp_mem_c"}
_TEMP_DEFAULTS = {1: "temp_edge_c", 2: "temp_hotspot_c", 3: "temp_mem_c"}
PWM_MAX = 255  # hwmon ABI (Documentation/ABI/testing/sysfs-class-hwmon, pwmY): 0..255, 255 is 100 %
MIB = 1024 * 1024


def fan_percent(pwm: float | None, pwm_max: float | None, rpm: float | None, rpm_max: float | None) -> float | None:
    """Fan speed in % of its maximum: `pwm1 * 100 / pwm1_max` (pwm1_max absent: the ABI's 255), else, when pwm1
    cannot be read, `fan1_input * 100 / fan1_max` (RPM). A fan stopped at idle is 0 %; a card with neither (no
    fan, or no maximum to scale by) is None, never 0.

    >>> fan_percent(77, 255, 1100, 3300), fan_percent(77, None, None, None), fan_percent(None, None, 1100, 3300)
    (30.2, 30.2, 33.3)
    >>> fan_percent(0, 255, 0, 3300), fan_percent(None, None, 1100, None), fan_percent(None, None, None, None)
    (0.0, None, None)
    """
    if pwm is not None:
        top = pwm_max if pwm_max else PWM_MAX
        return round(pwm * 100 / top, 1)
    if rpm is not None and rpm_max:
        return round(rpm * 100 / rpm_max, 1)  # not clamped: a fan above its rated RPM is shown as it is
    return None


def hwmon_telemetry(device_dir: Path, now_s: float, io: SysfsIO | None = None) -> Telemetry:
    """One sample from hwmon and the device directory; every missing or unreadable file is a None, never a 0.

    Reads go through `io` (the same seam as the overdrive file), so a fake kernel can refuse one attribute the way
    amdgpu does (a write-only `pwm1` on a board whose fan speed cannot be queried, EPERM during a reset).
    Throttle reasons are not read here: they live only in the binary `gpu_metrics` (the backend asks amdsmi:
    tuner/backends/amd_throttle.py).
    """
    io = io or SysfsIO()

    def num(path: Path) -> float | None:
        text = _clean(io.read_attr(path))
        try:
            value = float(text) if text is not None else None
        except ValueError:
            return None
        # the kernel prints integers: "nan", "inf" or a number float() overflows is no reading (NaN would pass
        # every limit check silently)
        return value if value is None or math.isfinite(value) else None

    hw = hwmon_dir(device_dir)
    values: dict[str, Any] = {}  # Telemetry's float fields, by name
    if hw is not None:
        values["voltage_mv"] = num(hw / "in0_input")
        power_uw = num(hw / "power1_average")
        if power_uw is None:
            power_uw = num(hw / "power1_input")
        values["power_w"] = None if power_uw is None else round(power_uw / 1e6, 3)
        # microwatts (amdgpu_pm.c amdgpu_hwmon_show_power_cap_generic: limit * 1000000; "\n" when unknown)
        cap_uw = num(hw / "power1_cap")
        values["power_limit_w"] = None if cap_uw is None else round(cap_uw / 1e6, 3)
        for n in (1, 2, 3):
            temp = num(hw / f"temp{n}_input")
            if temp is None:
                continue
            label = (_clean(io.read_attr(hw / f"temp{n}_label")) or "").lower()
            values[_TEMP_LABELS.get(label, _TEMP_DEFAULTS[n])] = temp / 1000.0
        for n, key in ((1, "core_clock_mhz"), (2, "mem_clock_mhz")):
            hz = num(hw / f"freq{n}_input")
            values[key] = None if hz is None else round(hz / 1e6, 1)
        rpm = num(hw / "fan1_input")
        values["fan_rpm"] = rpm
        pwm = num(hw / "pwm1")
        values["fan_pct"] = fan_percent(
            pwm, num(hw / "pwm1_max") if pwm is not None else None, rpm,
            num(hw / "fan1_max") if pwm is None else None,
        )
    values["util_pct"] = num(device_dir / "gpu_busy_percent")
    # bytes (amdgpu_vram_mgr.c amdgpu_mem_info_vram_used_show / _total_show: "%llu\n"); hidden without VRAM
    for name, key in (("mem_info_vram_used", "vram_used_mib"), ("mem_info_vram_total", "vram_total_mib")):
        n_bytes = num(device_dir / name)
        values[key] = None if n_bytes is None else round(n_bytes / MIB, 1)
    return Telemetry(time_s=now_s, **values)
