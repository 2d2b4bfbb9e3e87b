"""The units of a system install (tuner.core.system_units): each passes `systemd-analyze verify`, carries its
sandbox and none of the options that would block a sysfs or NVML write; `tuner service install` refuses code a
user other than root can change (tuner.core.root_owned)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.profiles.helpers import AMD_KNOB, RX9070, tuner
from tuner.actions import boot_service
from tuner.core import root_owned, system_units
from tuner.profiles import boot, build_profile, save_profile

REPO = Path(__file__).resolve().parents[2]
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed here")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def verify(path: Path) -> subprocess.CompletedProcess:
    """`systemd-analyze verify`: any line it prints is a finding (an unknown key is only a warning)."""
    return subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(path)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def prefix(tmp_path) -> Path:
    """An install prefix whose bin/python and bin/tuner-helper exist (verify checks ExecStart is executable)."""
    bin_dir = tmp_path / "opt/undervolt-tuner/bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    helper = bin_dir / "tuner-helper"
    helper.write_text("#!/bin/sh\nexit 0\n")
    helper.chmod(0o755)
    return bin_dir.parent


@needs_analyze
def test_every_unit_of_a_system_install_passes_systemd_analyze_verify(tmp_path, prefix):
    out = tmp_path / "units"
    out.mkdir()
    assert system_units.main(["--write", str(out), "--prefix", str(prefix)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(system_units.UNIT_NAMES)
    for unit in out.iterdir():
        proc = verify(unit)
        assert proc.returncode == 0 and not proc.stderr.strip() and not proc.stdout.strip(), (unit.name, proc)


@needs_analyze
def test_verify_would_catch_a_broken_unit(tmp_path, prefix):
    """The check above can fail: an unknown key and a missing interpreter are both reported."""
    text = system_units.system_units(str(prefix))[system_units.APPLY_UNIT]
    bad = tmp_path / "tuner-apply.service"
    bad.write_text(text.replace("NoNewPrivileges=yes", "NoNewPrivilege=yes"))
    assert "NoNewPrivilege" in verify(bad).stderr
    bad.write_text(text.replace(str(prefix), "/nonexistent"))
    assert verify(bad).returncode != 0


def _section(text: str, name: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(f"[{name}]") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("[")), len(lines))
    return [line for line in lines[start:end] if line and not line.startswith("#")]


@pytest.mark.parametrize("unit", [system_units.APPLY_UNIT, system_units.RESUME_UNIT,
                                  system_units.HELPER_SERVICE_UNIT])
def test_each_root_unit_carries_its_sandbox_and_nothing_that_blocks_a_sysfs_or_nvml_write(unit):
    service = _section(system_units.system_units()[unit], "Service")
    for line in system_units.HARDENING:
        assert line in service, line
    keys = {line.split("=", 1)[0] for line in service}
    for blocked, why in system_units.NOT_USED.items():
        assert blocked not in keys, why
    assert "RestrictAddressFamilies=AF_UNIX" in service and "ProtectHome=read-only" in service
    bounding = next(line for line in service if line.startswith("CapabilityBoundingSet="))
    assert "CAP_SYS_ADMIN" in bounding and "CAP_SYS_MODULE" not in bounding
    if unit == system_units.HELPER_SERVICE_UNIT:  # it streams the kernel log
        assert "ProtectKernelLogs=yes" not in service and "CAP_SYSLOG" in bounding
    else:
        assert "ProtectKernelLogs=yes" in service and "CAP_SYSLOG" not in bounding
        timeout = next(int(line.split("=")[1]) for line in service if line.startswith("TimeoutStartSec="))
        assert 0 < timeout <= system_units.BOOT_TIMEOUT_S


def test_the_boot_unit_never_holds_the_boot_and_the_resume_unit_runs_at_every_resume():
    units = system_units.system_units(environment={"XDG_STATE_HOME": "/root/.local/state"})
    boot_unit = units[system_units.APPLY_UNIT]
    assert "DefaultDependencies=no" in _section(boot_unit, "Unit")  # multi-user.target is not ordered after it
    assert "ReadWritePaths=-/root/.local/state/tuner" in boot_unit
    assert "ExecStart=/opt/undervolt-tuner/bin/python -P -m tuner apply --boot\n" in boot_unit
    resume = units[system_units.RESUME_UNIT]
    targets = " ".join(system_units.SLEEP_TARGETS)
    assert f"WantedBy={targets}" in _section(resume, "Install")
    assert any(line.startswith(f"After={targets}") for line in _section(resume, "Unit"))
    assert "RemainAfterExit=yes" not in resume  # a unit that stayed active would not run at the next resume
    assert "apply --boot --resume\n" in resume
    socket = units[system_units.HELPER_SOCKET_UNIT]
    assert _section(socket, "Socket")[:4] == ["ListenStream=/run/tuner/helper.sock", "SocketMode=0660",
                                              "SocketUser=root", "SocketGroup=tuner"]
    assert ("ExecStart=/opt/undervolt-tuner/bin/tuner-helper --group tuner --state-dir /var/lib/tuner"
            in units[system_units.HELPER_SERVICE_UNIT])


def test_the_units_render_from_the_checkout_with_the_standard_library_alone():
    """The installer's --dry-run runs this module with the system python3 before any venv exists: `-S` (no
    site-packages) must be enough, and nothing but the standard library and tuner.core may be imported."""
    code = ("import sys; from tuner.core import system_units, torch_build, root_owned; "
            "mods = {m.split('.')[0] for m in sys.modules}; "
            "print(sorted(m for m in mods - set(sys.stdlib_module_names) - {'tuner', '__main__'}))")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    proc = subprocess.run([sys.executable, "-S", "-m", "tuner.core.system_units", "--print"], capture_output=True,
                          text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "# /etc/systemd/system/tuner-helper.socket" in proc.stdout


# --- the root-owned check -------------------------------------------------------------------------------------


@needs_root
def test_a_user_owned_directory_above_the_code_is_named(tmp_path):
    code = tmp_path / "home/alice/venv/lib/site.py"
    code.parent.mkdir(parents=True)
    code.write_text("")
    os.chown(tmp_path / "home/alice", 65534, 65534)
    path, why = root_owned.first_writable([code])
    assert path == tmp_path / "home/alice" and why.startswith("owned by uid 65534")


@needs_root
def test_a_user_owned_directory_above_a_linked_directory_on_the_codes_path_is_named(tmp_path):
    """`/opt/undervolt-tuner` a link to a root-owned tree inside alice's home: alice can rename that tree and put
    her own in its place, so her home is above the code. Only a link at the end of the path was followed; one
    in the middle was not, and alice's home was never looked at."""
    tree = tmp_path / "home/alice/tuner"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin/python").write_text("")
    os.chown(tmp_path / "home/alice", 65534, 65534)
    (tmp_path / "opt").mkdir()
    (tmp_path / "opt/undervolt-tuner").symlink_to(tree)
    path, why = root_owned.first_writable([tmp_path / "opt/undervolt-tuner/bin/python"])
    assert path == tmp_path / "home/alice" and why.startswith("owned by uid 65534")


