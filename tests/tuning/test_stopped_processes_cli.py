"""Issue 28.1's acceptance, with the simulated card and the real tiny engine: a bisect whose engine is stopped from
outside (SIGSTOP) for 12 s during a trial below stock, and whose own process is stopped by Ctrl-Z (SIGTSTP) during a
later one, ends as an undisturbed one does (-40 mV with a -52 mV limit) with nothing on the unsafe list.

One run carries both faults (a run each would double it), on a 50 mV coarse step with a -50 mV floor: 0, then
-50 at once, confirmed at -50 (-10 to -40 of the default 10 mV step left out, the same answer: -50 + the 10 mV margin;
a fault read as a failure at -50, in its trial or its confirmation, would move it). The engine is stopped in the
first trial at -50 (it runs again), Ctrl-Z comes in the confirmation (it runs again too). Each moment is a program
state read from the `--json` stream (a trial below stock has reported progress, so its engine is loading the card),
never a time; 12 s is the length of the fault itself, past the 10 s of silence the watchdog reads as a hang on
the CPU (max(10 s, 20 steps), for steps up to 0.6 s), so a stop counted as silence would show as one. 4 s trials
are about 75 compared steps even at 50 ms a step (a pass needs 50); on a box loaded harder a trial too short to
count runs again, longer, and changes nothing here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.cli_helpers import REPO
from tuner.backends.simulated import SimulatedBackend
from tuner.tuning import journal

ENGINE_STOP_S = 12.0


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition was not reached"
        time.sleep(0.05)


def _engine_pids(tuner_pid: int) -> list[int]:
    try:
        children = psutil.Process(tuner_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    pids = []
    for child in children:
        try:
            if "tuner.engine" in " ".join(child.cmdline()):
                pids.append(child.pid)
        except psutil.Error:
            pass
    return pids


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


@pytest.mark.heavy(seconds=50)
@pytest.mark.timeout(900)  # about a minute alone; a shared 2-core box makes trials too short to count, and longer
def test_a_stopped_engine_and_a_stopped_tuner_leave_the_answer_and_the_unsafe_list_alone():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "--simulate", "--sim-vmin", "-52", "bisect", "--device",
                             "sim0", "--trial", "4s", "--confirm", "4s", "--step", "50", "--floor", "-50", "--yes",
                             "--json"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            # a process group of its own in this session, as a shell's job: not orphaned, so
                            # SIGTSTP really stops it (the kernel drops it for an orphaned group)
                            process_group=0)
    events, faults, setting, phase = [], [], None, None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            ev = json.loads(line)
            events.append(ev)
            if ev["event"] == "trial_started":
                setting, phase = ev["setting"], ev["phase"]
            if ev["event"] != "trial_progress" or setting is None or setting >= 0:
                continue
            if not faults:  # the first trial below stock: its engine stopped from outside
                [engine] = _engine_pids(proc.pid)
                os.kill(engine, signal.SIGSTOP)
                faults.append(("engine-stopped", setting))
                time.sleep(ENGINE_STOP_S)  # the fault's length, not a wait for a state
                os.kill(engine, signal.SIGCONT)
            elif len(faults) == 1 and phase == "confirm":  # a later one: Ctrl-Z on the tuner itself
                proc.send_signal(signal.SIGTSTP)
                faults.append(("ctrl-z", setting))
                # before it stops, the engine is gone and the card is back at stock
                _wait_for(lambda: _status(proc.pid) == "stopped")
                assert _engine_pids(proc.pid) == [] and SimulatedBackend().knob("sim0").current == 0
                proc.send_signal(signal.SIGCONT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
    assert [f[0] for f in faults] == ["engine-stopped", "ctrl-z"]
    finished = [ev["result"] for ev in events if ev["event"] == "trial_finished"]
    stopped = [r for r in finished if r["setting"] == faults[0][1] and r["kind"] == "engine-stopped"]
    assert stopped and stopped[0]["verdict"] == "inconclusive", finished
    assert any(ev["event"] == "warning" and "paused (Ctrl-Z)" in ev["message"] for ev in events)
    assert not any(r["kind"] == "hang" for r in finished), finished
    [recommendation] = [ev for ev in events if ev["event"] == "recommendation"]
    assert recommendation["setting"] == -40
    assert journal.unsafe_settings("sim0") == {}
    assert SimulatedBackend().knob("sim0").current == 0
