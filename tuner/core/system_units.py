"""The systemd units of a system install, as text: the boot unit and the resume unit (each applies the system
profiles to the cards they were proven on), and the root helper's socket and service (docs/helper.md).

Standard library only: `scripts/install-system.sh --dry-run` renders them with the system's python3 straight from
the checkout, before any venv exists (`python3 -m tuner.core.system_units --print`), and `tuner service install`
writes the apply units from the same functions, so there is one text of each unit.

Every unit runs as root and writes to /sys or reaches NVML, so its sandbox is chosen line by line: HARDENING lists
what each unit carries and why it is safe for sysfs and NVML writes; NOT_USED lists the options left out and why
(docs/install.md is the long form). `tests/profiles/test_system_units.py` runs `systemd-analyze verify` on each.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner.core import paths

APPLY_UNIT = "tuner-apply.service"
RESUME_UNIT = "tuner-resume.service"
HELPER_SOCKET_UNIT = "tuner-helper.socket"
HELPER_SERVICE_UNIT = "tuner-helper.service"
UNIT_NAMES = (APPLY_UNIT, RESUME_UNIT, HELPER_SOCKET_UNIT, HELPER_SERVICE_UNIT)
DEFAULT_PREFIX = "/opt/undervolt-tuner"
DEFAULT_GROUP = "tuner"
RESET_FLAG = "tuner.reset"
# systemd enters these targets on the way down and leaves them on the way up: a unit WantedBy and After them runs
# once each resume (systemd.special(7); the pattern of nvidia-resume.service and LACT's own resume hook).
SLEEP_TARGETS = ("suspend.target", "hibernate.target", "hybrid-sleep.target", "suspend-then-hibernate.target")
BOOT_TIMEOUT_S = 120  # the discovery wait (30 s by default, at most `--boot-wait`) plus NVML's start-up per card
RESUME_TIMEOUT_S = 60
RESUME_WAIT_S = 15  # a card re-initialises in a second or two after resume; a missing one must not hold the unit

# (line, why it is there and why it still lets the unit write /sys and call NVML's setters), in unit order.
HARDENING: dict[str, str] = {
    "NoNewPrivileges=yes": "no setuid/file-capability gain by anything it runs; sysfs and NVML writes need none "
        "beyond the root it starts with",
    "ProtectSystem=strict": "the whole file system read-only but /dev, /proc and /sys (systemd keeps the API file "
        "systems writable), so a pp_od_clk_voltage write and NVML's ioctls on /dev/nvidia* still work",
    "ProtectHome=read-only": "no writes under /home, /root or /run/user; read-only, not inaccessible, because the "
        "boot check reads the tuning journal of the user who bisected (and the helper imports users' unsafe lists)",
    "PrivateTmp=yes": "a /tmp of its own: nothing it writes there is seen by others, nothing others plant is read",
    "PrivateNetwork=yes": "no network at all; the helper's socket is a file-system AF_UNIX socket, reachable "
        "from any network namespace",
    "RestrictAddressFamilies=AF_UNIX": "only unix sockets (the helper's, the journal's); NVML and sysfs use none",
    "ProtectKernelModules=yes": "cannot load a kernel module: the GPU driver is loaded by udev before the unit "
        "runs (the unit waits for a late one, it never loads one)",
    "ProtectControlGroups=yes": "/sys/fs/cgroup read-only; the rest of /sys stays writable",
    "ProtectHostname=yes": "cannot change the host name",
    "RestrictNamespaces=yes": "cannot create namespaces",
    "RestrictRealtime=yes": "no realtime scheduling",
    "RestrictSUIDSGID=yes": "cannot create setuid or setgid files",
    "LockPersonality=yes": "cannot change the execution domain",
    "SystemCallArchitectures=native": "no 32-bit system call entry points",
    "SystemCallFilter=~@cpu-emulation @debug @module @mount @obsolete @raw-io @reboot @swap":
        "a deny list, not an allow list: the calls NVML and sysfs need (open, read, write, ioctl, mmap) all stay",
    "UMask=0022": "the files it writes (state, records) are not writable by others",
}
# Kernel logs: the apply units never read them; the helper streams them (its kernel-event request), so only they
# get ProtectKernelLogs. Capabilities: see CAPABILITIES.
APPLY_ONLY = {"ProtectKernelLogs=yes": "no /dev/kmsg or syslog(2): the apply units never read the kernel log"}
CAPABILITIES = {
    "CAP_SYS_ADMIN": "NVML's setters (clock offsets, locked clocks, persistence mode): the NVIDIA driver checks it",
    "CAP_DAC_OVERRIDE": "writing the state directory and the card records whatever their mode",
    "CAP_DAC_READ_SEARCH": "reading a user's tuning journal under a home directory of mode 0700",
    "CAP_FOWNER": "atomic replacement (rename, fsync) of files the state directory holds",
    "CAP_MKNOD": "NVML creates a missing /dev/nvidia* node through nvidia-modprobe on first use",
}
HELPER_CAPABILITIES = {**CAPABILITIES, "CAP_SYSLOG": "reading /dev/kmsg where dmesg_restrict=1 (kernel events)"}
# Options a reader would expect and that are left out on purpose: each would break a write the unit exists for.
NOT_USED = {
    "ProtectKernelTunables": "makes /sys read-only, and pp_od_clk_voltage lives in /sys",
    "PrivateDevices": "a private /dev without /dev/nvidia*: NVML could not open the card",
    "DeviceAllow": "device groups (char-nvidia*) are resolved when the unit starts; a driver that registers its "
    "devices after that (the late-driver boot the unit waits for) would be locked out, and systemd takes group "
    "names, not NVIDIA's fixed major number 195",
    "ProtectClock": "implies a device rule (DeviceAllow=char-rtc r), which closes every other device, "
    "/dev/nvidia* included",
    "MemoryDenyWriteExecute": "ctypes (pynvml) may need writable and executable memory for its call trampolines",
    "ProcSubset": "ProcSubset=pid hides /proc/sys/kernel/random/boot_id (the journal's boot id) and /proc/cmdline",
    "PrivateUsers": "a user namespace maps root away; sysfs writes and NVML setters need the real root",
}


def _quote(word: str) -> str:
    return shlex.quote(word).replace("%", "%%")  # systemd expands %-specifiers inside these lines


def exec_program(command: str) -> str:
    """The program an `ExecStart=` value written with `_quote` runs (its quoting and `%%` undone, as systemd
    reads it), for a reader checking that program exists; "" for an empty (or hand-edited, unbalanced) line."""
    try:
        words = shlex.split(command)
    except ValueError:  # an unclosed quote: not a line this module wrote
        words = command.split()
    return words[0].replace("%%", "%") if words else ""


def _hardening(*, apply: bool, writable: Sequence[str]) -> str:
    lines = list(HARDENING)
    if apply:
        lines += list(APPLY_ONLY)
    caps = CAPABILITIES if apply else HELPER_CAPABILITIES
    lines.append("CapabilityBoundingSet=" + " ".join(caps))
    lines += [f"ReadWritePaths=-{_quote(p)}" for p in writable]  # "-": a path not made yet is no error
    return "# Sandbox: each line and why it still lets this unit write /sys and reach NVML: docs/install.md\n" + \
        "".join(f"{line}\n" for line in lines)


def pinned_environment() -> dict[str, str]:
    """The directories the installer sees, pinned in the apply units: at boot HOME is /root, and the tuning
    journal of a bisect may live elsewhere; the boot check must read the same journal the bisect wrote."""
    env = {"XDG_STATE_HOME": str(paths.state_dir().parent), "XDG_CONFIG_HOME": str(paths.config_dir().parent)}
    for var in ("TUNER_SYSTEM_PROFILES", "TUNER_SYSFS_ROOT"):
        if var in os.environ:
            env[var] = os.environ[var]
    return env


def apply_unit(exec_args: Sequence[str], environment: Mapping[str, str], *, resume: bool = False) -> str:
    """The boot unit (`tuner apply --boot`) or, with `resume`, the unit that re-applies after each resume.

    Boot ordering, and why:
    - DefaultDependencies=no: so multi-user.target is not ordered after it. A card that is missing (a profile for
      a card that left the machine) costs the unit its bounded discovery wait, never the boot. With the default
      dependencies gone, the unit orders itself after sysinit.target (local file systems, /opt and /var mounted)
      and sockets.target (the helper's socket), and stops for shutdown.
    - After=systemd-modules-load.service systemd-udev-trigger.service: GPU drivers load from modules-load.d or by
      udev coldplug; after both the driver is loaded or loading, and probe time is what `--boot`'s retry covers
      (a Condition on /sys/class/drm/card* would race it and skip the unit silently).
    - After=nvidia-persistenced.service: ordering only (no dependency): where the daemon is enabled, persistence
      mode is on before the unit checks it.
    - ConditionPathIsDirectory=/sys/class/drm: no DRM core, no GPU driver at all: skipped, not failed.
    - ConditionKernelCommandLine=!tuner.reset: the escape hatch, enforced before Python even runs.
    Resume: After= and WantedBy= the sleep targets, not RemainAfterExit (a unit that stays active would not run at
    the next resume); after nvidia-resume.service, which restores the NVIDIA driver's state first.
    """
    env_lines = "".join(f"Environment={_quote(f'{k}={v}')}\n" for k, v in sorted(environment.items()))
    command = " ".join(_quote(a) for a in exec_args)
    state = environment.get("XDG_STATE_HOME")
    writable = [str(Path(state) / "tuner")] if state else []
    name = RESUME_UNIT if resume else APPLY_UNIT
    if resume:
        purpose = ("Re-applies the system profiles after each resume from suspend or hibernation, and checks each card "
                   "reads them.")
        unit = f"""\
Description=Re-apply undervolt-tuner GPU profiles after resume
After={' '.join(SLEEP_TARGETS)} nvidia-resume.service
"""
        service = f"TimeoutStartSec={RESUME_TIMEOUT_S}\n"
        install = f"WantedBy={' '.join(SLEEP_TARGETS)}\n"
    else:
        purpose = "Applies the profiles in the system profile store to the cards they were proven on, once per boot."
        unit = """\
Description=Apply undervolt-tuner GPU profiles
DefaultDependencies=no
After=sysinit.target sockets.target systemd-modules-load.service systemd-udev-trigger.service
After=nvidia-persistenced.service
Before=shutdown.target
Conflicts=shutdown.target
"""
        service = f"RemainAfterExit=yes\nTimeoutStartSec={BOOT_TIMEOUT_S}\n"
        install = "WantedBy=multi-user.target\n"
    return f"""\
# Written by `tuner service install`; remove with `tuner service uninstall`.
# {purpose}
# Boot with `{RESET_FLAG}` on the kernel command line to skip it. Logs: journalctl -u {name}
[Unit]
{unit}ConditionPathIsDirectory=/sys/class/drm
ConditionKernelCommandLine=!{RESET_FLAG}

[Service]
Type=oneshot
{service}{env_lines}Environment=PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ExecStart={command}
StandardOutput=journal
StandardError=journal
SyslogIdentifier=tuner
{_hardening(apply=True, writable=writable)}
[Install]
{install}"""


def helper_socket_unit(group: str = DEFAULT_GROUP) -> str:
    """The helper's socket (docs/helper.md): 0660 root:GROUP, so only root and the group's members connect."""
    return f"""\
# Written by scripts/install-system.sh. The root helper's socket: systemd starts the helper on the first connection.
[Unit]
Description=undervolt-tuner root helper socket

[Socket]
ListenStream={paths.DEFAULT_HELPER_SOCKET}
SocketMode=0660
SocketUser=root
SocketGroup={group}
DirectoryMode=0755
RemoveOnStop=yes

[Install]
WantedBy=sockets.target
"""


def helper_service_unit(prefix: str = DEFAULT_PREFIX, group: str = DEFAULT_GROUP) -> str:
    """The helper itself (`tuner-helper`, docs/helper.md), socket-activated, sandboxed like the apply units but
    for the kernel log it streams. Its own per-card records (NVML's applied offsets) go under its state
    directory: ProtectHome makes root's home read-only."""
    helper = f"{prefix}/bin/tuner-helper"
    return f"""\
# Written by scripts/install-system.sh. The root helper: owns the cards and the machine's safety state.
[Unit]
Description=undervolt-tuner root helper
Requires={HELPER_SOCKET_UNIT}
After={HELPER_SOCKET_UNIT}

[Service]
ExecStart={_quote(helper)} --group {_quote(group)} --state-dir /var/lib/tuner
StateDirectory=tuner
StateDirectoryMode=0755
Environment=XDG_STATE_HOME=/var/lib/tuner/root PYTHONDONTWRITEBYTECODE=1
TimeoutStopSec=30
{_hardening(apply=False, writable=[])}
[Install]
Also={HELPER_SOCKET_UNIT}
"""


def apply_exec_args(python: str, profile: str | None = None, *, resume: bool = False) -> list[str]:
    """`PYTHON -P -m tuner apply --boot [--resume] [PROFILE]` (`-P`: the start directory is not on the import
    path, so nothing in the working directory is imported as root)."""
    args = [python, "-P", "-m", "tuner", "apply", "--boot"]
    if resume:
        args += ["--resume"]
    return [*args, profile] if profile else args


def apply_units(python: str, profile: str | None, environment: Mapping[str, str]) -> dict[str, str]:
    """The apply unit and its resume twin, by file name: `tuner apply --boot [--resume] [PROFILE]` run by
    `python`."""
    return {
        APPLY_UNIT: apply_unit(apply_exec_args(python, profile), environment),
        RESUME_UNIT: apply_unit(apply_exec_args(python, profile, resume=True), environment, resume=True),
    }


def system_units(prefix: str = DEFAULT_PREFIX, group: str = DEFAULT_GROUP,
                 environment: Mapping[str, str] | None = None, profile: str | None = None) -> dict[str, str]:
    """Every unit of a system install, by file name."""
    env = pinned_environment() if environment is None else environment
    return {
        **apply_units(f"{prefix}/bin/python", profile, env),
        HELPER_SOCKET_UNIT: helper_socket_unit(group),
        HELPER_SERVICE_UNIT: helper_service_unit(prefix, group),
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m tuner.core.system_units --print|--write DIR [--prefix P] [--group G]` (the installer)."""
    parser = argparse.ArgumentParser(prog="python -m tuner.core.system_units")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--print", action="store_true", help="print each unit after a `# FILE` line")
    what.add_argument("--write", metavar="DIR", help="write each unit into DIR (mode 0644)")
    parser.add_argument("--dir", default="/etc/systemd/system", help="with --print: the directory shown")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX)
    parser.add_argument("--group", default=DEFAULT_GROUP)
    args = parser.parse_args(argv)
    units = system_units(args.prefix, args.group)
    for name, text in units.items():
        if args.print:
            print(f"# {Path(args.dir) / name}\n{text}")
        else:
            target = Path(args.write) / name
            tmp = target.with_name(f".{name}.tmp")
            tmp.write_text(text)
            tmp.chmod(0o644)
            tmp.replace(target)
            print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
