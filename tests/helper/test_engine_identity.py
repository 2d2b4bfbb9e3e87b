"""The stress engine is never root: started through sudo, the tuner runs it as the sudo user (issue 22)."""

from __future__ import annotations

import grp
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.cli_helpers import REPO
from tests.for_others import python_for_others, pythonpath_for_others, runnable_by_others
from tests.helper.conftest import needs_root, wait_until
from tuner.core.privileges import EngineIdentity, EngineRefused, engine_identity


def test_not_root_runs_the_engine_as_itself():
    assert engine_identity(simulated=False, euid=1000, env={"SUDO_UID": "1234"}) is None


def test_a_sudo_uid_that_is_not_a_uid_refuses_the_engine_in_one_line():
    """str.isdigit takes a superscript two, int() does not: SUDO_UID=\u00b2 was a ValueError traceback out of the
    stress run (and `tuner doctor`) as root. It is a refusal naming the variable, as an unknown uid is."""
    refused = engine_identity(simulated=False, euid=0, env={"SUDO_UID": "\u00b2"})
    assert isinstance(refused, EngineRefused) and "SUDO_UID" in refused.reason, refused


def test_root_without_sudo_refuses_a_real_card_and_names_the_remedy():
    refused = engine_identity(simulated=False, euid=0, env={})
    if not isinstance(refused, EngineRefused):
        pytest.skip("this machine has a tuner-engine account")
    assert "sudo" in refused.remedy and "TUNER_ENGINE_USER" in refused.remedy
    assert engine_identity(simulated=True, euid=0, env={}) is None  # the CPU-only simulated card (docs/helper.md)


def test_an_engine_user_that_is_root_or_missing_is_refused():
    assert isinstance(engine_identity(simulated=True, euid=0, env={"TUNER_ENGINE_USER": "root"}), EngineRefused)
    assert isinstance(engine_identity(simulated=True, euid=0, env={"TUNER_ENGINE_USER": "tunertest-nobody-x"}),
                      EngineRefused)


def test_an_engine_user_that_is_not_a_uid_nor_a_name_is_refused_in_one_line(tmp_path):
    """TUNER_ENGINE_USER took str.isdigit's digits as a uid, as SUDO_UID once did: a superscript two went to int()
    (ValueError), a traceback out of a root stress run and `tuner doctor`. It is a name then, which no account has."""
    from tuner.actions import doctor

    env = {"TUNER_ENGINE_USER": "\u00b2"}
    refused = engine_identity(simulated=True, euid=0, env=env)
    assert isinstance(refused, EngineRefused) and "TUNER_ENGINE_USER" in refused.reason, refused
    account = doctor.engine_account(env, 0)
    assert isinstance(account, doctor.Check) and account.status == doctor.WARN and account.remedy


def test_the_identity_environment_is_the_users_not_roots():
    identity = EngineIdentity(1000, 1000, (44, 109), "ann", "/home/ann")
    env = identity.environ({"HOME": "/root", "USER": "root", "XDG_CACHE_HOME": "/root/.cache", "PATH": "/usr/bin"})
    assert env == {"HOME": "/home/ann", "USER": "ann", "LOGNAME": "ann", "PATH": "/usr/bin"}


def _engine_of(tuner: subprocess.Popen) -> psutil.Process | None:
    try:
        children = psutil.Process(tuner.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    return next((c for c in children if "tuner.engine" in " ".join(c.cmdline())), None)


def _status(pid: int, field: str) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return [int(v) for v in line.split()[1:]]
    raise AssertionError(field)


@needs_root
def test_a_sudo_started_stress_runs_the_engine_as_the_sudo_user(accounts, world):
    python = python_for_others()
    group = accounts.group()
    ann = accounts.user(group)
    record = world / "run.ref"
    env = {**os.environ, "PYTHONPATH": pythonpath_for_others(), "SUDO_UID": str(ann.uid),
           "SUDO_GID": str(ann.gid), "SUDO_USER": ann.name}
    tuner = subprocess.Popen([*python, "-m", "tuner", "--simulate", "stress", "--device", "sim0", "--steps", "20",
                              "--record", str(record)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        engine = wait_until(lambda: _engine_of(tuner) or tuner.poll() is not None, 120, "the engine to start")
        assert isinstance(engine, psutil.Process), tuner.communicate()[1][-2000:]
        uids, gids = _status(engine.pid, "Uid"), _status(engine.pid, "Gid")
        groups = _status(engine.pid, "Groups")
        environ = dict(line.split("=", 1) for line in
                       Path(f"/proc/{engine.pid}/environ").read_text().split("\0") if "=" in line)
        out, err = tuner.communicate(timeout=300)
    finally:
        if tuner.poll() is None:
            tuner.send_signal(signal.SIGTERM)
            tuner.wait(timeout=60)
    assert uids == [ann.uid] * 4 and gids == [ann.gid] * 4  # real, effective, saved, filesystem
    assert grp.getgrnam(group).gr_gid in groups  # the user's supplementary groups (render/video on a real box)
    assert environ["HOME"] == str(ann.home) and "XDG_CACHE_HOME" not in environ
    assert tuner.returncode == 0, err[-2000:]
    assert "PASS" in out
    # the reference it recorded as Ann (in a directory of hers) was put where it was asked for
    assert json.loads(record.read_text()) and record.stat().st_uid == 0


@needs_root
def test_an_engine_the_sudo_user_cannot_run_is_one_line_and_exit_3(accounts):
    if runnable_by_others(sys.executable):
        pytest.skip("every account may run this interpreter here")
    ann = accounts.user()
    proc = subprocess.run([sys.executable, "-m", "tuner", "--simulate", "stress", "--device", "sim0", "--steps", "5"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "SUDO_UID": str(ann.uid),
                               "SUDO_GID": str(ann.gid)})
    assert proc.returncode == 3, proc.stderr
    # the stress action says what it checks before it starts the engine; the refusal itself is one line, the last
    lines = proc.stderr.strip().splitlines()
    assert f"runs as {ann.name}, who may not run" in lines[-1]
    assert sum("may not run" in line for line in lines) == 1 and "Traceback" not in proc.stderr
