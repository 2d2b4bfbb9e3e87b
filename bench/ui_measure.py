"""Measure the UI in a real terminal (tmux): start-up to first frame, and idle CPU / RSS during a bisect.

Not a test (timing is machine-dependent). Run: `.venv/bin/python bench/ui_measure.py [--bisect-s 30]`.
It uses throwaway XDG directories and the simulated GPU; the captured panes are printed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

TUNER = Path(sys.executable).with_name("tuner")


def tmux(sock: Path, *args: str) -> str:
    return subprocess.run(["tmux", "-S", str(sock), *args], capture_output=True, text=True, check=True).stdout


def pane(sock: Path) -> str:
    return tmux(sock, "capture-pane", "-p", "-t", "m")


def wait_for(sock: Path, text: str, timeout_s: float = 30.0, poll_s: float = 0.005) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if text in pane(sock).replace("TUNER-EXIT=$?", ""):
            return time.perf_counter()
        time.sleep(poll_s)
    raise SystemExit(f"timed out waiting for {text!r}:\n{pane(sock)}")


def tuner_process(sock: Path) -> psutil.Process:
    shell = psutil.Process(int(tmux(sock, "list-panes", "-t", "m", "-F", "#{pane_pid}").strip()))
    for _ in range(100):
        for child in shell.children(recursive=True):
            if "tuner" in " ".join(child.cmdline()) and "tuner.engine" not in " ".join(child.cmdline()):
                return child
        time.sleep(0.05)
    raise SystemExit("tuner process not found")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--bisect-s", type=float, default=30.0)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tuner-measure-"))
    env = f"env XDG_STATE_HOME={home}/state XDG_CONFIG_HOME={home}/config TERM=xterm-256color"
    sock = home / "tmux.sock"
    tmux(sock, "new-session", "-d", "-s", "m", "-x", "80", "-y", "24", "sh")
    try:
        times_s = []
        for _ in range(args.runs):
            tmux(sock, "send-keys", "-t", "m", "clear", "Enter")
            time.sleep(0.3)
            t0 = time.perf_counter()
            tmux(sock, "send-keys", "-t", "m", f"{env} {TUNER} --simulate; echo TUNER-EXIT=$?", "Enter")
            times_s.append(wait_for(sock, "[1 Dashboard]") - t0)
            time.sleep(1.5)
            tmux(sock, "send-keys", "-t", "m", "q")
            wait_for(sock, "TUNER-EXIT=0", 10)
            time.sleep(0.3)
        print(f"first frame: median {statistics.median(times_s):.3f} s, min {min(times_s):.3f}, "
              f"max {max(times_s):.3f} over {len(times_s)} runs (keystroke to dashboard text in the pane)")

        tmux(sock, "send-keys", "-t", "m", "clear", "Enter")
        tmux(sock, "send-keys", "-t", "m", f"{env} {TUNER} --simulate; echo TUNER-EXIT=$?", "Enter")
        wait_for(sock, "[1 Dashboard]")
        proc = tuner_process(sock)
        tmux(sock, "send-keys", "-t", "m", "3")
        wait_for(sock, "[3 Bisect]")
        tmux(sock, "send-keys", "-t", "m", "b")
        wait_for(sock, "RUNNING", 30)
        time.sleep(3.0)  # the engine is up; the UI is idle from here on
        cpu0, t0, rss = proc.cpu_times(), time.perf_counter(), []
        end = t0 + args.bisect_s
        while time.perf_counter() < end:
            rss.append(proc.memory_info().rss)
            time.sleep(1.0)
        cpu1, t1 = proc.cpu_times(), time.perf_counter()
        used_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        engines = [c for c in proc.children(recursive=True) if "tuner.engine" in " ".join(c.cmdline())]
        print(f"UI process during a simulated bisect ({t1 - t0:.0f} s, engine pids {[e.pid for e in engines]}): "
              f"CPU {100 * used_s / (t1 - t0):.1f} % of one core, RSS median "
              f"{statistics.median(rss) / 2**20:.0f} MiB, max {max(rss) / 2**20:.0f} MiB")
        print("--- bisect pane (80x24) ---\n" + pane(sock))
        tmux(sock, "send-keys", "-t", "m", "1")
        time.sleep(1.5)
        print("--- dashboard pane (80x24) ---\n" + pane(sock))
        tmux(sock, "send-keys", "-t", "m", "q")
        time.sleep(0.5)
        tmux(sock, "send-keys", "-t", "m", "y")
        wait_for(sock, "TUNER-EXIT=", 60)
        print("--- after quit ---\n" + "\n".join(pane(sock).rstrip().splitlines()[-4:]))
    finally:
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True, check=False)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
