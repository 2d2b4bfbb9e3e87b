"""Other tools that write the same GPU settings, found by process name and by systemd unit.

LACT's daemon applies its own clocks, voltage offset and power cap (and re-applies them after resume); CoreCtrl's
helper writes whatever path under /sys its UI asks for; NVIDIA's nvidia-powerd moves the power limit under load
(Dynamic Boost). While one of them runs, a bisect may be measuring that tool's setting instead of its own, and a
setting applied at boot may be overwritten a second later. So:
- `tuner doctor` lists each one found and the files it may write;
- a bisect refuses to start while one may change the same card (exit 6, the tool named), unless
  `--ignore-other-tools` (or TUNER_IGNORE_OTHER_TOOLS=1) says to go on; what was ignored is kept for the profile's
  evidence (`tuning.other_tools`);
- `tuner set`, `tuner apply` (of a rig profile too) and the Tune screen's apply warn with `warnings_for` and go on:
  a person is there, sees the warning and confirms the value;
- the boot and resume units leave a card alone while such a tool runs (exit 6), so the two never fight over it.
A simulated card is never any other tool's. Nothing here writes anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.backends.base import Backend
from tuner.core import exit_codes
from tuner.core.errors import TunerError
from tuner.core.models import DeviceInfo

IGNORE_ENV = "TUNER_IGNORE_OTHER_TOOLS"


@dataclass(frozen=True)
class Tool:
    name: str  # as a person would search for it: the daemon's name
    product: str
    process_names: tuple[str, ...]  # comm (at most 15 characters) or the executable's base name
    units: tuple[str, ...]  # systemd units that run it
    vendors: frozenset[str]  # the cards it may change
    writes: str  # the files and calls it may write, in words
    command: tuple[str, ...] = ()  # an executable plus its first argument that is this tool (`lact daemon`)


TOOLS = (
    Tool("lactd", "LACT", ("lactd", "lact-daemon"), ("lactd.service",), frozenset({"amd", "nvidia"}),
         "pp_od_clk_voltage, power_dpm_force_performance_level, pp_power_profile_mode and the hwmon fan and "
         "power-cap files of AMD cards; NVML clock offsets, locked clocks and power limits of NVIDIA cards",
         command=("lact", "daemon")),
    Tool("corectrl_helper", "CoreCtrl", ("corectrl_helper",), (), frozenset({"amd"}),
         "any file under /sys its UI asks for: pp_od_clk_voltage, power_dpm_force_performance_level, "
         "pp_power_profile_mode, the hwmon fan and power-cap files"),
    Tool("nvidia-powerd", "NVIDIA Dynamic Boost", ("nvidia-powerd",), ("nvidia-powerd.service",),
         frozenset({"nvidia"}), "the GPU's power limit through the driver (Dynamic Boost), which moves the clock "
         "a trial runs at"),
)


@dataclass(frozen=True)
class Found:
    tool: Tool
    how: tuple[str, ...]  # "process 1234", "unit lactd.service active"

    def describe(self) -> str:
        """`lactd (LACT; process 1234)`."""
        return f"{self.tool.name} ({self.tool.product}; {', '.join(self.how)})"


class OtherToolRunning(TunerError):
    """Another tool may change the card this command would measure or set: nothing was changed."""

    exit_code = exit_codes.BUSY


Process = tuple[int, str, Sequence[str]]  # pid, name (comm), command line


def _processes() -> Iterable[Process]:
    import psutil

    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        info = proc.info
        yield info["pid"], info.get("name") or "", info.get("cmdline") or ()


def _systemd_running() -> bool:
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def _unit_active(unit: str) -> bool:
    try:
        return subprocess.run(["systemctl", "is-active", "--quiet", unit], timeout=5, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _unit_enabled(unit: str) -> bool:
    """`systemctl is-enabled`: started at boot (enabled, or enabled for this boot only); not static, masked or
    disabled (exit 0 covers static and others that no boot starts on their own)."""
    try:
        proc = subprocess.run(["systemctl", "is-enabled", unit], capture_output=True, text=True, timeout=5,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.stdout.strip() in ("enabled", "enabled-runtime")


def _is(tool: Tool, name: str, cmdline: Sequence[str]) -> bool:
    program = os.path.basename(cmdline[0]) if cmdline else ""
    if name in tool.process_names or program in tool.process_names:
        return True
    return bool(tool.command) and (program, *cmdline[1:2]) == tool.command


def detect(processes: Iterable[Process] | None = None,
           unit_active: Callable[[str], bool] | None = None, *, at_boot: bool = False,
           unit_enabled: Callable[[str], bool] | None = None) -> list[Found]:
    """Every known tool running now: by process (name or executable) and by active unit (when systemd runs).
    `at_boot` (the boot unit, which runs early): also a unit that is enabled but not started yet (LACT's
    lactd.service is ordered after multi-user.target), which would start a moment later and write over the card."""
    procs = list(_processes() if processes is None else processes)
    live = _systemd_running() if unit_active is None or (at_boot and unit_enabled is None) else False
    if unit_active is None and live:
        unit_active = _unit_active
    if at_boot and unit_enabled is None and live:
        unit_enabled = _unit_enabled
    found = []
    for tool in TOOLS:
        how = [f"process {pid}" for pid, name, cmdline in procs if _is(tool, name, cmdline)]
        for unit in tool.units:
            if unit_active is not None and unit_active(unit):
                how.append(f"unit {unit} active")
            elif at_boot and unit_enabled is not None and unit_enabled(unit):
                how.append(f"unit {unit} enabled, starts later in this boot")
        if how:
            found.append(Found(tool, tuple(how)))
    return found


def detect_for(devices: Iterable[DeviceInfo], *, at_boot: bool = False) -> list[Found]:
    """detect(), unless every one of these cards is simulated (nobody's: then no process scan)."""
    return [] if all(d.simulated for d in devices) else detect(at_boot=at_boot)


def affecting(backend: Backend, device_ids: Sequence[str], found: Sequence[Found]) -> dict[str, list[Found]]:
    """{card: the tools found that may change it}; a simulated card is nobody's."""
    out: dict[str, list[Found]] = {}
    for device_id in device_ids:
        device = backend.device(device_id)
        hits = [f for f in found if not device.simulated and device.vendor in f.tool.vendors]
        if hits:
            out[device_id] = hits
    return out


def ignore_requested() -> bool:
    return os.environ.get(IGNORE_ENV, "").strip().lower() in ("1", "yes", "true")


_ignored: dict[str, tuple[str, ...]] = {}  # card -> the tools a bisect of it went on beside (for its evidence)


def refuse_before_bisect(backend: Backend, device_ids: Sequence[str], *,
                         found: Sequence[Found] | None = None, ignore: bool | None = None) -> None:
    """OtherToolRunning (exit 6, one line naming the tool and what it writes) while a tool that may change one of
    these cards runs, unless `ignore` (default: --ignore-other-tools / TUNER_IGNORE_OTHER_TOOLS); then what was
    ignored is remembered for the profile's evidence (`ignored_for`)."""
    for device_id in device_ids:  # this bisect's evidence starts empty: not what an earlier one went on beside
        _ignored.pop(device_id, None)
    hits = affecting(backend, device_ids, detect_for(map(backend.device, device_ids)) if found is None else found)
    if not hits:
        return
    if ignore_requested() if ignore is None else ignore:
        for device_id, tools in hits.items():
            _ignored[device_id] = tuple(f.describe() for f in tools)
        return
    device_id, tools = next(iter(hits.items()))
    first = tools[0]
    raise OtherToolRunning(
        f"{first.describe()} is running and may write {device_id}'s settings ({first.tool.writes}), so a bisect "
        "would measure its setting, not the tuner's; nothing was changed",
        f"stop {first.tool.name} for the bisect (e.g. `sudo systemctl stop {(first.tool.units or ('it',))[0]}`), "
        "or pass --ignore-other-tools (recorded in the profile)")


def ignored_for(device_id: str) -> tuple[str, ...]:
    """The tools a bisect of this card went on beside in this process (--ignore-other-tools), for the profile."""
    return _ignored.get(device_id, ())


def warnings_for(backend: Backend, device_ids: Sequence[str], found: Sequence[Found] | None = None) -> list[str]:
    """What `tuner set` and `tuner apply` say before they write (they go on: a person confirms the value)."""
    hits = affecting(backend, device_ids, detect_for(map(backend.device, device_ids)) if found is None else found)
    return [f"{f.describe()} is running and may change {device_id} ({f.tool.writes}); it may overwrite this "
            "setting" for device_id, tools in hits.items() for f in tools]