@needs_root
def test_a_link_inside_the_package_to_a_users_file_is_named(tmp_path):
    """A module of the package that is a (root-owned) link to a file in alice's home runs her code as root: the
    walk below the package looked at the link itself, whose own owner and mode mean nothing, never at its
    target."""
    package = tmp_path / "opt/tuner"
    package.mkdir(parents=True)
    alices = tmp_path / "home/alice/mod.py"
    alices.parent.mkdir(parents=True)
    alices.write_text("")
    os.chown(alices, 65534, 65534)
    (package / "mod.py").symlink_to(alices)
    path, why = root_owned.first_writable([], recursive=[package])
    assert path == alices and why.startswith("owned by uid 65534")


def test_group_and_world_writable_code_is_named_but_a_sticky_directory_above_it_is_not(tmp_path):
    top = tmp_path / "sticky"
    top.mkdir()
    top.chmod(0o1777)
    package = top / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "sub/mod.py").write_text("")
    owned_by_others = os.geteuid() != 0  # as a user, the tree is the user's: named at the first step
    found = root_owned.first_writable([], recursive=[package])
    if owned_by_others:
        assert found is not None and "owned by" in found[1]
        return
    assert found is None
    (package / "sub/mod.py").chmod(0o666)
    assert root_owned.first_writable([], recursive=[package]) == (package / "sub/mod.py", "writable by everyone")
    (package / "sub/mod.py").chmod(0o644)
    (package / "sub").chmod(0o775)
    os.chown(package / "sub", 0, 100)
    assert root_owned.first_writable([], recursive=[package]) == (package / "sub", "writable by group 100")
    (package / "sub").chmod(0o755)
    package.chmod(0o1777)  # sticky is fine above the code, not as the code's own directory
    assert root_owned.first_writable([], recursive=[package]) == (package, "writable by everyone")


