"""Real processes and real uid drops for the helper's tests: throwaway accounts (`tunertest*`, removed by the test
that made them), a world-readable scratch directory they can reach, a helper process (on a fake amdgpu kernel or
simulated cards), and clients run as those accounts with `setpriv`."""

from __future__ import annotations

import grp
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_helpers import REPO
from tests.for_others import code_for_others, python_for_others, pythonpath_for_others
from tests.polling import wait_until  # noqa: F401 - the helper tests' one wait, re-exported
from tuner.helper.server import wait_for_socket

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"),
                                reason="needs root, useradd and setpriv (real uid drops)")


def _run(*cmd: str) -> None:
    """useradd and friends lock /etc/passwd: another test process may hold it for a moment."""
    for _ in range(50):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            return
        if "lock" not in proc.stderr.lower():
            raise AssertionError(f"{' '.join(cmd)}: {proc.stderr}")
        time.sleep(0.1)
    raise AssertionError(f"{' '.join(cmd)}: /etc/passwd stayed locked")


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: Path


class Accounts:
    def __init__(self, world: Path):
        self.world = world
        self.users: list[str] = []
        self.groups: list[str] = []

    def group(self) -> str:
        name = f"tunertest{secrets.token_hex(3)}"
        _run("groupadd", name)
        self.groups.append(name)
        return name

    def user(self, *groups: str) -> Account:
        name = f"tunertest{secrets.token_hex(3)}"
        home = self.world / name
        _run("useradd", "--create-home", "--home-dir", str(home), "--user-group", "--shell", "/bin/sh",
             *(("--groups", ",".join(groups)) if groups else ()), name)
        self.users.append(name)
        entry = pwd.getpwnam(name)
        return Account(name, entry.pw_uid, entry.pw_gid, home)

    def cleanup(self) -> None:
        """Every account and group this test made goes, even when one of them resists (all are tried)."""
        problems = []
        for name in self.users:
            try:
                _run("userdel", "--remove", "--force", name)
                if any(g.gr_name == name for g in grp.getgrall()):  # its own group, when userdel left it
                    _run("groupdel", name)
            except AssertionError as e:
                problems.append(str(e))
        for name in self.groups:
            try:
                _run("groupdel", name)
            except AssertionError as e:
                problems.append(str(e))
        assert not problems, problems


@pytest.fixture
def world() -> Iterator[Path]:
    """A scratch directory every test account can reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="tunertest-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


_started: list[subprocess.Popen] = []  # every process run as a test account (killed before its account goes)


@pytest.fixture
def accounts(world: Path) -> Iterator[Accounts]:
    made = Accounts(world)
    try:
        yield made
    finally:
        while _started:
            proc = _started.pop()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        made.cleanup()


class HelperProcess:
    """One `tuner-helper` process: started in the foreground as root, stopped by signal."""

    def __init__(self, world: Path, group: str, *, fake_amd: bool, extra: tuple[str, ...] = ()):
        self.world, self.group, self.fake_amd, self.extra = world, group, fake_amd, extra
        self.socket = world / "run" / "helper.sock"
        self.state_dir = world / "state"
        self.sysroot = world / "tree" if fake_amd else world / "sysroot"
        self.boot("boot-a")
        self.proc: subprocess.Popen | None = None
        self.log = world / "helper.log"

    def boot(self, boot_id: str) -> None:
        """The boot id the helper reads (a new one is a reboot)."""
        path = self.sysroot / "proc/sys/kernel/random/boot_id"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(boot_id + "\n")

    def start(self) -> HelperProcess:
        self.socket.parent.mkdir(mode=0o755, exist_ok=True)
        args = ["--socket", str(self.socket), "--group", self.group, "--state-dir", str(self.state_dir), *self.extra]
        command = ([sys.executable, "-m", "tests.helper.fake_amd_helper", str(self.sysroot), *args] if self.fake_amd
                   else [sys.executable, "-m", "tuner.helper", "--simulate", *args])
        env = {**os.environ, "PYTHONPATH": str(REPO), "TUNER_SYSFS_ROOT": str(self.sysroot)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
        if not wait_for_socket(self.socket, 60):
            self.stop()
            raise AssertionError(f"the helper did not start: {self.log.read_text()}")
        return self

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def ask(self, *requests: dict) -> list[dict]:
        """As root, on one connection: hello, then each request; the replies after hello."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(self.socket))
        reader = sock.makefile("rb")
        replies = []
        try:
            for request in ({"op": "hello", "version": 1}, *requests):
                sock.sendall(json.dumps(request).encode() + b"\n")
                replies.append(json.loads(reader.readline()))
        finally:
            sock.close()
        return replies[1:]

    def knob(self, card: str) -> dict:
        return self.ask({"op": "read_knob", "card": card})[0]["result"]


@pytest.fixture
def helpers(world: Path) -> Iterator[Callable[..., HelperProcess]]:
    started: list[HelperProcess] = []

    def start(group: str, *, fake_amd: bool = True, extra: tuple[str, ...] = ()) -> HelperProcess:
        helper = HelperProcess(world, group, fake_amd=fake_amd, extra=extra)
        started.append(helper)
        return helper.start()

    yield start
    for helper in started:
        if helper.proc is not None and helper.proc.poll() is None:
            helper.stop()


def as_user(account: Account | None, *args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    """`python -m <args>` as `account` (None: uid 65534 with no groups at all), from the checkout."""
    drop = (["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--init-groups"] if account else
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
    home = str(account.home) if account else "/"
    full_env = {"PATH": os.environ["PATH"], "PYTHONPATH": pythonpath_for_others(), "HOME": home, **(env or {})}
    proc = subprocess.Popen([*drop, *python_for_others(), "-m", *args], cwd=code_for_others(), env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    _started.append(proc)
    return proc


def open_connection(socket_path: Path, *requests: dict) -> socket.socket:
    """A connection of this process (root) that sent `requests`, each answered ok, and is left open: what a
    client holds when the helper dies under it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(socket_path))
    reader = sock.makefile("rb")
    for request in requests:
        sock.sendall(json.dumps(request).encode() + b"\n")
        assert json.loads(reader.readline())["ok"]
    return sock


def client(account: Account | None, socket_path: Path, *requests: dict | str, timeout_s: float = 60) -> list[str]:
    """Run the raw client as `account`; its output lines (one reply each, or REFUSED/CLOSED)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in requests]
    proc = as_user(account, "tests.helper.client", str(socket_path), *lines)
    out, err = proc.communicate(timeout=timeout_s)
    assert not err.strip() or "REFUSED" in out, err
    return out.splitlines()


HELLO = {"op": "hello", "version": 1, "client": "test"}
