"""`tuner doctor`: is this machine ready to tune? Each check says ok/warn/fail/info and, when not ok, one remedy.

Core module: no textual, no torch (torch is probed in a subprocess). Every source of facts is injectable
(sysfs root, NVML module, torch probe, environment, euid) so the checks run against fake trees in tests.
"""

from __future__ import annotations

import contextlib
import grp
import importlib.metadata
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.actions import other_tools
from tuner.backends.amd_sysfs import (
    NO_OVERDRIVE_FOR_CARD,
    NO_OVERDRIVE_FOR_CARD_REMEDY,
    NOT_AN_ATTRIBUTE_REMEDY,
    PP_OVERDRIVE_MASK,
    amd_card_dirs,
    ppfeaturemask_with_overdrive,
    read_ppfeaturemask,
)
from tuner.backends.helper_client import HelperUnreachable, connect
from tuner.backends.nvidia import import_nvml
from tuner.core import kernel_files, paths, system_units, torch_build
from tuner.core.privileges import EngineIdentity, engine_identity
from tuner.core.state_files import user_name
from tuner.profiles import boot as boot_rules

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"

# torch is the `engine` extra (checked by check_torch, in a subprocess); these are the base requirements
REQUIRED_PACKAGES = ("textual", "textual-plotext", "plotext", "psutil", "nvidia-ml-py", "tomli-w", "msgspec")
INSTALL_SECTION = "Installing torch"  # the README section every torch remedy names (tests/test_doctor.py checks it)
ENGINE_REMEDY = (f"install the stress engine: `pip install 'undervolt-tuner[engine]'` with the torch build for your "
                 f"GPU, or `sudo bash scripts/install-system.sh` (README, '{INSTALL_SECTION}')")
