"""Faults at random moments never leave the card off stock: a terminal drop (SIGHUP to the whole process group)
or a double SIGTERM, during a simulated bisect and during `tuner set` (issue 11).

Each case asserts the card reads stock within 10 s of the fault, no tuner or engine process is left, and (for a
bisect) the journal can be resumed. The moments are drawn from a fixed seed, so a failure replays.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.cli_helpers import REPO
from tuner.backends.simulated import SimulatedBackend
from tuner.tuning import journal

SIM = ["--simulate", "--sim-vmin", "-22"]
FAULTS = ("hangup", "double-term")
# CI draws 6 moments of each (the suite's 10-minute budget); TUNER_SLOW_TESTS=1 draws the 20 + 20 of issue 11,
# and bench/fault_campaign.py runs the full campaign (kill -9, disk full too) with its figures.
BISECT_MOMENTS = 20 if os.environ.get("TUNER_SLOW_TESTS") else 6
SET_MOMENTS = 20 if os.environ.get("TUNER_SLOW_TESTS") else 6


def _start(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # a session of its own, as a login shell over SSH has: the fault reaches its whole process group
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], env=env, cwd=REPO, start_new_session=True,
                            stderr=subprocess.DEVNULL, **kw)


def _fault(proc: subprocess.Popen, fault: str, rng: random.Random) -> None:
    if fault == "hangup":
        os.killpg(proc.pid, signal.SIGHUP)  # the terminal went away: every process in the group gets it
    else:
        proc.send_signal(signal.SIGTERM)
        time.sleep(rng.uniform(0.0, 0.3))  # the second lands anywhere in the first one's clean-up
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)


def _card_reads_stock_within(seconds: float) -> int:
    deadline = time.monotonic() + seconds
    current = SimulatedBackend().knob("sim0").current
    while current != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        current = SimulatedBackend().knob("sim0").current
    return current


def _no_process_left(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.1)
    return alive


def _cases(n: int, seed: int, low_s: float, high_s: float):
    rng = random.Random(seed)
    return [(FAULTS[i % 2], round(rng.uniform(low_s, high_s), 2), rng.randrange(1 << 30)) for i in range(n)]


@pytest.mark.parametrize("fault,after_s,seed", _cases(BISECT_MOMENTS, 11, 0.5, 7.0))
def test_a_fault_mid_bisect_leaves_the_card_at_stock_and_the_journal_resumable(boot, fault, after_s, seed):
    proc = _start([*SIM, "bisect", "--device", "sim0", "--trial", "3s", "--confirm", "3s", "--preset", "tiny",
                   "--json"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(after_s)
        family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        _fault(proc, fault, random.Random(seed))
        assert _card_reads_stock_within(10) == 0
        proc.wait(20)
        assert _no_process_left(family) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = journal.load("sim0")
    if doc is not None and doc.get("state") != journal.FINISHED:
        assert journal.Journal.open_existing("sim0").unresolved  # `--resume` picks it up
        assert doc.get("open_trial") is None or proc.returncode < 0  # closed cleanly unless killed outright


@pytest.mark.parametrize("fault,after_s,seed", _cases(SET_MOMENTS, 12, 0.05, 2.0))
def test_a_fault_during_set_reverts_the_unconfirmed_change(fault, after_s, seed):
    proc = _start([*SIM, "set", "--device", "sim0", "--offset", "-30", "--keep-timeout", "60"],
                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        time.sleep(after_s)
        _fault(proc, fault, random.Random(seed))
        assert _card_reads_stock_within(10) == 0
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGPIPE,
                                 signal.SIGINT], ids=lambda s: signal.Signals(s).name)
def test_every_signal_that_would_end_set_reverts_first(sig):
    proc = _start([*SIM, "set", "--device", "sim0", "--offset", "-30", "--keep-timeout", "60"],
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # "sim0 ...: +0 mV -> -30 mV (read back)": the change is pending
        assert SimulatedBackend().knob("sim0").current == -30
        proc.send_signal(sig)
        assert proc.wait(20) == 130
        assert SimulatedBackend().knob("sim0").current == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_z_during_an_unconfirmed_change_reverts_before_stopping():
    proc = _start([*SIM, "set", "--device", "sim0", "--offset", "-30", "--keep-timeout", "60"],
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()
        proc.send_signal(signal.SIGTSTP)
        assert _card_reads_stock_within(10) == 0
    finally:
        proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
