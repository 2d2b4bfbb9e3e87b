"""The real `python -m tuner.engine` subprocess: protocol on stdout only, exit codes, usage errors without a
traceback, record-then-compare across processes, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.engine.conftest import validate_stream

ROOT = Path(__file__).resolve().parents[2]


def engine(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-u", "-m", "tuner.engine", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_usage_error_is_one_stderr_line_an_end_event_and_exit_2():
    p = engine("--steps", "5", "--inject", "explode@3")
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr
    assert p.stderr.startswith("tuner.engine: error: bad --inject")
    events = validate_stream(p.stdout.splitlines())
    assert [e["event"] for e in events] == ["end"]
    assert events[0]["verdict"] == "error" and events[0]["kind"] == "usage" and events[0]["exit_code"] == 2


def test_record_then_a_bit_flip_is_a_mismatch_at_its_step_across_processes(tmp_path):
    ref = tmp_path / "ref.json"
    p = engine("--steps", "12", "--seed", "2", "--record", str(ref), "--canary-every", "5")
    events = validate_stream(p.stdout.splitlines())
    assert p.returncode == 0 and events[-1]["verdict"] == "pass" and ref.exists()
    assert "Traceback" not in p.stderr
    doc = json.loads(ref.read_text())
    assert doc["steps"] == 12 and len(doc["digests"]) == 12 and doc["fingerprint"]["seed"] == 2
    p = engine("--steps", "12", "--seed", "2", "--reference", str(ref), "--inject", "bitflip@6")
    events = validate_stream(p.stdout.splitlines())
    end = events[-1]
    assert p.returncode == 1 and (end["verdict"], end["kind"], end["step"]) == ("fail", "mismatch", 6)
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 7))


def test_sigterm_ends_the_run_with_an_end_event(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-u", "-m", "tuner.engine", "--duration", "60", "--heartbeat-s", "0.2"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        lines.append(line)
        if '"event":"step"' in line and '"step":3,' in line:
            proc.send_signal(signal.SIGTERM)
        assert time.monotonic() < deadline
    proc.wait(timeout=30)
    events = validate_stream(lines)
    assert proc.returncode == 130
    assert (events[-1]["verdict"], events[-1]["kind"]) == ("error", "interrupted")


# --- the parent dies --------------------------------------------------------------------------------------

PARENT = """
import subprocess, sys, time
out, err = open(sys.argv[1], "w"), open(sys.argv[2], "w")
engine = subprocess.Popen([sys.executable, "-u", "-m", "tuner.engine", *sys.argv[3:]], stdout=out, stderr=err,
                          start_new_session=True)
print(engine.pid, flush=True)
time.sleep(600)
"""


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # re-parented and not reaped yet: it has ended
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("extra", [[], ["--inject", "hang@3"]], ids=["training", "hung"])
def test_the_engine_ends_when_its_parent_is_killed(tmp_path, extra):
    """The engine's stdout and stderr are files, so no broken pipe tells it: only the parent watch can (a hung
    engine ignores SIGTERM and sends nothing at all)."""
    out, err = tmp_path / "out.jsonl", tmp_path / "err.log"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(out), str(err), "--duration", "60",
                               "--heartbeat-s", "0.2", *extra], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    engine_proc = psutil.Process(int(parent.stdout.readline()))
    try:
        deadline = time.monotonic() + 120
        while '"event":"step","t"' not in out.read_text() or '"step":2,' not in out.read_text():
            assert time.monotonic() < deadline and not _gone(engine_proc), err.read_text()[-2000:]
            time.sleep(0.1)
        parent.kill()  # kill -9: nothing runs in the parent any more
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not _gone(engine_proc) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(engine_proc), "the engine outlived its parent by 10 s"
    finally:
        if not _gone(engine_proc):
            engine_proc.kill()
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert "Traceback" not in err.read_text()
    if extra:  # hung: no more events, a line on stderr
        assert "the process that started the engine has exited: ending the hang" in err.read_text()
    else:  # training: a clean end, the reason says why
        end = json.loads(out.read_text().splitlines()[-1])
        assert (end["event"], end["verdict"], end["kind"], end["exit_code"]) == ("end", "error", "interrupted", 130)
        assert "the exit of the process that started the engine" in end["reason"]


def test_the_parent_death_signal_is_set_at_start_up():
    code = ("import ctypes, ctypes.util; from tuner.engine.lifeline import set_parent_death_signal as set_; "
            "libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6'); v = ctypes.c_int(-1); "
            "get = lambda: (libc.prctl(2, ctypes.byref(v), 0, 0, 0), v.value)[1]; "  # PR_GET_PDEATHSIG
            "print(get(), set_(), get())")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert p.stdout.split() == ["0", "True", str(int(signal.SIGTERM))]


def test_an_engine_whose_given_parent_is_gone_ends_before_its_setup(tmp_path):
    """`--parent-pid` names a parent that died before the engine read its own: the early backstop watched the pid
    it saw (init), so a setup the main thread cannot leave (here a torch import that never returns) ran on."""
    (tmp_path / "torch.py").write_text("import time\ntime.sleep(600)\n")
    dead = subprocess.Popen(["true"])
    dead.wait()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    p = subprocess.run([sys.executable, "-u", "-m", "tuner.engine", "--steps", "1", "--parent-pid", str(dead.pid)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=20, check=False)
    events = validate_stream(p.stdout.splitlines())
    assert p.returncode == 130 and [e["event"] for e in events] == ["end"], p.stderr
    assert (events[0]["kind"], events[0]["exit_code"]) == ("interrupted", 130)
    assert "the exit of the process that started the engine" in events[0]["reason"]
    assert "Traceback" not in p.stderr