EFI_SECURE_BOOT = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
HIDING_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
NVML_OFFSETS_DRIVER = 555  # nvmlDeviceSetClockOffsets
NVML_VF_OFFSET_DRIVER = 520  # nvmlDeviceSetGpcClkVfOffset (deprecated)
TORCH_PROBE_TIMEOUT_S = 120


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail | info
    detail: str
    remedy: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def probe_torch() -> dict:
    """Run `python -m tuner.engine.probe` and return its JSON (or {"error": ...})."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tuner.engine.probe"],
            capture_output=True, text=True, timeout=TORCH_PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"torch": None, "error": f"probe timed out after {TORCH_PROBE_TIMEOUT_S} s"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"torch": None, "error": tail}


def check_python() -> Check:
    v = sys.version_info
    text = f"Python {v.major}.{v.minor}.{v.micro}"
    if v >= (3, 11):
        return Check("python", OK, text)
    return Check("python", FAIL, text, "install Python 3.11 or newer")


def check_packages() -> list[Check]:
    missing = {d: Check(f"package {d}", FAIL, "not installed", f"pip install {d}") for d in REQUIRED_PACKAGES}
    missing["amdsmi"] = Check("package amdsmi", INFO, "not installed (optional: sysfs is used for AMD control; "
                              "without it AMD cards show no energy counter and `limits: n/a`)",
                              "pip install 'undervolt-tuner[amd]' (needs ROCm's libamd_smi.so)")
    checks = []
    for dist, if_missing in missing.items():
        try:
            checks.append(Check(f"package {dist}", OK, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            checks.append(if_missing)
    return checks


def check_torch(probe: dict, gpus_expected: bool) -> list[Check]:
    if not probe.get("torch"):
        return [Check("torch", FAIL, f"cannot import torch: {probe.get('error', 'unknown error')}", ENGINE_REMEDY)]
    build = "ROCm " + probe["hip"] if probe.get("hip") else "CUDA " + probe["cuda"] if probe.get("cuda") else "CPU-only"
    checks = []
    if build == "CPU-only":
        status = WARN if gpus_expected else INFO
        remedy = "install a CUDA or ROCm build of torch to stress the GPU" if gpus_expected else None
        checks.append(Check("torch build", status, f"torch {probe['torch']} (CPU-only build)", remedy))
    else:
        checks.append(Check("torch build", OK, f"torch {probe['torch']} ({build})"))
    devices = probe.get("devices", [])
    if build != "CPU-only" and not devices:
        checks.append(Check("torch devices", FAIL, "torch sees no GPU",
                            "check the driver, and that no *_VISIBLE_DEVICES variable hides the cards"))
    for dev in devices:
        cap = ".".join(map(str, dev.get("capability", [])))
        detail = (f"{dev['name']} at {dev.get('pci_bus_id') or 'unknown slot'}, capability {cap}, "
                  f"bf16 {'yes' if dev.get('bf16') else 'no'}")
        checks.append(Check(f"torch device {dev['index']}", OK if dev.get("bf16") else WARN, detail,
                            None if dev.get("bf16") else "the stress engine will use fp32 (slower, still valid)"))
    return checks


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_nvidia(nvml: Any) -> list[Check]:  # the pynvml module, or a fake of it
    if nvml is None:
        return [Check("nvidia driver", INFO, "nvidia-ml-py not importable; NVIDIA cards are not looked for")]
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [Check("nvidia driver", INFO, f"no NVIDIA driver ({_text(e) or type(e).__name__})")]
    try:
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            count = nvml.nvmlDeviceGetCount()
        except Exception as e:  # noqa: BLE001 - NVML loaded but does not answer (Unknown, a driver mid-update)
            return [Check("nvidia driver", FAIL, f"the NVIDIA driver does not answer NVML "
                          f"({_text(e) or type(e).__name__})",
                          "run `nvidia-smi`: the same error there means the driver is broken; reboot (a driver "
                          "updated since boot no longer matches its kernel module)")]
        major_text = driver.split(".")[0]
        checks = []
        if not major_text.isdecimal():  # not "560.35.03": no number to compare with the driver the calls need
            checks.append(Check("nvidia driver", WARN, f"driver version {driver!r} is not a number",
                                f"check `nvidia-smi`: driver {NVML_OFFSETS_DRIVER} or newer is needed to set clock "
                                "offsets"))
        elif int(major_text) >= NVML_OFFSETS_DRIVER:
            checks.append(Check("nvidia driver", OK, f"driver {driver}"))
        elif int(major_text) >= NVML_VF_OFFSET_DRIVER:
            checks.append(Check("nvidia driver", WARN, f"driver {driver} (uses the deprecated VF offset call)",
                                f"driver {NVML_OFFSETS_DRIVER} or newer is preferred"))
        else:
            checks.append(Check("nvidia driver", FAIL, f"driver {driver} cannot set clock offsets",
                                f"install NVIDIA driver {NVML_VF_OFFSET_DRIVER} or newer"))
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                name = _text(nvml.nvmlDeviceGetName(handle))
            except Exception as e:  # noqa: BLE001 - GpuIsLost (fallen off the bus), Unknown: this card's check
                checks.append(Check(f"nvidia gpu {i}", FAIL, f"GPU {i} does not answer NVML "
                                    f"({_text(e) or type(e).__name__}); the other cards are still checked",
                                    "reboot; if it happens again, check the card's seating and power (a GPU that "
                                    "fell off the bus: Xid 79 in the kernel log)"))
                continue
            try:
                persistent = nvml.nvmlDeviceGetPersistenceMode(handle) == 1
            except Exception as e:  # noqa: BLE001 - not supported on some boards
                persistent, unread = None, _text(e) or type(e).__name__
            if persistent:
                checks.append(Check(f"nvidia gpu {i} persistence", OK, f"{name}: persistence mode on"))
            elif persistent is None:  # unknown, not off: say what NVML answered
                checks.append(Check(f"nvidia gpu {i} persistence", WARN, f"{name}: NVML does not report the "
                                    f"persistence mode ({unread})", "settings vanish when the driver unloads "
                                    "unless it stays loaded: `sudo nvidia-smi -pm 1` where the card supports it"))
            else:
                checks.append(Check(f"nvidia gpu {i} persistence", WARN, f"{name}: persistence mode off",
                                    "settings vanish when the driver unloads: `sudo nvidia-smi -pm 1`"))
        return checks
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def ppfeaturemask_remedy(mask: int, root: Path | None = None,
                         which: Callable[[str], str | None] = shutil.which) -> str:
    """The exact kernel parameter to add (e.g. `amdgpu.ppfeaturemask=0xfff7ffff`) and how, for this machine's boot
    setup: kernelstub (Pop!_OS), rpm-ostree (Fedora Atomic), systemd-boot (/boot/loader/entries), else GRUB; and
    the modprobe.d alternative with the initramfs rebuild. docs/install.md has each in full."""
    param = ppfeaturemask_with_overdrive(mask)
    value = param.partition("=")[2]
    root = Path("/") if root is None else root
    if which("kernelstub"):
        how = f"`sudo kernelstub -a {param}`"
    elif which("rpm-ostree"):
        how = f"`sudo rpm-ostree kargs --append={param}`"
    elif (root / "boot/loader/entries").is_dir() or (root / "efi/loader/entries").is_dir():
        how = ("systemd-boot: append it to the `options` line of your entry in /boot/loader/entries/*.conf "
               "(or /etc/kernel/cmdline, then `sudo kernel-install add`)")
    else:
        how = ("GRUB: add it to GRUB_CMDLINE_LINUX in /etc/default/grub, then `sudo update-grub` "
               "(Fedora: `sudo grub2-mkconfig -o /boot/grub2/grub.cfg`)")
    modprobe = (f"or `echo 'options amdgpu ppfeaturemask={value}' | sudo tee "
                "/etc/modprobe.d/amdgpu-overdrive.conf` and rebuild the initramfs (`sudo update-initramfs -u`, "
                "`sudo dracut -f` or `sudo mkinitcpio -P`)")
    return f"add {param} to the kernel command line: {how}; {modprobe}; then reboot (docs/install.md)"


def check_amd(root: Path, *, helper_writes: bool = False) -> list[Check]:
    """Overdrive on, and each card's pp_od_clk_voltage there (and writable: by this process or the root helper)."""
    cards = amd_card_dirs(root)
    mask = read_ppfeaturemask(root)
    if not cards and mask is None:
        return [Check("amdgpu", INFO, "amdgpu driver not loaded; AMD cards are not looked for")]
    checks = []
    if mask is not None:
        if mask & PP_OVERDRIVE_MASK:
            checks.append(Check("amdgpu overdrive", OK, f"ppfeaturemask {mask:#010x} has the overdrive bit"))
        else:
            checks.append(Check("amdgpu overdrive", FAIL, f"ppfeaturemask {mask:#010x} lacks the overdrive bit "
                                "(0x4000)", ppfeaturemask_remedy(mask)))
    for card in cards:
        od = card / "pp_od_clk_voltage"
        label = f"amd card {card.parent.name}"
        if not od.exists() and mask is not None and mask & PP_OVERDRIVE_MASK:
            # the bit is set, so the same parameter again changes nothing: the driver offers no overdrive for this
            # card (RDNA3 before kernel 6.7, LACT #205; control.md)
            checks.append(Check(label, FAIL, f"pp_od_clk_voltage is missing: {NO_OVERDRIVE_FOR_CARD}",
                                NO_OVERDRIVE_FOR_CARD_REMEDY))
        elif not od.exists():
            remedy = ppfeaturemask_remedy(mask) if mask is not None else "enable amdgpu overdrive (ppfeaturemask)"
            checks.append(Check(label, FAIL, "pp_od_clk_voltage is missing (overdrive is off)", remedy))
        elif not stat.S_ISREG(mode := od.stat().st_mode):
            # what `tuner set` refuses (kernel_files: a FIFO would hang it, /dev/zero fill its memory)
            checks.append(Check(label, FAIL, f"pp_od_clk_voltage is {kernel_files.file_kind(mode)}, not a sysfs "
                                "attribute", NOT_AN_ATTRIBUTE_REMEDY))
        elif os.access(od, os.W_OK):
            checks.append(Check(label, OK, "pp_od_clk_voltage present and writable"))
        elif helper_writes:
            checks.append(Check(label, OK, "pp_od_clk_voltage present; the root helper writes it"))
        else:
            checks.append(Check(label, WARN, "pp_od_clk_voltage present but not writable",
                                "writes need root: run `sudo tuner ...`"))
    return checks


