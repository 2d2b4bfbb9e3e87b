"""Faults at chosen moments never leave the card off stock: a terminal drop (SIGHUP to the whole process group)
or a double SIGTERM, during a simulated bisect and during `tuner set` (issue 11).

Each case asserts the card reads stock within 10 s of the fault, no tuner or engine process is left, and (for a
bisect) the journal can be resumed. A moment is a program state, never a time (issue 21 item 9: a loaded machine
moves a time to another state, so a failure would not replay): the bisect's n-th event of a kind in its n-th trial
(read from its `--json` stream), or `set`'s change pending (its read-back line). Only the second SIGTERM of a
double one lands after a drawn pause, anywhere in the first one's clean-up; its seed replays it.
"""

from __future__ import annotations

import json
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
# A bisect moment: (event, trial index, occurrence within that trial); -1: before the first trial. CI runs three
# moments of each fault: before any trial, the stock replay running, the first undervolt (-10 mV) running;
# TUNER_SLOW_TESTS=1 draws 20 + 20 from every state of the first four trials (issue 11's count), and
# bench/fault_campaign.py runs the full campaign (kill -9, disk full too) with its figures.
CI_MOMENTS = [("session_started", -1, 1), ("trial_progress", 1, 1), ("trial_progress", 2, 1)]
# The trials' length only sets how soon a moment comes. The CI moments need no trial but the stock baseline and its
# replay to finish, and those pass however short (no least number of compared steps at stock:
# tuner.tuning.evidence.judge), so they run 1 s trials. Later moments keep 3 s: enough steps that -10 mV passes
# (a shorter undervolt trial would be re-run longer, and its progress events too few to count on a second one).
CI_TRIAL, TRIAL = "1s", "3s"
ALL_MOMENTS = [("session_started", -1, 1)] + [(kind, trial, n) for trial in range(4)
                                               for kind, n in (("trial_started", 1), ("trial_progress", 1),
                                                               ("trial_progress", 2), ("trial_finished", 1))]


def _bisect_cases():
    if not os.environ.get("TUNER_SLOW_TESTS"):
        return [(fault, moment, 11 + i) for i, (fault, moment) in
                enumerate((f, m) for f in FAULTS for m in CI_MOMENTS)]
    rng = random.Random(11)
    return [(FAULTS[i % 2], rng.choice(ALL_MOMENTS), rng.randrange(1 << 30)) for i in range(40)]


SET_CASES = [(fault, seed) for seed in ((12, 13) if not os.environ.get("TUNER_SLOW_TESTS") else range(12, 32))
             for fault in FAULTS]


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


def _wait_for_moment(proc: subprocess.Popen, moment: tuple[str, int, int]) -> None:
    """Read the bisect's --json events until `moment` (event, trial index, occurrence in that trial) has passed."""
    event, trial, nth = moment
    current, seen = -1, 0
    for line in proc.stdout:
        kind = json.loads(line)["event"]
        if kind == "trial_started":
            current, seen = current + 1, 0
        if kind == event and current == trial:
            seen += 1
            if seen == nth:
                return
    raise AssertionError(f"the bisect ended before {moment}")


@pytest.mark.heavy(seconds=15)
@pytest.mark.parametrize("fault,moment,seed", _bisect_cases())
def test_a_fault_mid_bisect_leaves_the_card_at_stock_and_the_journal_resumable(boot, fault, moment, seed,
                                                                               in_process_backend):
    trial = CI_TRIAL if moment in CI_MOMENTS else TRIAL
    proc = _start([*SIM, "bisect", "--device", "sim0", "--trial", trial, "--confirm", "3s", "--preset", "tiny",
                   "--json"], stdout=subprocess.PIPE, text=True)
    try:
        _wait_for_moment(proc, moment)
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
        assert journal.Journal.open_existing("sim0", in_process_backend).unresolved()  # `--resume` picks it up
        assert doc.get("open_trial") is None or proc.returncode < 0  # closed cleanly unless killed outright


@pytest.mark.parametrize("fault,seed", SET_CASES)
def test_a_fault_during_set_reverts_the_unconfirmed_change(fault, seed):
    proc = _start([*SIM, "set", "--device", "sim0", "--offset", "-30", "--keep-timeout", "60"],
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # "sim0 ...: +0 mV -> -30 mV (read back)": the change is pending
        assert SimulatedBackend().knob("sim0").current == -30
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
