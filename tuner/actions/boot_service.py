"""The apply-at-boot service: install, remove and status, for `tuner service` and the UI's Profiles screen.

The service is two systemd units (tuner.core.system_units): one runs `tuner apply --boot [NAME]` once per boot,
the other `tuner apply --boot --resume [NAME]` after each resume; both apply system profiles (in
/etc/tuner/profiles) to the cards they were proven on (tuner.actions.boot_apply). Installing copies the chosen
profile into the system store, writes the units and enables them; removing disables and deletes them and keeps the
profiles. Both need root (PermissionDenied otherwise). The units run this interpreter as root at every boot, so
installing refuses (UsageError, exit 2) when it, the package or any directory above them can be changed by a
user other than root (tuner.core.root_owned): an editable venv in someone's checkout would hand them root.

Nothing here prints: every function returns what it did in sentences a front end shows as they are.
systemctl is only run against the real unit directory (tests point TUNER_SYSTEMD_DIR elsewhere), and what
systemd alone knows (enabled, active, the last run's result) is None when it cannot be asked.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tuner.actions.boot_apply import last_run_doc, last_run_path, read_last_run
from tuner.actions.profile_apply import proven_card
from tuner.backends.base import Backend
from tuner.core import kernel_files, paths, root_owned, state_files, system_units
from tuner.core.atomic import write_atomic
from tuner.core.errors import PermissionDenied, StateError, TunerError, UsageError
from tuner.core.models import Knob
from tuner.profiles import Profile, load_profile, save_profile
from tuner.profiles import boot as boot_rules
from tuner.profiles.store import scan


class NoSystemProfiles(UsageError):
    """install() with no profile named and none in the system store: nothing would be applied at boot."""


@dataclass(frozen=True)
class BootServiceResult:
    """What install() or remove() did."""

    changed: bool  # False: there was nothing to do (remove() when no unit was installed)
    unit: Path
    profile: str | None = None  # install(): the profile applied at boot (None: every system profile)
    profile_path: Path | None = None  # install(): where that profile was copied in the system store
    messages: tuple[str, ...] = ()  # what was done, one sentence each, in order
    warnings: tuple[str, ...] = ()  # systemctl steps that failed (the unit file itself was written/removed)


@dataclass(frozen=True)
class SystemProfileInfo:
    """A profile in the system store, as the status shows it."""

    name: str  # its store name (the file's stem)
    cards: int  # 1, or a rig profile's number of cards
    summary: str  # "Simulated ... [SIMULATED], -45 mV" or "rig of 3 cards: -40, -55, -30 mV"

    @classmethod
    def of(cls, profile: Profile) -> SystemProfileInfo:
        if profile.is_rig:
            values = ", ".join(f"{p.setting.value:+d}" for p in profile.parts)
            units = sorted({p.setting.unit for p in profile.parts})
            return cls(profile.store_name, len(profile.parts),
                       f"rig of {len(profile.parts)} cards: {values} {'/'.join(units)}")
        s = profile.setting
        return cls(profile.store_name, 1, f"{profile.device.label}, {s.value:+d} {s.unit}")


@dataclass(frozen=True)
class LastBootRun:
    """What the last boot run recorded (tuner.actions.boot_apply): when, how it ended, and its log lines."""

    finished_at: float  # seconds since the epoch
    exit_code: int
    skipped: str | None  # why the whole boot was skipped, if it was
    lines: tuple[str, ...]
    simulated: bool = False  # a `--simulate apply --boot` run on simulated cards (its own record)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class CardState:
    """One part of a system profile against its card as it reads now (`tuner service status`)."""

    profile: str
    card: int | None  # the part's index in a rig profile
    device: str | None  # the card's id (None: not in this machine)
    label: str | None
    installed: int  # the profile's value
    unit: str
    found: int | None  # what the card reads now
    state: str  # "applied" | "not applied" | "changed" | "missing"
    why: str | None = None

    def text(self) -> str:
        """`changed since (-30 found, -50 installed)`, as the status prints it after the card."""
        if self.state == "applied":
            return f"applied as the profile says ({self.installed:+d} {self.unit})"
        if self.state == "changed":
            return (f"changed since ({self.found:+d} found, {self.installed:+d} installed): something other than "
                    "the boot service set it")
        if self.state == "missing":
            return f"missing: {self.why}"
        return (f"not applied ({self.why}): reads {self.found:+d} {self.unit}, the profile says {self.installed:+d} "
                f"{self.unit}")

    def to_dict(self) -> dict:
        return {**vars(self), "text": self.text()}


@dataclass(frozen=True)
class BootServiceStatus:
    unit: Path
    installed: bool
    enabled: str | None  # `systemctl is-enabled` ("enabled", "disabled", ...); None when systemd cannot be asked
    active: str | None  # `systemctl is-active`; None likewise
    profile: str | None  # the profile the unit applies (None: every system profile, or not installed)
    exec_start: str | None
    system_profiles: tuple[SystemProfileInfo, ...]
    invalid_profiles: tuple[tuple[Path, str], ...]  # (file, one-line reason)
    next_boot_skips: str | None  # why the next boot would apply nothing (tuner.reset, an open trial), else None
    last_run: LastBootRun | None = field(default=None)  # None: no boot run recorded on this machine
    last_run_unreadable: str | None = None  # where the unit records its runs, when this user may not read it
    cards: tuple[CardState, ...] = ()  # each system profile's part against its card (when a backend was given)
    cards_error: str | None = None  # why the cards could not be read

    def to_dict(self) -> dict:
        last = self.last_run
        return {
            "unit": str(self.unit), "installed": self.installed, "enabled": self.enabled, "active": self.active,
            "profile": self.profile, "exec_start": self.exec_start,
            "system_profiles": [asdict(p) for p in self.system_profiles],
            "invalid_profiles": [{"path": str(p), "error": why} for p, why in self.invalid_profiles],
            "next_boot_skips": self.next_boot_skips,
            "last_run": None if last is None else {**asdict(last), "lines": list(last.lines)},
            "last_run_unreadable": self.last_run_unreadable,
            "cards": [c.to_dict() for c in self.cards], "cards_error": self.cards_error,
        }


def _is_root() -> bool:
    return os.geteuid() == 0


def _require_root(what: str) -> None:
    if not _is_root():
        raise PermissionDenied(f"{what} needs root (it writes {boot_rules.systemd_dir()})", "run it with sudo")


def _live_systemd() -> bool:
    """Only talk to systemctl when writing the real unit directory (tests point TUNER_SYSTEMD_DIR elsewhere)."""
    return "TUNER_SYSTEMD_DIR" not in os.environ and shutil.which("systemctl") is not None


def _systemctl(messages: list[str], warnings: list[str], *args: str) -> None:
    if not _live_systemd():
        messages.append(f"(not run here: systemctl {' '.join(args)})")
        return
    proc = subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        warnings.append(f"systemctl {' '.join(args)} failed: {proc.stderr.strip()}")


def install_code() -> tuple[list[Path], list[Path]]:
    """What the units would run as root (tuner.core.root_owned.import_code); tests replace it."""
    return root_owned.import_code()


def refuse_user_writable_code() -> None:
    """UsageError (one line naming the path) when a non-root user can change what the units would run."""
    code, package = install_code()
    found = root_owned.first_writable(code, recursive=package)
    if found is not None:
        path, why = found
        raise UsageError(f"refusing to install the boot service: {path} is {why}, and the service would run it as "
                         "root at every boot (whoever can change it would get root); nothing installed",
                         "install the tuner system-wide and root-owned with `sudo bash scripts/install-system.sh`, "
                         "then run /usr/local/bin/tuner service install")


def refuse_simulated(profile: Profile) -> None:
    """A profile proven on a SIMULATED card (any part of a rig) never goes into the real boot path: UsageError.
    Checked before anything is written, root or not (a simulated session run as root once installed a real unit
    in /etc for a simulated profile)."""
    if any(p.device.simulated for p in profile.parts):
        raise UsageError(f"profile {profile.name!r} was measured on a SIMULATED card, and the boot service applies "
                         "profiles to real cards at every boot: nothing installed",
                         "bisect the real card and install the boot service for that profile")


def check_installable(profile: Profile | None, *, simulated_session: bool = False) -> None:
    """Raise the UsageError `install` would for this profile (None: every system profile) in this session, before
    anything is asked or written: a simulated session, or a profile measured on a SIMULATED card. The UI asks it
    before it offers `b` (it once asked for confirmation, then refused)."""
    if simulated_session:
        raise UsageError("the boot service applies profiles to this machine's real cards at every boot, and this "
                         "session runs on SIMULATED cards: nothing installed",
                         "run `tuner service install --profile NAME` without --simulate, with a profile proven "
                         "on a real card")
    if profile is not None:
        refuse_simulated(profile)


def refuse_a_state_folder_root_refuses() -> None:
    """As root: UsageError (one line) when the state folder the units would pin (`pinned_environment`) is one root
    will not write in (`state_files`: another user's, a link they planted, below a folder they can change): every
    boot and resume run would refuse its card locks and apply nothing."""
    if os.geteuid() != 0:
        return
    state = paths.state_dir()
    try:
        state_files.check_dir(state)  # what exists of it, as the boot run checks it
        found = root_owned.first_writable([state])  # and above it, made or not
        problem = None if found is None else f"{state} is reached through {found[0]}, which is {found[1]}"
    except state_files.UnsafeStatePath as e:
        problem = f"{e.path} {e.problem}"
    if problem is not None:
        raise UsageError(f"refusing to install the boot service: {problem}, and the boot and resume units would keep "
                         "their card locks and records there as root, so they would apply nothing; nothing installed",
                         "install from a root shell (`sudo -i`) or with XDG_STATE_HOME unset, so that root's own "
                         "state folder is pinned")


def install(profile_name: str | None = None, *, overwrite: bool = False,
            simulated_session: bool = False) -> BootServiceResult:
    """Write and enable the unit (root). `profile_name` (a store name or a path): copy that profile, single-card
    or rig, to the system store and apply only it at boot; None: apply every system profile (refused when
    there are none). `overwrite` replaces a system profile of the same name. `simulated_session`: the caller
    runs on simulated cards (--simulate, the UI's simulated backend): refused, as is a profile measured on a
    simulated card (`refuse_simulated`): the unit acts on the real machine. Raises PermissionDenied, UsageError
    (no such profile, a simulated one, a name taken without `overwrite`; NoSystemProfiles) or StateError."""
    check_installable(None, simulated_session=simulated_session)  # before the profile is even read
    profile = load_profile(profile_name) if profile_name else None
    check_installable(profile)
    _require_root("installing the boot service")
    refuse_user_writable_code()
    boot_rules.refuse_user_writable_system_paths("install the boot service", "nothing installed")
    refuse_a_state_folder_root_refuses()
    messages: list[str] = []
    warnings: list[str] = []
    name = None
    copied = None
    if profile is not None:
        copied = save_profile(profile, overwrite=overwrite, system=True)
        name = profile.name
        messages.append(f"copied {profile.name!r} ({SystemProfileInfo.of(profile).summary}) to {copied}")
    elif not scan(system=True)[0]:
        raise NoSystemProfiles(f"there are no profiles in {paths.system_profiles_dir()} to apply at boot; nothing "
                               "installed", "choose a profile to apply at boot")
    env = system_units.pinned_environment()
    python = sys.executable  # the interpreter running now, so the units use this installation (a venv included)
    units = {boot_rules.systemd_dir() / file: text
             for file, text in system_units.apply_units(python, name, env).items()}
    state = Path(env["XDG_STATE_HOME"]) / "tuner"
    try:
        state.mkdir(parents=True, exist_ok=True)  # the units may write only there (ReadWritePaths): it must exist
        for unit, text in units.items():
            write_atomic(unit, text.encode())
            messages.append(f"wrote {unit}")
    except PermissionError as e:
        raise PermissionDenied(f"cannot write {e.filename}: permission denied", "run it with sudo") from None
    except OSError as e:
        raise StateError(f"cannot write {e.filename}: {e.strerror}") from None
    _systemctl(messages, warnings, "daemon-reload")
    _systemctl(messages, warnings, "enable", boot_rules.UNIT_NAME, boot_rules.RESUME_UNIT_NAME)
    messages.append(f"enabled: the profile{'' if name else 's'} will be applied at the next boot and after each "
                    "resume; boot with tuner.reset on the kernel command line to skip it")
    return BootServiceResult(True, boot_rules.unit_path(), name, copied, tuple(messages), tuple(warnings))


def remove() -> BootServiceResult:
    """Disable and delete the unit (root); the system profiles are kept. Nothing to do is not an error."""
    _require_root("removing the boot service")
    unit = boot_rules.unit_path()
    present = [u for u in (unit, boot_rules.resume_unit_path()) if u.exists()]
    if not present:
        return BootServiceResult(False, unit, messages=(f"{unit} is not installed; nothing to do",))
    messages: list[str] = []
    warnings: list[str] = []
    _systemctl(messages, warnings, "disable", *(u.name for u in present))
    for path in present:
        try:
            path.unlink(missing_ok=True)
        except PermissionError:
            raise PermissionDenied(f"cannot remove {path}: permission denied", "run it with sudo") from None
    _systemctl(messages, warnings, "daemon-reload")
    messages.append(f"removed {', '.join(str(u) for u in present)}; the profiles in {paths.system_profiles_dir()} "
                    "are kept")
    return BootServiceResult(True, unit, messages=tuple(messages), warnings=tuple(warnings))


def _systemctl_state(verb: str) -> str | None:
    if not _live_systemd():
        return None
    proc = subprocess.run(["systemctl", verb, boot_rules.UNIT_NAME], capture_output=True, text=True, check=False)
    return proc.stdout.strip() or None


def _profile_of(exec_start: str | None) -> str | None:
    """The profile named after `apply --boot` in the unit's command line (None: every system profile)."""
    try:
        words = shlex.split((exec_start or "").replace("%%", "%"))
    except ValueError:  # an unbalanced quote: someone edited the unit by hand
        return None
    if "--boot" in words:
        rest = words[words.index("--boot") + 1:]
        return rest[0] if rest else None
    return None


def pinned_state_dir(unit_text: str) -> Path | None:
    """The tuner's state folder the unit pins (`Environment=XDG_STATE_HOME=...`, system_units.pinned_environment):
    where its runs record themselves (root's, with `sudo tuner service install`), not whoever asks."""
    for line in unit_text.splitlines():
        if line.startswith("Environment="):
            try:
                words = shlex.split(line.removeprefix("Environment="))
            except ValueError:  # an unbalanced quote: someone edited the unit by hand
                continue
            for word in words:
                if word.startswith("XDG_STATE_HOME="):
                    return Path(word.removeprefix("XDG_STATE_HOME=").replace("%%", "%")) / "tuner"
    return None


def _last_run(simulated: bool, state_dir: Path | None) -> tuple[LastBootRun | None, str | None]:
    """The last boot run (the unit's own record, in the state folder it pins; a simulated run's in this user's),
    or where it is when this user may not read it."""
    path = last_run_path(simulated, None if simulated else state_dir)
    try:
        doc = last_run_doc(path)
    except PermissionError:
        return None, (f"recorded in {path}, which only root can read: `sudo tuner service status`")
    if doc is None:
        return None, None
    try:
        return LastBootRun(float(doc["finished_at"]), int(doc["exit_code"]), doc.get("skipped"),
                           tuple(str(line) for line in doc.get("lines", [])), simulated), None
    except (KeyError, TypeError, ValueError):
        return None, None


def status(backend: Backend | None = None, *, simulated: bool = False,
           backend_error: str | None = None) -> BootServiceStatus:
    """Is the unit installed and enabled, which profile it applies, what the next boot would do, how the last
    boot run ended (`simulated`: the last `--simulate` boot run, labelled so), and (with a backend: real cards, or
    simulated ones for --simulate) what each card reads against its system profile. Reads only; needs no root."""
    unit = boot_rules.unit_path()
    exec_start = None
    state_dir = None
    installed = unit.exists()
    if installed:
        try:
            text = unit.read_text()
        except OSError:
            text = ""
        exec_start = next((line.removeprefix("ExecStart=") for line in text.splitlines()
                           if line.startswith("ExecStart=")), None)
        state_dir = pinned_state_dir(text)
    profiles, bad = scan(system=True)
    skips = boot_rules.skip_reason()
    applies = _profile_of(exec_start)
    cards: tuple[CardState, ...] = ()
    if backend is not None:
        chosen = [p for p in profiles if applies is None or (p.source and p.source.stem == applies)]
        try:
            cards = tuple(card_states(backend, chosen, installed=installed, skips=skips, simulated=simulated,
                                      state_dir=state_dir))
        except TunerError as e:  # a card that cannot be read is when the status is asked for: the rest still shows
            backend_error = e.one_line()
    last_run, unreadable = _last_run(simulated, state_dir)
    return BootServiceStatus(
        unit=unit, installed=installed, enabled=_systemctl_state("is-enabled"), active=_systemctl_state("is-active"),
        profile=applies, exec_start=exec_start,
        system_profiles=tuple(SystemProfileInfo.of(p) for p in profiles), invalid_profiles=tuple(bad),
        next_boot_skips=skips, last_run=last_run, last_run_unreadable=unreadable, cards=cards,
        cards_error=backend_error,
    )


def card_states(backend: Backend, profiles: list[Profile], *, installed: bool,
                skips: str | None, simulated: bool = False, state_dir: Path | None = None) -> list[CardState]:
    """Each part against the card it was proven on, as that card reads now (against the last boot run of the
    same kind: the machine's, or the simulated cards')."""
    run = read_last_run(simulated, None if simulated else state_dir) or {}
    this_boot = kernel_files.same_boot(run.get("boot_id"), kernel_files.boot_id())
    results = _recorded_results(run)
    devices = backend.devices()
    out = []
    for profile in profiles:
        name = profile.store_name
        for index, part in enumerate(profile.parts):
            card = index if profile.is_rig else None
            setting = part.setting
            device = proven_card(part, devices, backend)
            if device is None:
                waited = run.get("waited_s") if this_boot else None
                waited = waited if isinstance(waited, int | float) and not isinstance(waited, bool) else None
                missing = "its card is not in this machine" + (
                    f" (the boot waited {waited:g} s for it, then applied the others)" if waited is not None else "")
                out.append(CardState(name, card, None, None, setting.value, setting.unit, None, "missing", missing))
                continue
            knob = backend.knob(device.id)
            state, why = _compare(knob, setting.value, setting.lock_clock_mhz)
            if state == "not applied":
                why = _why_not_applied(installed, skips, run, this_boot, results.get((profile.name, card)))
            out.append(CardState(name, card, device.id, device.label, setting.value, setting.unit, knob.current,
                                 state, why))
    return out


def _recorded_results(run: dict) -> dict[tuple[str | None, int | None], dict]:
    """The last run's per-card results by (profile, card); the record is a file, so an entry of another shape (a
    hand edit, another version's) is left out rather than trusted."""
    listed = run.get("results")
    return {(r.get("profile"), r.get("card")): r for r in (listed if isinstance(listed, list) else [])
            if isinstance(r, dict) and isinstance(r.get("profile"), str | None)
            and (r.get("card") is None or (isinstance(r.get("card"), int) and not isinstance(r.get("card"), bool)))}


def _compare(knob: Knob, value: int, lock_mhz: int | None) -> tuple[str, str | None]:
    if knob.current == value:
        if lock_mhz is not None and knob.lock_clock_mhz is not None and knob.lock_clock_mhz != lock_mhz:
            return "changed", f"locked at {knob.lock_clock_mhz} MHz, the profile at {lock_mhz} MHz"
        return "applied", None
    if knob.current == knob.stock:
        return "not applied", None
    return "changed", None


def _why_not_applied(installed: bool, skips: str | None, run: dict, this_boot: bool, result: dict | None) -> str:
    if not installed:
        return "the boot service is not installed: `sudo tuner service install`"
    if skips:
        return f"the boot skips it: {skips}"
    if not run:
        return "the boot service has not run yet"
    if not this_boot:
        return "the boot service has not run in this boot (see `journalctl -u tuner-apply`)"
    if run.get("skipped"):
        return f"this boot skipped it: {run['skipped']}"
    if result and result.get("status") != "applied":
        return f"this boot did not: {result.get('reason') or result.get('status')}"
    return ("it was applied this boot and reads stock since: a driver reset, `tuner reset`, or a resume without the "
            "resume unit")


__all__ = ["BootServiceResult", "BootServiceStatus", "CardState", "LastBootRun", "NoSystemProfiles",
           "SystemProfileInfo", "install", "remove", "status"]
