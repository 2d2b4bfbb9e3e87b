"""What the root helper costs: request round trips, and a simulated bisect through it against in-process.

Starts a simulated `tuner-helper` (as this user: run it as root for the group check, any user with --simulate)
on a private socket and state directory, then:

1. p50/p99 of a read round trip (`read_knob`, and `read_telemetry`) and of a set round trip (`set` with a lease,
   read back), through `tuner.backends.helper_client.HelperBackend` (the client every command uses), N each;
2. the same simulated bisect (`--sim-vmin -22 --trial 6s --confirm 8s --preset tiny --step 10 --resolution 5
   --margin 10`, the end-to-end test's) in-process and through the helper, alternately, R times each: wall time,
   trials run (a loaded machine makes some trials too short to count, and they run again), wall time per trial,
   and the recommendation. The ratio of wall time per trial (helper / in-process) is the figure the goal
   (<= 1.01) is about: the extra trials a busy machine adds are not the helper's.

    .venv/bin/python bench/helper_latency.py [--n 2000] [--repeats 2] [--no-bisect]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.backends.helper_client import HelperBackend
from tuner.helper.server import wait_for_socket

REPO = Path(__file__).resolve().parent.parent
BISECT = ["--simulate", "--sim-vmin", "-22", "bisect", "--device", "sim0", "--trial", "6s", "--confirm", "8s",
          "--preset", "tiny", "--step", "10", "--resolution", "5", "--margin", "10", "--json"]


def percentiles(samples_s: list[float]) -> str:
    ordered = sorted(samples_s)
    p50 = statistics.median(ordered) * 1e6
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6
    return f"p50 {p50:7.0f} us   p99 {p99:7.0f} us   (n={len(ordered)})"


def timed(call, n: int) -> list[float]:
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        samples.append(time.perf_counter() - t0)
    return samples


def start_helper(base: Path) -> subprocess.Popen:
    sock = base / "run" / "helper.sock"
    sock.parent.mkdir(parents=True)
    group = "root" if os.geteuid() == 0 else subprocess.run(["id", "-gn"], capture_output=True,
                                                             text=True).stdout.strip()
    proc = subprocess.Popen([sys.executable, "-m", "tuner.helper", "--simulate", "--sim-vmin", "-22", "--socket",
                             str(sock), "--group", group, "--state-dir", str(base / "state")], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    if not wait_for_socket(sock, 60):
        proc.kill()
        raise SystemExit("the helper did not start")
    return proc


def bisect(env: dict[str, str]) -> tuple[float, int, str]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tuner", *BISECT], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=1800)
    wall = time.monotonic() - t0
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    trials = sum(e["event"] == "trial_finished" for e in events)
    rec = next((e for e in events if e["event"] == "recommendation"), None)
    answer = f"{rec['setting']:+d} mV (confirmed {rec['confirmed']:+d})" if rec else f"exit {proc.returncode}"
    return wall, trials, answer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000, help="round trips per request kind (default 2000)")
    p.add_argument("--repeats", type=int, default=2, help="bisects per side (default 2)")
    p.add_argument("--no-bisect", action="store_true", help="round trips only")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tuner-helper-bench-"))
    helper = start_helper(base)
    sock = base / "run" / "helper.sock"
    try:
        backend = HelperBackend.connect(sock, client="bench/helper_latency.py", lease_s=30)
        try:
            print(f"round trips through the helper (simulated card, {os.cpu_count()} CPUs, "
                  f"load {os.getloadavg()[0]:.1f}):")
            print(f"  read_knob       {percentiles(timed(lambda i: backend.knob('sim0'), args.n))}")
            print(f"  read_telemetry  {percentiles(timed(lambda i: backend.telemetry('sim0'), args.n))}")
            sets = timed(lambda i: backend.apply("sim0", -5 * (1 + i % 4)), args.n)
            print(f"  set (+read back, durable journal) {percentiles(sets)}")
            backend.reset("sim0")
        finally:
            backend.close()
        if args.no_bisect:
            return
        runs: dict[str, list[tuple[float, int, str]]] = {"in-process": [], "helper": []}
        for r in range(args.repeats):
            for side in ("in-process", "helper"):
                env = {"XDG_STATE_HOME": str(base / f"user-{side}-{r}")}
                if side == "helper":
                    env["TUNER_HELPER_SOCKET"] = str(sock)
                wall, trials, answer = bisect(env)
                runs[side].append((wall, trials, answer))
                print(f"  bisect {side:10s} run {r + 1}: {wall:6.1f} s, {trials} trials "
                      f"({wall / max(1, trials):5.2f} s/trial), recommends {answer}", flush=True)
        per_trial = {side: statistics.median(w / max(1, t) for w, t, _ in v) for side, v in runs.items()}
        total = {side: statistics.median(w for w, _, _ in v) for side, v in runs.items()}
        print(f"wall time per trial, helper / in-process: {per_trial['helper'] / per_trial['in-process']:.3f} "
              f"(medians {per_trial['helper']:.2f} / {per_trial['in-process']:.2f} s)")
        print(f"wall time per bisect, helper / in-process: {total['helper'] / total['in-process']:.3f} "
              f"(medians {total['helper']:.1f} / {total['in-process']:.1f} s)")
    finally:
        helper.send_signal(signal.SIGTERM)
        helper.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
