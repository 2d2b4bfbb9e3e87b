"""scripts/install-system.sh: --dry-run prints every file it would write and the torch build for each vendor's
fake sysfs tree (and writes nothing); the vendor rule (tuner.core.torch_build); --uninstall refuses while a bisect
runs (tuner.actions.system_install)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.actions import system_install
from tuner.core import system_units, torch_build
from tuner.core.card_lock import CardLock

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts/install-system.sh"


def fake_tree(root: Path, *vendors: str) -> Path:
    for i, vendor in enumerate(vendors):
        (root / f"sys/class/drm/card{i}/device").mkdir(parents=True)
        (root / f"sys/class/drm/card{i}/device/vendor").write_text(f"{vendor}\n")
        (root / f"sys/class/drm/card{i}-DP-1").mkdir()  # a connector: never a card
    (root / "sys/class/drm").mkdir(parents=True, exist_ok=True)
    return root


def dry_run(tmp_path: Path, *vendors: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "TUNER_SYSFS_ROOT": str(fake_tree(tmp_path / "root", *vendors)),
                   "TUNER_SYSTEMD_DIR": str(tmp_path / "systemd"), "TUNER_PREFIX": str(tmp_path / "opt/tuner"),
                   "TUNER_BIN_DIR": str(tmp_path / "bin"), "PYTHON": sys.executable, **env}
    environment.pop("TUNER_TORCH", None) if "TUNER_TORCH" not in env else None
    return subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=environment,
                          timeout=120)


@pytest.mark.parametrize(("vendors", "build", "index"), [
    (("0x10de",), "cuda (NVIDIA card at card0) from PyPI", None),
    (("0x1002", "0x1002"), "rocm (AMD cards at card0, card1) from https://download.pytorch.org/whl/rocm", None),
    (("0x8086",), "cpu (no NVIDIA or AMD card found) from https://download.pytorch.org/whl/cpu", None),
    ((), "cpu (no NVIDIA or AMD card found)", None),
])
def test_dry_run_names_the_build_and_every_file_and_writes_nothing(tmp_path, vendors, build, index):
    proc = dry_run(tmp_path, *vendors)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"install-system.sh: torch build: {build}" in out
    for unit in system_units.UNIT_NAMES:
        assert f"would write: {tmp_path}/systemd/{unit}" in out
        assert f"# {tmp_path}/systemd/{unit}\n" in out  # and its text
    for path in (f"{tmp_path}/opt/tuner/", f"{tmp_path}/bin/tuner -> {tmp_path}/opt/tuner/bin/tuner"):
        assert f"would write: {path}" in out
    assert f"ExecStart={tmp_path}/opt/tuner/bin/tuner-helper --group tuner --state-dir /var/lib/tuner" in out
    assert not (tmp_path / "systemd").exists() and not (tmp_path / "opt").exists() and not (tmp_path / "bin").exists()


def test_tuner_torch_overrides_and_two_vendors_need_a_choice(tmp_path):
    proc = dry_run(tmp_path, "0x10de", TUNER_TORCH="cpu")
    assert "torch build: cpu (TUNER_TORCH=cpu)" in proc.stdout
    (tmp_path / "root").rename(tmp_path / "old")
    proc = dry_run(tmp_path, "0x10de", "0x1002")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "TUNER_TORCH=cuda or TUNER_TORCH=rocm" in proc.stderr
    with pytest.raises(torch_build.BuildChoiceError, match="names no torch build"):
        torch_build.needed_build(tmp_path, {"TUNER_TORCH": "cuda12"})


def test_installed_build_from_the_doctors_probe():
    assert torch_build.installed_build({"torch": "2.13.0", "cuda": "12.8"}) == "cuda"
    assert torch_build.installed_build({"torch": "2.13.0", "hip": "7.2", "cuda": None}) == "rocm"
    assert torch_build.installed_build({"torch": "2.13.0+cpu"}) == "cpu"
    assert torch_build.installed_build({"torch": None, "error": "No module named 'torch'"}) is None


def test_uninstall_refuses_while_a_bisect_runs():
    assert system_install.is_bisect(["/usr/local/bin/tuner", "--simulate", "bisect", "--device", "sim0"])
    assert system_install.is_bisect(["/opt/undervolt-tuner/bin/python", "-m", "tuner", "bisect"])
    assert not system_install.is_bisect(["/usr/local/bin/tuner", "status"])
    assert not system_install.is_bisect(["grep", "bisect"])
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "tuner", "bisect"])
    try:
        def ours():  # this machine may run other bisects: look at ours alone
            return [p for p in system_install._processes() if p[0] == proc.pid]

        deadline = time.monotonic() + 30
        while system_install.busy(ours(), state_dirs=[]) is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert f"a bisect is in progress (pid {proc.pid}" in system_install.busy(ours(), state_dirs=[])
        run = subprocess.run([sys.executable, "-m", "tuner.actions.system_install", "--check-idle"],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
        assert run.returncode == 6 and len(run.stderr.strip().splitlines()) == 1
        assert "nothing was removed" in run.stderr
    finally:
        proc.kill()
        proc.wait()


def test_a_held_card_lock_counts_as_in_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert system_install.busy(processes=[], state_dirs=[tmp_path / "tuner"]) is None
    with CardLock("sim0", "tuner bisect --device sim0"):
        # another process's view: flock refuses a second open file description
        held = system_install.busy(processes=[], state_dirs=[tmp_path / "tuner"])
    assert held is not None and "tuner bisect --device sim0" in held


def test_a_fifo_or_a_link_planted_as_a_lock_file_neither_hangs_nor_is_followed(tmp_path):
    """`--check-idle` runs as root over every home's lock directory: a FIFO a user planted there must not hang the
    uninstall (an open for reading waits for a writer), and a link must not make root read its target."""
    locks = tmp_path / "tuner" / "locks"
    locks.mkdir(parents=True)
    os.mkfifo(locks / "planted.lock")
    secret = tmp_path / "secret"
    secret.write_text("root's secret\n")
    (locks / "link.lock").symlink_to(secret)
    held = os.open(secret, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # a file someone holds a flock on: followed, root would print its text
    code = ("import sys, pathlib; from tuner.actions import system_install as s; "
            "print(s.busy(processes=[], state_dirs=[pathlib.Path(sys.argv[1])]))")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tuner")], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    os.close(held)
    assert (run.returncode, run.stdout.strip()) == (0, "None"), run.stderr


def _install_environment(tmp_path: Path, group: str, python: Path) -> dict:
    """An install into `tmp_path` (a fake sysfs, its own prefix, bin, units and system profiles), with `group`
    and the `python` stand-in."""
    return {**os.environ, "TUNER_SYSFS_ROOT": str(fake_tree(tmp_path / "root")), "TUNER_TORCH": "cpu",
            "TUNER_SYSTEMD_DIR": str(tmp_path / "systemd"), "TUNER_PREFIX": str(tmp_path / "opt/tuner"),
            "TUNER_BIN_DIR": str(tmp_path / "bin"), "TUNER_SYSTEM_PROFILES": str(tmp_path / "profiles"),
            "TUNER_GROUP": group, "PYTHON": str(python)}


def uninstall(tmp_path: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "TUNER_SYSTEMD_DIR": str(tmp_path / "systemd"), "PYTHON": sys.executable,
                   "TUNER_PREFIX": str(tmp_path / "opt/tuner"), "TUNER_BIN_DIR": str(tmp_path / "bin")}
    return subprocess.run(["bash", str(SCRIPT), "--uninstall"], capture_output=True, text=True, env=environment,
                          timeout=120)


@pytest.mark.skipif(os.geteuid() != 0, reason="--uninstall needs root")
@pytest.mark.parametrize("other", ["file", "link"])
def test_uninstall_keeps_a_tuner_command_it_did_not_install(tmp_path, other):
    """The installer writes BIN_DIR/tuner as a link to PREFIX/bin/tuner; another program of that name (a file, or
    a link elsewhere) is not its to remove."""
    (tmp_path / "bin").mkdir()
    theirs = tmp_path / "bin/tuner"
    if other == "file":
        theirs.write_text("#!/bin/sh\necho another tuner\n")
    else:
        (tmp_path / "elsewhere").write_text("#!/bin/sh\n")
        theirs.symlink_to(tmp_path / "elsewhere")
    proc = uninstall(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert os.path.lexists(theirs)
    assert f"kept {theirs}" in proc.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="--uninstall needs root")
def test_uninstall_removes_its_own_link(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/tuner").symlink_to(tmp_path / "opt/tuner/bin/tuner")  # dangling: the venv is half gone
    proc = uninstall(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not os.path.lexists(tmp_path / "bin/tuner")


@pytest.mark.skipif(os.geteuid() != 0, reason="the install needs root (it runs groupadd for real)")
def test_an_install_that_fails_before_its_venv_leaves_no_group_that_uninstall_would_not_remove(tmp_path):
    """`--uninstall` removes the group only where `PREFIX/.created-group` says the install made it. A first install
    whose venv cannot be made (Debian without python3-venv) must not leave a group without that mark: the run
    after the fix would find the group there, not mark it, and the uninstall would leave it behind for good."""
    import grp
    import secrets

    group = f"tunertest{secrets.token_hex(3)}"
    python = tmp_path / "python3"  # the real interpreter, but `-m venv` fails as it does without python3-venv
    python.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = venv ] && {{ echo "ensurepip is not available" >&2; '
                      f'exit 1; }}; done\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    environment = _install_environment(tmp_path, group, python)
    try:
        proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=environment, timeout=120)
        assert proc.returncode != 0 and "ensurepip" in proc.stderr
        made = any(g.gr_name == group for g in grp.getgrall())
        assert not made or (tmp_path / "opt/tuner/.created-group").exists(), "group made, and not marked as made"
    finally:
        if any(g.gr_name == group for g in grp.getgrall()):
            subprocess.run(["groupdel", group], check=True, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="the install needs root")
def test_install_refuses_to_replace_a_tuner_command_it_did_not_write(tmp_path):
    """`ln -sfn` would replace another program's BIN_DIR/tuner without a word: the install refuses first (exit 2,
    one line naming it), before the group or the venv is made."""
    import grp
    import secrets

    (tmp_path / "bin").mkdir()
    theirs = tmp_path / "bin/tuner"
    theirs.write_text("#!/bin/sh\necho another tuner\n")
    group = f"tunertest{secrets.token_hex(3)}"
    python = tmp_path / "python3"  # an install that got past the check stops at its venv, before pip or the network
    python.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = venv ] && exit 1; done\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    environment = _install_environment(tmp_path, group, python)
    try:
        for args in ([], ["--dry-run"]):
            proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=environment,
                                  timeout=120)
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            assert len(proc.stderr.strip().splitlines()) == 1 and f"{theirs} is not" in proc.stderr
            assert theirs.read_text() == "#!/bin/sh\necho another tuner\n"
            assert not (tmp_path / "opt").exists() and not (tmp_path / "systemd").exists()
            assert not any(g.gr_name == group for g in grp.getgrall())
    finally:
        if any(g.gr_name == group for g in grp.getgrall()):
            subprocess.run(["groupdel", group], check=True, timeout=60)


def _systemd_stand_in(tmp_path: Path, reset_exit: int) -> tuple[dict, Path]:
    """A machine where systemd runs (its run directory, a `systemctl` on PATH that logs its arguments) and an
    installed venv whose `tuner reset --all` exits `reset_exit` (its `python` answers the idle check)."""
    run_dir = tmp_path / "run-systemd"
    run_dir.mkdir()
    log = tmp_path / "calls"
    fake_bin = tmp_path / "fake-bin"
    fake_bin.mkdir()
    (fake_bin / "systemctl").write_text(f'#!/bin/sh\necho "systemctl $*" >> {log}\n')
    venv_bin = tmp_path / "opt/tuner/bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "tuner").write_text(f'#!/bin/sh\necho "tuner $*" >> {log}\nexit {reset_exit}\n')
    (venv_bin / "python").write_text("#!/bin/sh\nexit 0\n")  # --check-idle: no bisect runs
    for f in (fake_bin / "systemctl", venv_bin / "tuner", venv_bin / "python"):
        f.chmod(0o755)
    environment = {**os.environ, "TUNER_SYSTEMD_DIR": str(tmp_path / "systemd"), "PYTHON": sys.executable,
                   "TUNER_PREFIX": str(tmp_path / "opt/tuner"), "TUNER_BIN_DIR": str(tmp_path / "bin"),
                   "TUNER_SYSTEMD_RUN_DIR": str(run_dir), "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    return environment, log


@pytest.mark.skipif(os.geteuid() != 0, reason="--uninstall needs root")
def test_an_uninstall_whose_reset_fails_leaves_the_units_enabled_and_the_helper_listening(tmp_path):
    """`--uninstall` says "nothing was removed" when the cards cannot be reset (exit 5): the boot and resume units
    must then still be enabled (they were disabled before the reset), and the helper's socket listening again."""
    environment, log = _systemd_stand_in(tmp_path, reset_exit=1)
    proc = subprocess.run(["bash", str(SCRIPT), "--uninstall"], capture_output=True, text=True, env=environment,
                          timeout=120)
    assert proc.returncode == 5 and "nothing was removed" in proc.stderr, proc.stderr
    calls = log.read_text().splitlines()
    assert not [c for c in calls if c.startswith("systemctl disable")], calls
    assert calls.index("tuner reset --all") < calls.index("systemctl start tuner-helper.socket"), calls
    assert (tmp_path / "opt/tuner/bin/tuner").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="--uninstall needs root")
def test_an_uninstall_stops_the_units_resets_then_disables_them(tmp_path):
    environment, log = _systemd_stand_in(tmp_path, reset_exit=0)
    proc = subprocess.run(["bash", str(SCRIPT), "--uninstall"], capture_output=True, text=True, env=environment,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    units = "tuner-helper.socket tuner-helper.service tuner-apply.service tuner-resume.service"
    assert calls[:3] == [f"systemctl stop {units}", "tuner reset --all", f"systemctl disable {units}"], calls