NO_GPU_REMEDY = ("check the card is seen (`lspci | grep -iE 'vga|3d'`) and its driver is loaded (amdgpu, or the "
                 "NVIDIA driver with nvidia-ml-py); to try the tuner without one: `tuner --simulate`")


def check_gpus_found(card_checks: list[Check]) -> list[Check]:
    """No card at all is a failure, not information: `tuner list` exits 4 on this machine, so doctor must too."""
    if any(c.name.startswith(("amd card", "nvidia gpu")) for c in card_checks):
        return []
    return [Check("gpu", FAIL, "no supported GPU found (no AMD card with amdgpu in /sys/class/drm, no NVIDIA card "
                  "via NVML)", NO_GPU_REMEDY)]


def check_root(euid: int, simulate: bool, *, helper_writes: bool = False) -> Check:
    """`helper_writes`: a root helper lets this user in (check_helper is OK), so root is not needed to apply."""
    if euid == 0:
        return Check("privileges", OK, "running as root")
    if simulate:
        return Check("privileges", INFO, "not root (fine for the simulated GPU)")
    if helper_writes:
        return Check("privileges", OK, "not root: settings are applied through the root helper")
    return Check("privileges", WARN, "not root: settings can be read but not applied",
                 "run `sudo tuner ...` to apply settings")


