"""`tuner service install|uninstall|status`: the systemd unit that applies system profiles at boot."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tuner.commands._output import format_value, print_json
from tuner.core import exit_codes, paths
from tuner.core.atomic import write_atomic
from tuner.core.errors import PermissionDenied, StateError, UsageError
from tuner.profiles import boot as boot_rules
from tuner.profiles import load_profile, save_profile
from tuner.profiles.store import scan


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "service",
        help="install or remove the boot service that applies profiles",
        description=f"The boot service ({boot_rules.UNIT_NAME}) runs `tuner apply --boot` once per boot, after the "
        "GPU driver has loaded. It applies each profile in /etc/tuner/profiles to the card it was proven on, and "
        "skips applying when the kernel command line has tuner.reset or the previous boot ended during a tuning "
        "trial. Its log: journalctl -u tuner-apply. Installing and removing need root.",
    )
    sub = p.add_subparsers(dest="service_command", metavar="ACTION", required=True)
    q = sub.add_parser("install", help="write and enable the unit (root)")
    q.add_argument("--profile", metavar="NAME",
                   help="copy this profile (name or path) to the system store and apply only it at boot")
    q.add_argument("--overwrite", action="store_true", help="replace a system profile of the same name")
    q.set_defaults(run=run_install)
    q = sub.add_parser("uninstall", help="disable and remove the unit (root); system profiles are kept")
    q.set_defaults(run=run_uninstall)
    q = sub.add_parser("status", help="is the unit installed, what would the next boot do")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(run=run_status)


def _is_root() -> bool:
    return os.geteuid() == 0


def _require_root(what: str) -> None:
    if not _is_root():
        raise PermissionDenied(f"{what} needs root (it writes {boot_rules.systemd_dir()})", "run it with sudo")


def _live_systemd() -> bool:
    """Only talk to systemctl when writing the real unit directory (tests point TUNER_SYSTEMD_DIR elsewhere)."""
    return "TUNER_SYSTEMD_DIR" not in os.environ and shutil.which("systemctl") is not None


def _systemctl(*args: str) -> None:
    if not _live_systemd():
        print(f"  (not run here: systemctl {' '.join(args)})")
        return
    proc = subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(f"tuner: warning: systemctl {' '.join(args)} failed: {proc.stderr.strip()}", file=sys.stderr)


def exec_args(profile_name: str | None) -> list[str]:
    """The interpreter running now, so the unit uses this installation (a venv included)."""
    args = [sys.executable, "-m", "tuner", "apply", "--boot"]
    return [*args, profile_name] if profile_name else args


def unit_environment() -> dict[str, str]:
    """Pin the directories the installer sees: at boot HOME is /root and the tuning journal of a `sudo tuner
    bisect` may live elsewhere; the boot check must read the same journal the bisect wrote."""
    env = {"XDG_STATE_HOME": str(paths.state_dir().parent), "XDG_CONFIG_HOME": str(paths.config_dir().parent)}
    for var in ("TUNER_SYSTEM_PROFILES", "TUNER_SYSFS_ROOT"):
        if var in os.environ:
            env[var] = os.environ[var]
    return env


def run_install(args, ctx) -> int:
    _require_root("installing the boot service")
    name = None
    if args.profile:
        profile = load_profile(args.profile)
        path = save_profile(profile, overwrite=args.overwrite, system=True)
        name = profile.name
        print(f"copied {profile.name!r} ({profile.device.label}, "
              f"{format_value(profile.setting.value, profile.setting.unit)}) to {path}")
    elif not scan(system=True)[0]:
        raise UsageError(f"there are no profiles in {paths.system_profiles_dir()} to apply at boot; nothing installed",
                         "pass --profile NAME")
    text = boot_rules.unit_text(exec_args=exec_args(name), environment=unit_environment())
    unit = boot_rules.unit_path()
    try:
        write_atomic(unit, text.encode())
    except PermissionError:
        raise PermissionDenied(f"cannot write {unit}: permission denied", "run it with sudo") from None
    except OSError as e:
        raise StateError(f"cannot write {unit}: {e.strerror}") from None
    print(f"wrote {unit}")
    _systemctl("daemon-reload")
    _systemctl("enable", boot_rules.UNIT_NAME)
    print(f"enabled: the profile{'' if name else 's'} will be applied at the next boot; boot with tuner.reset on the "
          "kernel command line to skip it")
    return exit_codes.OK


def run_uninstall(args, ctx) -> int:
    _require_root("removing the boot service")
    unit = boot_rules.unit_path()
    if not unit.exists():
        print(f"{unit} is not installed; nothing to do")
        return exit_codes.OK
    _systemctl("disable", boot_rules.UNIT_NAME)
    try:
        unit.unlink()
    except PermissionError:
        raise PermissionDenied(f"cannot remove {unit}: permission denied", "run it with sudo") from None
    _systemctl("daemon-reload")
    print(f"removed {unit}; the profiles in {paths.system_profiles_dir()} are kept")
    return exit_codes.OK


def _systemctl_state(verb: str) -> str | None:
    if not _live_systemd():
        return None
    proc = subprocess.run(["systemctl", verb, boot_rules.UNIT_NAME], capture_output=True, text=True, check=False)
    return proc.stdout.strip() or None


def run_status(args, ctx) -> int:
    unit = boot_rules.unit_path()
    exec_start = None
    if unit.exists():
        exec_start = next((line.removeprefix("ExecStart=") for line in unit.read_text().splitlines()
                           if line.startswith("ExecStart=")), None)
    profiles, bad = scan(system=True)
    doc = {
        "unit": str(unit),
        "installed": unit.exists(),
        "exec_start": exec_start,
        "enabled": _systemctl_state("is-enabled"),
        "active": _systemctl_state("is-active"),
        "system_profiles": [{"name": p.source.stem if p.source else p.name, "device": p.device.label,
                             "value": p.setting.value, "unit": p.setting.unit} for p in profiles],
        "invalid_profiles": [{"path": str(p), "error": why} for p, why in bad],
        "next_boot_skips": boot_rules.skip_reason(),
    }
    if args.json:
        print_json(doc)
        return exit_codes.OK
    print(f"unit        {unit} ({'installed' if doc['installed'] else 'not installed'})")
    if exec_start:
        print(f"runs        {exec_start}")
    if doc["enabled"] or doc["active"]:
        print(f"systemd     {doc['enabled'] or '?'}, {doc['active'] or '?'}")
    print(f"profiles    {paths.system_profiles_dir()}: " + (", ".join(
        f"{p['name']} ({p['device']}, {p['value']:+d} {p['unit']})" for p in doc["system_profiles"]) or "none"))
    for item in doc["invalid_profiles"]:
        print(f"  invalid   {item['error']}")
    print(f"next boot   {'skips: ' + doc['next_boot_skips'] if doc['next_boot_skips'] else 'applies'}")
    return exit_codes.OK
