"""Fault campaign: random faults over simulated bisects, and what they left behind (issue 11's benchmark).

Each run starts `tuner --simulate bisect` on a card with a known limit, injects one fault at a random moment, then
lets `--resume` finish the search, and checks:
- card off stock: the card is not at stock once the tool has exited (every fault but a kill -9 of the tuner,
  which leaves nobody to reset it: that case is counted after the resume instead);
- torn files: a JSON state file (journal, unsafe list, reference) that does not parse;
- wrong recommendation: the resumed search recommends something other than an uninterrupted run;
- non-voltage unsafe entries: values on the unsafe list at or above the card's true limit (nothing there is
  unstable, so any entry was caused by the fault, not the voltage).
Goal: every column zero.

Faults: kill -9 of the tuner, kill -9 of the engine, a terminal drop (SIGHUP to the process group), a double
SIGTERM, and a full disk (the state directory on a small tmpfs filled mid-run; needs root to mount, else skipped
and said so).

    .venv/bin/python bench/fault_campaign.py --runs 10 [--seed 1] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
VMIN_MV = -22
BISECT = ["bisect", "--device", "sim0", "--trial", "3s", "--confirm", "3s", "--preset", "tiny", "--json"]
FAULTS = ("kill9-tuner", "kill9-engine", "hangup", "double-term", "disk-full")


def _env(home: Path) -> dict[str, str]:
    root = home / "sysroot"
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("boot-a\n")
    return {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(home / "state"),
            "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home / "cache"),
            "TUNER_SYSFS_ROOT": str(root), "TUNER_SYSTEM_PROFILES": str(home / "etc")}


def _tuner(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tuner", "--simulate", "--sim-vmin", str(VMIN_MV), *args],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)


def _events(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _recommendation(events: list[dict]) -> int | None:
    rec = [e for e in events if e.get("event") == "recommendation"]
    return rec[-1]["setting"] if rec else None


def _card_mv(env: dict[str, str]) -> int | None:
    proc = subprocess.run([sys.executable, "-m", "tuner", "--simulate", "--sim-vmin", str(VMIN_MV), "status",
                           "--json"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    try:
        doc = json.loads(proc.stdout)
        return doc["devices"][0]["knob"]["current"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def _torn_files(state: Path) -> list[str]:
    torn = []
    for path in state.rglob("*"):
        if not path.is_file() or path.suffix not in (".json", ".jsonl"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".jsonl":
                for line in text.splitlines():
                    if line.strip():
                        json.loads(line)
            else:
                json.loads(text)
        except (ValueError, UnicodeDecodeError):
            torn.append(str(path.relative_to(state)))
    return torn


def _unsafe_non_voltage(state: Path) -> list[int]:
    bad = []
    for path in state.rglob("unsafe*"):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                setting = json.loads(line)["setting"]
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(setting, int) and setting >= VMIN_MV:
                bad.append(setting)
    return bad


def _fill(directory: Path) -> None:
    with contextlib.suppress(OSError), open(directory / "filler", "wb") as f:
        while True:
            f.write(b"\0" * 65536)


def _inject(fault: str, proc: subprocess.Popen, state: Path, rng: random.Random) -> None:
    if fault == "kill9-tuner":
        proc.send_signal(signal.SIGKILL)
    elif fault == "kill9-engine":
        children = psutil.Process(proc.pid).children(recursive=True)
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    elif fault == "hangup":
        os.killpg(proc.pid, signal.SIGHUP)
    elif fault == "double-term":
        proc.send_signal(signal.SIGTERM)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    elif fault == "disk-full":
        _fill(state)


def _can_mount() -> bool:
    return os.geteuid() == 0


def one_run(fault: str, after_s: float, seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="fault-") as tmp:
        home = Path(tmp)
        env = _env(home)
        state = home / "state"
        state.mkdir()
        mounted = False
        if fault == "disk-full":
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(state)], check=True)
            mounted = True
        try:
            proc = _tuner(env, *BISECT)
            time.sleep(after_s)
            _inject(fault, proc, state, random.Random(seed))
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            off_stock = fault != "kill9-tuner" and _card_mv(env) not in (0, None)
            with contextlib.suppress(FileNotFoundError):
                (state / "filler").unlink()  # the user frees the disk before resuming
            resumed = _tuner(env, *BISECT, "--resume")
            out, _ = resumed.communicate(timeout=900)
            if _recommendation(_events(out)) is None:  # nothing to resume (the fault came before a session)
                fresh = _tuner(env, *BISECT, "--restart")
                out, _ = fresh.communicate(timeout=900)
            after_resume = _card_mv(env)
            return {"fault": fault, "after_s": after_s, "exit": proc.returncode,
                    "card_off_stock": bool(off_stock or after_resume not in (0, None)),
                    "torn": _torn_files(state), "recommendation": _recommendation(_events(out)),
                    "unsafe_non_voltage": _unsafe_non_voltage(state)}
        finally:
            if mounted:
                subprocess.run(["umount", "-l", str(state)], check=False)


def reference_recommendation() -> int | None:
    with tempfile.TemporaryDirectory(prefix="fault-ref-") as tmp:
        proc = _tuner(_env(Path(tmp)), *BISECT)
        out, _ = proc.communicate(timeout=900)
        return _recommendation(_events(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    faults = [f for f in FAULTS if f != "disk-full" or _can_mount()]
    skipped = [f for f in FAULTS if f not in faults]
    expected = reference_recommendation()
    runs = [one_run(faults[i % len(faults)], round(rng.uniform(0.5, 12.0), 2), rng.randrange(1 << 30))
            for i in range(args.runs)]
    summary = {
        "runs": len(runs),
        "uninterrupted_recommendation_mv": expected,
        "card_left_off_stock": sum(r["card_off_stock"] for r in runs),
        "torn_files": sum(len(r["torn"]) for r in runs),
        "wrong_recommendations": sum(r["recommendation"] != expected for r in runs),
        "unsafe_entries_from_non_voltage_causes": sum(len(r["unsafe_non_voltage"]) for r in runs),
        "skipped_faults": skipped,
    }
    if args.json:
        print(json.dumps({"summary": summary, "runs": runs}, indent=2))
        return 0
    print(f"{'fault':<14}{'at s':>6}{'exit':>6}  {'off stock':<10}{'torn':<6}{'rec mV':>7}  unsafe(non-voltage)")
    for r in runs:
        print(f"{r['fault']:<14}{r['after_s']:>6}{r['exit']!s:>6}  {r['card_off_stock']!s:<10}{len(r['torn']):<6}"
              f"{r['recommendation']!s:>7}  {r['unsafe_non_voltage']}")
    for key, value in summary.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
