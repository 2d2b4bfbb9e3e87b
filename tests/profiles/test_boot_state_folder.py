"""What root writes in the state folder the boot and resume units pin (`XDG_STATE_HOME` of whoever installed):
a user who can change that folder, or a directory above it, must not steer root's writes (the card lock, the
last-run record, NVIDIA's applied-offset records) to a file outside it. Run as root, with a real throwaway user."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.profiles.helpers import sim, sim_profile, tuner
from tuner.core import paths
from tuner.profiles import save_profile

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("useradd"),
                                reason="needs root to make a throwaway user and act as it")


@pytest.fixture
def throwaway_user() -> Iterator[pwd.struct_passwd]:
    name = f"tunertest-rw{os.getpid() % 100000}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                    name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)  # gone with the user where USERGROUPS_ENAB is yes


@pytest.fixture
def users_state_home(throwaway_user, monkeypatch) -> Iterator[Path]:
    """An XDG_STATE_HOME the throwaway user owns (mode 0700, as `mkdir -p ~/.local/state` makes it), in a directory
    every account may reach (pytest's own are root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="tunertest-rw-"))
    try:
        top.chmod(0o755)
        state = top / "state"
        state.mkdir(mode=0o700)
        os.chown(state, throwaway_user.pw_uid, throwaway_user.pw_gid)
        monkeypatch.setenv("XDG_STATE_HOME", str(state))
        yield state
    finally:
        shutil.rmtree(top)


def _as_user(user: pwd.struct_passwd, *command: str) -> None:
    subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", *command],
                   check=True, capture_output=True)


def _tree(top: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(top)): (p.read_bytes() if p.is_file() else None) for p in sorted(top.rglob("*"))}


def test_a_link_the_user_plants_at_the_state_folder_never_takes_roots_boot_writes_elsewhere(
        capsys, boot, tmp_path, throwaway_user, users_state_home):
    (boot.root / "proc/cmdline").write_text("quiet\n")
    elsewhere = tmp_path / "roots-own"  # any directory of root's: /boot, /etc/...
    for name in ("locks", "boot"):
        (elsewhere / name).mkdir(parents=True)
    (elsewhere / "locks" / "sim0.lock").write_text("root's file\n")
    (elsewhere / "boot" / "last-run-simulated.json").write_text("root's record\n")
    before = _tree(elsewhere)
    _as_user(throwaway_user, "ln", "-s", str(elsewhere), str(paths.state_dir()))
    save_profile(sim_profile("mine", value=-45), system=True)

    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "--boot", "--boot-wait", "0")

    assert _tree(elsewhere) == before  # nothing created, truncated or replaced there
    assert code == 2 and str(paths.state_dir()) in err and "Traceback" not in err, err
    assert sim().knob("sim0").current == 0  # fail closed: without its card lock the boot run applies nothing


def test_a_folder_of_roots_below_one_the_user_can_change_is_refused_too(
        capsys, boot, throwaway_user, users_state_home):
    """The user cannot write into root's own `tuner` folder, but can rename it away and put a link in its place
    at any moment, between root's check and root's write: so root refuses it before writing anything."""
    (boot.root / "proc/cmdline").write_text("quiet\n")
    paths.state_dir().mkdir(mode=0o755)  # root's, in the user's folder
    _as_user(throwaway_user, "mv", str(paths.state_dir()), str(users_state_home / "moved"))  # the user can
    _as_user(throwaway_user, "mv", str(users_state_home / "moved"), str(paths.state_dir()))
    save_profile(sim_profile("mine", value=-45), system=True)

    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "--boot", "--boot-wait", "0")

    assert code == 2 and f"is reached through {users_state_home}, which is owned by uid" in err, err
    assert "Traceback" not in err and sim().knob("sim0").current == 0
    assert list(paths.state_dir().iterdir()) == []  # no lock, no record


def test_service_install_refuses_to_pin_a_state_folder_the_user_can_change(capsys, monkeypatch, users_state_home):
    """`sudo -E tuner service install` would pin the user's `~/.local/state`: every boot run would then refuse
    it (above) and apply nothing, so the install says so at once, before anything is written."""
    from tests.profiles.helpers import AMD_KNOB, RX9070
    from tuner.profiles import boot as boot_rules
    from tuner.profiles import build_profile

    monkeypatch.setattr("tuner.actions.boot_service._is_root", lambda: True)
    save_profile(build_profile("mine", RX9070, AMD_KNOB, -45, kernel="6.14.0-test"))

    code, _out, err = tuner(capsys, "service", "install", "--profile", "mine")

    assert code == 2 and "refusing to install the boot service" in err and str(users_state_home) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not boot_rules.unit_path().exists() and not paths.system_profiles_dir().exists()
    assert not paths.state_dir().exists()