def _real_profile(name: str = "mine"):
    return save_profile(build_profile(name, RX9070, AMD_KNOB, -45, kernel="6.14.0-test"))


@needs_root
def test_service_install_from_a_venv_owned_by_a_user_exits_2_naming_it(tmp_path):
    """A real venv (its python a link to this one, the tuner and its packages reached through a .pth), owned by
    uid 65534: `tuner service install` run from it refuses in one line and writes nothing."""
    venv = tmp_path / "home/alice/venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "tuner-dev.pth").write_text(f"{REPO}\n{sysconfig.get_paths()['purelib']}\n")
    for dirpath, dirnames, filenames in os.walk(venv):
        for name in (*dirnames, *filenames):
            os.lchown(Path(dirpath) / name, 65534, 65534)
    os.chown(venv, 65534, 65534)
    _real_profile("mine")  # (a subprocess: the real check, not the tests' root-owned stand-in)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(venv / "bin/python"), "-m", "tuner", "service", "install", "--profile", "mine"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert f"{venv} is owned by uid 65534" in proc.stderr and "nothing installed" in proc.stderr
    assert not boot.unit_path().exists() and not boot.resume_unit_path().exists()


@needs_analyze
def test_a_root_owned_install_writes_units_that_pass_verify(capsys, monkeypatch):
    monkeypatch.setattr(boot_service, "_is_root", lambda: True)
    _real_profile("mine")
    code, _out, err = tuner(capsys, "service", "install", "--profile", "mine")
    assert code == 0, err
    for unit in (boot.unit_path(), boot.resume_unit_path()):
        assert f"ExecStart={sys.executable} -P -m tuner apply --boot" in unit.read_text()
        proc = verify(unit)
        assert proc.returncode == 0 and not proc.stderr.strip(), proc
    code, _out, _err = tuner(capsys, "service", "uninstall")
    assert code == 0 and not boot.unit_path().exists() and not boot.resume_unit_path().exists()


def _a_profiles_folder_a_user_can_write(monkeypatch, tmp_path) -> Path:
    """TUNER_SYSTEM_PROFILES at a folder owned by uid 65534 (nobody), as an installer's environment may hold."""
    folder = tmp_path / "home/alice/profiles"
    folder.mkdir(parents=True)
    os.chown(folder, 65534, 65534)
    monkeypatch.setenv("TUNER_SYSTEM_PROFILES", str(folder))
    return folder


@needs_root
def test_service_install_refuses_a_system_profiles_folder_a_user_can_write(capsys, monkeypatch, tmp_path):
    """The units pinned the installer's TUNER_SYSTEM_PROFILES: the boot unit then read, as root, the profiles
    anyone owning that folder wrote. Refused in one line (exit 2), nothing copied, no unit written."""
    monkeypatch.setattr(boot_service, "_is_root", lambda: True)
    _real_profile("mine")
    folder = _a_profiles_folder_a_user_can_write(monkeypatch, tmp_path)
    code, _out, err = tuner(capsys, "service", "install", "--profile", "mine")
    assert code == 2, (err, boot.unit_path().exists() and boot.unit_path().read_text())
    assert len(err.strip().splitlines()) == 1 and f"{folder} is owned by uid 65534" in err, err
    assert not boot.unit_path().exists() and not boot.resume_unit_path().exists()
    assert list(folder.iterdir()) == []


@needs_root
def test_service_install_refuses_a_group_writable_folder_above_the_sysfs_root(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(boot_service, "_is_root", lambda: True)
    _real_profile("mine")
    above = tmp_path / "shared"
    (above / "sysroot").mkdir(parents=True)
    os.chown(above, 0, 100)
    above.chmod(0o775)
    monkeypatch.setenv("TUNER_SYSFS_ROOT", str(above / "sysroot"))
    code, _out, err = tuner(capsys, "service", "install", "--profile", "mine")
    assert code == 2 and f"{above} is writable by group 100" in err, err
    assert not boot.unit_path().exists()


@needs_root
def test_the_boot_run_refuses_to_read_profiles_from_a_folder_a_user_can_write(capsys, monkeypatch, tmp_path):
    """An edited unit (or an older install) naming such a folder: the boot run itself refuses, applies nothing."""
    from tests.profiles.helpers import sim, sim_profile

    folder = _a_profiles_folder_a_user_can_write(monkeypatch, tmp_path)
    save_profile(sim_profile("planted", value=-45), system=True)
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "--boot", "--boot-wait", "0")
    assert code == 2 and f"{folder} is owned by uid 65534" in err, err
    assert sim().knob("sim0").current == 0
