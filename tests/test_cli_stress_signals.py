"""`tuner stress` under signals, as a real process on the simulated card with the real engine: a fatal signal stops
the session the documented way (the engine's `end`, then the `result` line with verdict `stopped`, exit 130), and
Ctrl-Z (SIGTSTP) ends the engine before tuner stops (it runs in a session of its own, so the terminal's SIGTSTP
never reaches it; stopped tuner would leave it loading the card unwatched), then ends as stopped on SIGCONT. Each
moment is a program state (a `step` line on stdout), never a time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.cli_helpers import REPO
from tests.polling import wait_until


def _stress() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tuner", "--simulate", "stress", "--device", "sim0",
                             "--duration", "120", "--no-reference", "--json"],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            # a process group of its own, as a shell's job: not orphaned, so SIGTSTP stops it
                            process_group=0)


def _until_a_step(proc: subprocess.Popen) -> list[dict]:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(json.loads(line))
        if seen[-1]["event"] == "step":
            return seen
    raise AssertionError(f"no step before the end: {seen}, {proc.stderr.read() if proc.stderr else ''}")


def _engine_pids(pid: int) -> list[int]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            if "tuner.engine" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            pass
    return found


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


def _finish(proc: subprocess.Popen) -> tuple[list[dict], str]:
    out, err = proc.communicate(timeout=120)
    return [json.loads(ln) for ln in out.splitlines()], err


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_fatal_signal_ends_with_the_engines_end_and_a_stopped_result(sig):
    proc = _stress()
    try:
        _until_a_step(proc)
        assert _engine_pids(proc.pid)
        proc.send_signal(sig)
        lines, err = _finish(proc)
    finally:
        _kill(proc)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert [d["event"] for d in lines][-2:] == ["end", "result"], (lines[-3:], err)
    result = lines[-1]
    assert (result["verdict"], result["exit_code"], result["device"]) == ("stopped", 130, "sim0")


def test_ctrl_z_ends_the_engine_before_tuner_stops_and_ends_as_stopped_on_sigcont():
    proc = _stress()
    try:
        _until_a_step(proc)
        proc.send_signal(signal.SIGTSTP)
        wait_until(lambda: _status(proc.pid) in ("stopped", "gone"), 60, "tuner to stop")
        assert _status(proc.pid) == "stopped"  # Ctrl-Z stops it, once the engine is gone
        assert _engine_pids(proc.pid) == []  # nothing loads the card unwatched while tuner is stopped
        proc.send_signal(signal.SIGCONT)
        lines, err = _finish(proc)
    finally:
        _kill(proc)
    assert proc.returncode == 130, (proc.returncode, err)
    assert [d["event"] for d in lines][-2:] == ["end", "result"], (lines[-3:], err)
    assert lines[-1]["verdict"] == "stopped"
    assert "Ctrl-Z" in err, err
