"""A signal storm ends with the documented exit code (issue 28, item 7): the card is reverted first, then the
process exits 130 with the revert's line, never by the signal itself (before: death by SIGHUP or SIGUSR2 in the
middle of the storm), never with `Terminated: SIGPIPE` or "lost sys.stderr" and exit 1. A pending change ended by
any fatal signal, SIGPIPE included, is an interrupted change (130); 141 is for a command that was only printing.
Real processes, real signals, sent until the process is gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli_helpers import REPO, run_tuner
from tests.polling import wait_until

STORM = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGQUIT, signal.SIGUSR1,
         signal.SIGUSR2, signal.SIGALRM)


def _offset() -> int:
    return json.loads(run_tuner("--simulate", "status", "--json").stdout)["devices"][0]["knob"]["current"]


def _storm(proc: subprocess.Popen, first: signal.Signals) -> None:
    """`first`, then every fatal signal in turn, as fast as they go, until the process has exited."""
    sent = 0
    try:
        proc.send_signal(first)
        while proc.poll() is None and sent < 20_000:
            proc.send_signal(STORM[sent % len(STORM)])
            sent += 1
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE])
def test_a_storm_during_a_pending_set_reverts_and_exits_with_the_documented_code(first):
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "--simulate", "set", "--offset", "-50",
                             "--keep-timeout", "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    assert "-50 mV" in proc.stdout.readline()  # applied; the prompt is waiting
    deadline = time.monotonic() + 60
    _storm(proc, first)
    _out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    assert proc.returncode == 130, (proc.returncode, err)  # negative: it died by the signal
    assert "Traceback" not in err and "Exception ignored" not in err and "lost sys.stderr" not in err, err
    assert "interrupted: reverted to +0 mV" in err, err
    assert _offset() == 0



def _process_status(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]  # R, S, T (stopped), Z


# A shell's background job (`tuner set ... &`, or Ctrl-Z then `bg`): a session leader on a terminal of its own keeps
# the foreground and starts tuner in a process group of its own, so tuner's stdin and stderr are a terminal it is
# not in the foreground of
_JOB_SHELL = """
import fcntl, subprocess, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
job = subprocess.Popen(sys.argv[1:], process_group=0)
print(job.pid, flush=True)
job.wait()  # the session stays while the job lives: its group is not orphaned, so the kernel does stop it
"""


@pytest.mark.parametrize("touch", ["read", "write"])
def test_a_background_job_that_touches_its_terminal_reverts_before_it_stops(touch):
    # The kernel stops a background job that reads its terminal (SIGTTIN) or writes to it under `stty tostop`
    # (SIGTTOU); a stopped process never reverts (in-process there is no helper lease to run out), so a pending
    # change must be reverted first, as for Ctrl-Z
    import pty
    import termios

    master, slave = pty.openpty()
    if touch == "write":
        attrs = termios.tcgetattr(slave)
        attrs[3] |= termios.TOSTOP
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    shell = subprocess.Popen([sys.executable, "-c", _JOB_SHELL, sys.executable, "-m", "tuner", "--simulate", "set",
                              "--offset", "-50", "--keep-timeout", "60"],
                             stdin=slave, stdout=subprocess.PIPE, stderr=slave, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
                             start_new_session=True)
    os.close(slave)
    pid = None
    try:
        pid = int(shell.stdout.readline())
        assert "-50 mV" in shell.stdout.readline()  # applied; the prompt is waiting (or stopped writing it)
        if touch == "read":
            os.write(master, b"y\n")  # typed while it runs in the background: its read stops it
        wait_until(lambda: _process_status(pid) in ("T", "Z"), 30, "the job to stop or end")
        assert _offset() == 0  # reverted before it stopped
    finally:
        if pid is not None and _process_status(pid) != "Z":
            os.kill(pid, signal.SIGKILL)
        shell.wait(30)
        os.close(master)