def _run(*command: str) -> subprocess.CompletedProcess[str] | None:
    """`command` run to its end (10 s at most) with its output kept; None when it could not run or timed out."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None


def check_kernel_log(root: Path, which: Callable[[str], str | None] = shutil.which) -> Check:
    proc = _run("journalctl", "-k", "-n", "1", "--no-pager", "-q") if which("journalctl") else None
    if proc is not None and proc.returncode == 0 and proc.stdout.strip():
        return Check("kernel log", OK, "readable through journalctl")
    kmsg = root / "dev" / "kmsg"
    if kmsg.exists() and os.access(kmsg, os.R_OK):
        return Check("kernel log", OK, f"readable through {kmsg}")
    return Check("kernel log", WARN, "not readable: GPU resets and Xid errors will go unseen during trials",
                 "run as root, or add your user to the systemd-journal (or adm) group")


def _can_open(st: os.stat_result, uid: int, groups: set[int]) -> bool:
    """Read and write by these credentials, from the mode bits (what open(2) checks for a device node)."""
    mode = st.st_mode
    return (uid == 0 or (st.st_uid == uid and mode & 0o600 == 0o600) or (st.st_gid in groups and mode & 0o060 ==
            0o060) or mode & 0o006 == 0o006)


def check_device_groups(root: Path, uid: int, groups: set[int], user: str) -> list[Check]:
    """Whether the account the stress engine runs as can open the GPU's compute nodes (`/dev/kfd` for ROCm,
    `/dev/dri/renderD*`), and if not, the group it lacks (`render` or `video` on most distributions)."""
    nodes = [n for n in (root / "dev/kfd", *sorted((root / "dev/dri").glob("renderD*"))) if n.exists()]
    if not nodes:
        return []
    lacking: dict[str, list[str]] = {}
    for node in nodes:
        st = node.stat()
        if not _can_open(st, uid, groups):
            try:
                group = grp.getgrgid(st.st_gid).gr_name
            except KeyError:
                group = str(st.st_gid)
            lacking.setdefault(group, []).append(f"/{node.relative_to(root)}")
    if not lacking:
        return [Check("gpu device nodes", OK, f"{user} can open {', '.join(f'/{n.relative_to(root)}' for n in nodes)}")]
    names = " and ".join(sorted(lacking))
    opened = "; ".join(f"{', '.join(v)} belong to group {k}" for k, v in sorted(lacking.items()))
    return [Check("gpu device nodes", FAIL, f"{user} cannot open the GPU for the stress engine: {opened}",
                  f"add {user} to {names}: `sudo usermod -aG {','.join(sorted(lacking))} {user}`, then log in "
                  "again")]


def engine_account(env: Mapping[str, str], euid: int) -> tuple[int, set[int], str] | Check:
    """The account the stress engine runs as (uid, groups, name), or the check saying there is none."""
    if euid != 0:
        return euid, {os.getegid(), *os.getgroups()}, user_name(euid)
    identity = engine_identity(simulated=False, euid=euid, env=env)
    if isinstance(identity, EngineIdentity):
        return identity.uid, {identity.gid, *identity.extra_groups}, identity.user
    if identity is None:
        return 0, set(), "root"
    return Check("engine account", WARN, identity.reason, identity.remedy)


def check_helper(simulate: bool = False) -> Check:
    """Is the root helper there, and does it let this user in? (docs/helper.md) OK only where it drives the cards
    this run means: a simulated helper writes none of this machine's (`simulate`: the doctor's own --simulate)."""
    path, chosen = paths.helper_socket()
    if not chosen and not path.exists():
        return Check("helper", INFO, f"no root helper ({path} is missing): writes need root",
                     "install tuner-helper to tune as yourself (docs/helper.md)")
    try:
        connection, hello = connect(path, client="tuner doctor")
    except HelperUnreachable as e:  # not there, or it refused this user (HelperRefused)
        return Check("helper", WARN, e.message, e.remedy)
    connection.close()
    what = "SIMULATED cards" if hello.simulated else f"{hello.backend} cards"
    detail = f"tuner-helper {hello.helper_version} at {path} drives {what} (group {hello.group})"
    if hello.simulated and not simulate:
        return Check("helper", WARN, f"{detail}: the tuner's commands use them, and it writes none of this "
                     "machine's cards", "unset TUNER_HELPER_SOCKET, or stop the simulated helper, to tune the real "
                     "cards")
    return Check("helper", OK, detail)


def check_hidden_devices(env: Mapping[str, str]) -> list[Check]:
    return [
        Check(f"env {var}", WARN, f"{var}={env[var]!r} hides GPUs from the stress engine",
              f"unset {var} unless you mean to hide cards")
        for var in HIDING_VARIABLES if var in env
    ]


def check_torch_build(probe: dict, root: Path, env: Mapping[str, str]) -> Check:
    """The build this machine needs (tuner.core.torch_build, the installer's rule) against the one installed."""
    try:
        need = torch_build.needed_build(root, env)
    except torch_build.BuildChoiceError as e:
        return Check("torch build needed", WARN, str(e), "set TUNER_TORCH and install that build")
    have = torch_build.installed_build(probe)
    if need.name == "keep":
        return Check("torch build needed", INFO, "TUNER_TORCH=keep: whichever build is installed")
    detail = f"this machine needs the {need.words} build ({need.why}); installed: " + (
        f"{torch_build.WORDS[have]}" if have else "none")
    if have == need.name:
        return Check("torch build needed", OK, detail)
    index = f" --index-url {need.index_url}" if need.index_url else ""
    return Check("torch build needed", WARN if have else FAIL, detail,
                 f"`pip install --force-reinstall 'torch>=2.4'{index}` in this venv, or `sudo bash "
                 f"scripts/install-system.sh` (README, '{INSTALL_SECTION}')")


def secure_boot_enabled(root: Path, which: Callable[[str], str | None] = shutil.which) -> bool | None:
    """Secure Boot on (True), off (False) or unknown (None): the EFI variable (its last byte), else mokutil."""
    with contextlib.suppress(OSError):  # kernel_files: a FIFO planted at the variable cannot hang the doctor
        data = kernel_files.read_bytes(root / EFI_SECURE_BOOT)
        if data:
            return data[-1] == 1
    proc = _run("mokutil", "--sb-state") if str(root) == "/" and which("mokutil") else None
    return "enabled" in proc.stdout.lower() if proc is not None and proc.stdout else None


def _unbound_nvidia(root: Path) -> list[str]:
    """NVIDIA display devices on the PCI bus that no driver is bound to."""
    out = []
    for dev in sorted((root / "sys/bus/pci/devices").glob("*")):
        try:
            # kernel_files: a FIFO or a wedged attribute is an unreadable device, never a hung doctor
            vendor = kernel_files.read_text(dev / "vendor").strip().lower()
            cls = kernel_files.read_text(dev / "class").strip().lower()
        except OSError:
            continue
        if vendor == "0x10de" and cls.startswith("0x03") and not (dev / "driver").exists():
            out.append(dev.name)
    return out


MOK_REMEDY = ("the NVIDIA module is not signed with a key this machine trusts: enrol the key it was signed with "
              "(`sudo mokutil --import /var/lib/dkms/mok.pub` (DKMS) or /var/lib/shim-signed/mok/MOK.der (Ubuntu), "
              "reboot and confirm the enrolment in the blue MOK manager), or disable Secure Boot in the firmware")


# The kernel's own lines when it refuses a module for its signature (modprobe's "Key was rejected by service" is
# on its stderr, never in the kernel log): kernel/module/signing.c module_sig_check under module.sig_enforce
# ("Loading of unsigned module is rejected"), security/lockdown/lockdown.c lockdown_is_locked_down under Secure
# Boot's lockdown ("Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7").
MODULE_REFUSED = re.compile(r"Loading of .*module.* is rejected|: unsigned module loading is restricted")


def check_secure_boot(root: Path, which: Callable[[str], str | None] = shutil.which) -> list[Check]:
    """An NVIDIA card no driver took while Secure Boot is on (or, where its flag cannot be read, after this boot's
    kernel refused a module for its signature): the module is not signed with an enrolled key, which the generic
    no-GPU remedy would not say."""
    unbound = _unbound_nvidia(root)
    if not unbound:
        return []
    if secure_boot_enabled(root, which):
        why = "Secure Boot is on"
    else:  # off or unknown (no efivars, no mokutil): this boot's kernel may still have refused it (sig_enforce)
        proc = _run("journalctl", "-k", "-b", "--no-pager", "-q") if which("journalctl") else None
        log = proc.stdout if proc is not None and proc.returncode == 0 else ""
        why = "this boot's kernel log says a module was refused for its signature" if MODULE_REFUSED.search(log) else ""
    if why:
        return [Check("secure boot", FAIL, f"NVIDIA card at {', '.join(unbound)} has no driver, and {why}",
                      MOK_REMEDY)]
    return [Check("nvidia module", FAIL, f"NVIDIA card at {', '.join(unbound)} has no driver bound",
                  "install and load the NVIDIA driver (`sudo modprobe nvidia`; its error names the cause)")]


def check_other_tools(found: list[other_tools.Found] | None = None) -> list[Check]:
    """LACT's lactd, CoreCtrl's helper, nvidia-powerd: running, and the files each may write."""
    found = other_tools.detect() if found is None else found
    return [Check(f"other tool {f.tool.name}", WARN, f"{f.describe()} is running and may write: {f.tool.writes}",
                  f"stop it while you tune (a bisect refuses beside it unless --ignore-other-tools): "
                  f"`sudo systemctl stop {(f.tool.units or (f.tool.name,))[0]}`") for f in found]


UNIT_MAX_BYTES = 64 * 1024  # the installer's units are a few hundred bytes


def check_system_install(systemd_dir: Path | None = None, group_exists: Callable[[str], bool] | None = None
                         ) -> list[Check]:
    """A system install that is whole: units whose programs exist, the helper socket's group present."""
    systemd_dir = boot_rules.systemd_dir() if systemd_dir is None else systemd_dir
    present = [name for name in system_units.UNIT_NAMES if (systemd_dir / name).exists()]
    if not present:
        return [Check("system install", INFO, "no system units installed (`sudo bash scripts/install-system.sh`)")]
    problems = []
    for name in present:
        try:  # kernel_files: a directory, FIFO or unreadable file there is a problem named, not a hung doctor
            text = kernel_files.read_regular(systemd_dir / name, UNIT_MAX_BYTES).decode(errors="replace")
        except OSError as e:
            problems.append(f"{name} cannot be read ({e.strerror or e})")
            continue
        for line in text.splitlines():
            if line.startswith("ExecStart="):
                program = system_units.exec_program(line.removeprefix("ExecStart="))
                if program and not Path(program).exists():
                    problems.append(f"{name} runs {program}, which is missing")
            if line.startswith("SocketGroup="):
                group = line.removeprefix("SocketGroup=")
                exists = group_exists or _group_exists
                if not exists(group):
                    problems.append(f"{name} names group {group}, which does not exist")
    if problems:
        return [Check("system install", FAIL, f"half-installed: {'; '.join(problems)}",
                      "run `sudo bash scripts/install-system.sh` again (it repairs in place), or `--uninstall`")]
    return [Check("system install", OK, f"{', '.join(present)} in {systemd_dir}")]


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def run_checks(
    *,
    simulate: bool = False,
    root: Path | None = None,
    nvml: Any = ...,  # the pynvml module, None (not installed) or a fake; ... imports it
    torch_probe: Callable[[], dict] = probe_torch,
    env: Mapping[str, str] | None = None,
    euid: int | None = None,
) -> list[Check]:
    """All checks, in the order a person would fix them."""
    root = paths.sysfs_root() if root is None else root
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    nvml = import_nvml() if nvml is ... else nvml
    checks = [check_python(), *check_packages()]
    if simulate:
        checks.append(Check("simulated gpu", INFO, "SIMULATED GPUs in use: no hardware is read or written"))
    helper = check_helper(simulate)
    helper_writes = helper.status == OK  # then a user's settings need no sudo: say so, not "run sudo tuner"
    amd = check_amd(root, helper_writes=helper_writes)
    nvidia = check_nvidia(nvml)
    if not simulate:
        checks += check_gpus_found(amd + nvidia)
    gpus_expected = any(c.status != INFO for c in amd + nvidia)
    probe = torch_probe()
    checks += check_torch(probe, gpus_expected)
    if not simulate:
        checks.append(check_torch_build(probe, root, env))
        checks += check_secure_boot(root)
    checks += nvidia + amd
    checks += check_other_tools([] if simulate else None)
    checks += check_system_install()
    checks.append(check_root(euid, simulate, helper_writes=helper_writes))
    checks.append(helper)
    if not simulate:
        account = engine_account(env, euid)
        if isinstance(account, Check):
            checks.append(account)
        else:
            checks += check_device_groups(root, *account)
    checks.append(check_kernel_log(root))
    checks += check_hidden_devices(env)
    return checks
