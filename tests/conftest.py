"""Every test runs with its own XDG directories, so nothing touches the real home, /etc or another test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests check behaviour, not speed: a loaded 2-core CI machine must not fail them on hypothesis's
# default 200 ms per-example deadline.
settings.register_profile("tuner", deadline=None)
settings.load_profile("tuner")


RAM_DISK = Path("/dev/shm")
RAM_DISK_MIN_FREE_BYTES = 1 << 30


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path plugin reads the option
def pytest_configure(config: pytest.Config) -> None:
    """Test files on a RAM disk where the machine has one with room: the product fsyncs every journal and profile
    write (tuner/core/atomic.py), and on a disk those waits were most of a small bisect test's time (on tmpfs fsync
    returns at once; the same code runs). Not where `--basetemp` was given, nor in an xdist worker (it gets the
    controller's). A run's folder is kept for a look after a failure; a dead run's is removed by the next."""
    if config.option.basetemp or hasattr(config, "workerinput"):
        return
    try:
        disk = os.statvfs(RAM_DISK)
    except OSError:
        return
    if disk.f_bavail * disk.f_frsize < RAM_DISK_MIN_FREE_BYTES or not os.access(RAM_DISK, os.W_OK):
        return
    for old in RAM_DISK.glob(f"tuner-tests-{os.getuid()}-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = str(RAM_DISK / f"tuner-tests-{os.getuid()}-{os.getpid()}")


def pytest_report_header(config: pytest.Config) -> str:
    return f"test files under: {config.option.basetemp or 'pytest default (a disk)'}"


class FakeBoot:
    """A fake /proc under TUNER_SYSFS_ROOT; calling it with a new boot id simulates a reboot."""

    def __init__(self, root):
        self.root = root
        (root / "proc/sys/kernel/random").mkdir(parents=True)

    def __call__(self, boot_id: str) -> None:
        (self.root / "proc/sys/kernel/random/boot_id").write_text(boot_id + "\n")

    def process(self, pid: int) -> int:
        """Show a real live process in the fake /proc (its `stat` line, copied as the kernel wrote it) and return
        its start time: field 22 (proc(5)), counted after the command name's last ')', where field 3 begins."""
        line = Path(f"/proc/{pid}/stat").read_text()
        (self.root / f"proc/{pid}").mkdir(parents=True, exist_ok=True)
        (self.root / f"proc/{pid}/stat").write_text(line)
        return int(line.rpartition(")")[2].split()[19])


@pytest.fixture
def boot(tmp_path, monkeypatch) -> FakeBoot:
    fake = FakeBoot(tmp_path / "sysroot")
    fake("boot-a")
    monkeypatch.setenv("TUNER_SYSFS_ROOT", str(fake.root))
    return fake


@pytest.fixture
def in_process_backend(tmp_path):
    """An in-process backend (its trial_begin/trial_end add nothing to the journal's own file) for a journal or a
    guarded trial a test builds by hand."""
    from tuner.backends.simulated import SimulatedBackend

    return SimulatedBackend(state_path=tmp_path / "sim")


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    base = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(base / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))  # the engine's tokenizer and compiled kernels
    monkeypatch.setenv("TUNER_SYSTEM_PROFILES", str(base / "etc-tuner-profiles"))
    monkeypatch.setenv("TUNER_SYSTEMD_DIR", str(base / "systemd"))
    monkeypatch.setenv("TUNER_STATE_DIR", str(base / "machine-state"))  # the root helper's (the boot path reads it)
    monkeypatch.delenv("NO_COLOR", raising=False)
    # `tuner service install` refuses code a user other than root can change (tuner.core.root_owned); a checkout
    # may be anyone's, so tests install as from a root-owned tree unless they test that check itself
    # (tests/profiles/test_system_units.py restores the real one).
    from tuner.actions import boot_service

    monkeypatch.setattr(boot_service, "install_code", lambda: ([Path("/usr/bin/env")], []))
    yield base


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """A test that calls `cli.main` installs the command's fatal-signal handlers (`tuner.core.signals.install`) in
    the pytest process; a later test must not inherit them (a SIGPIPE from a socket written by a thread would then
    raise `Terminated` in the main thread instead of the BrokenPipeError Python gives by default)."""
    import signal

    from tuner.core.signals import FATAL

    before = {sig: signal.getsignal(sig) for sig in FATAL}
    yield
    for sig, handler in before.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)


MACHINE_WIDE_LOCK = Path("/tmp/tuner-tests-machine-wide.lock")
TURNSTILE = Path("/tmp/tuner-tests-machine-wide.turnstile")  # a waiting exclusive holder is not starved


@pytest.fixture(autouse=True)
def _machine_wide_processes():
    """Some tests start a process the whole machine sees (a fake `lactd`: tests/fake_other_tools.py), and the
    other-tools check of every real-backend write scans the real process table, so in the other pytest-xdist
    worker a boot apply would meet it and refuse. Every test holds this lock shared; a test that starts such a
    process takes it exclusively (`machine_wide_exclusive`) for its life, so none runs beside it."""
    import fcntl

    with MACHINE_WIDE_LOCK.open("a+") as lock, TURNSTILE.open("a+") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_SH)  # waits while an exclusive holder is queued
        fcntl.flock(lock, fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield lock
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def machine_wide_exclusive(lock) -> None:
    """Upgrade the test's shared hold on MACHINE_WIDE_LOCK: returns once no other test runs. The turnstile stops
    new tests from starting meanwhile; the shared hold is dropped before waiting there, so two upgrades cannot
    deadlock."""
    import fcntl

    fcntl.flock(lock, fcntl.LOCK_UN)  # first: a test waiting at the turnstile holds nothing another waits for
    with TURNSTILE.open("a+") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The order the workers take tests in (a stable sort: every other test keeps its file order):
    1. the tests that run alone (`fake_lactd`: machine_wide_exclusive): each waits until the other worker's test
       ends, so they go while those are short, before any heavy one has started;
    2. the longest tests (`@pytest.mark.heavy(seconds=N)`: a whole bisect on real engines; N is what it took in
       CI's 2-core run), longest first. In file order they came last (tests/tuning), and the run ended with one
       worker busy on a minute-long test while the other sat idle."""
    def order(item: pytest.Item) -> tuple[int, float]:
        if "fake_lactd" in getattr(item, "fixturenames", ()):
            return (0, 0.0)
        heavy = item.get_closest_marker("heavy")
        return (1, -float(heavy.kwargs["seconds"]) if heavy is not None else 0.0)

    items.sort(key=order)
