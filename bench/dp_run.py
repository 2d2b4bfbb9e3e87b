"""Run one data-parallel engine group (N ranks, one engine process per device) and sum up each rank: the helper of
bench/gpu_check.py's data-parallel section and bench/dp_overhead.py.

    python bench/dp_run.py --devices cpu,cpu --steps 60 [--json]

Each rank: steps/s and tok/s (medians after the warm-up), the share of its loop spent in collectives (the
gradient all-reduce and the per-step agreement, waits for slower peers included), and, with `--replay`, whether a
second group replaying every rank's recording at stock repeated bit for bit (every step compared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_group(devices: list[str], args: list[str], tmp: Path, name: str, timeout_s: float,
              per_rank: list[list[str]] | None = None) -> list[dict]:
    """Start one engine per device (ranks in order), wait, return each rank's events (`end` last when it ended)."""
    world = len(devices)
    common = [] if world == 1 else [f"--world-size={world}", f"--rendezvous=file://{tmp / (name + '.rdv')}",
                                    "--collective-timeout-s=120"]
    procs = []
    for rank, device in enumerate(devices):
        extra = (per_rank or [[]] * world)[rank]
        rank_args = [] if world == 1 else [f"--rank={rank}"]
        procs.append(subprocess.Popen([sys.executable, "-m", "tuner.engine", f"--device={device}", *common,
                                       *rank_args, *args, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=_env(), cwd=REPO))
    out = []
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            stdout, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, _ = p.communicate()
        out.append([json.loads(line) for line in stdout.splitlines() if line.startswith("{")])
    return out


def summarize(events: list[dict]) -> dict:
    start = next((e for e in events if e.get("event") == "start"), {})
    end = next((e for e in events if e.get("event") == "end"), {})
    dp = end.get("data_parallel") or {}
    step_ms = end.get("median_step_ms")
    loop_s = end.get("duration_s") or 0.0
    return {"device": start.get("device"), "rank": dp.get("rank", 0), "verdict": end.get("verdict"),
            "reason": end.get("reason"), "steps": end.get("steps"), "batch_size": start.get("batch_size"),
            "library": dp.get("library"), "steps_per_s": round(1000.0 / step_ms, 2) if step_ms else None,
            "tok_s": end.get("median_tok_s"), "loop_s": loop_s,
            "collective_share": round(dp["collective_s"] / loop_s, 3) if dp.get("collective_s") and loop_s else None,
            "compared_steps": (end.get("reference") or {}).get("compared_steps")}


def data_parallel_check(devices: list[str], steps: int, preset: str, timeout_s: float) -> dict:
    """Record at stock with every rank, replay every rank's recording: per-rank figures and bitwise replay."""
    with tempfile.TemporaryDirectory(prefix="dp-check-") as tmp_s:
        tmp = Path(tmp_s)
        refs = [tmp / f"rank{r}.json" for r in range(len(devices))]
        common = [f"--preset={preset}", f"--steps={steps}", "--canary-every=0", "--canary-every-s=0"]
        rec = run_group(devices, common, tmp, "record", timeout_s / 2, [[f"--record={p}"] for p in refs])
        rows = [summarize(e) for e in rec]
        rep = run_group(devices, common, tmp, "replay", timeout_s / 2, [[f"--reference={p}"] for p in refs])
        for row, events in zip(rows, rep, strict=True):
            s = summarize(events)
            row["replay_verdict"], row["replay_reason"] = s["verdict"], s["reason"]
            row["bitwise_replay"] = s["verdict"] == "pass" and s["compared_steps"] == steps
    return {"devices": devices, "preset": preset, "steps": steps, "ranks": rows}


def format_check(doc: dict) -> str:
    lines = [(f"data-parallel: {len(doc['devices'])} ranks ({', '.join(doc['devices'])}), preset {doc['preset']}, "
             f"{doc['steps']} steps")]
    lines.append(f"  {'rank':<5}{'device':<8}{'library':<8}{'steps/s':>9}{'tok/s':>10}{'all-reduce':>12}  "
                 "bitwise stock replay")
    for r in doc["ranks"]:
        share = "-" if r["collective_share"] is None else f"{r['collective_share'] * 100:.0f} %"
        rep = "yes" if r.get("bitwise_replay") else f"NO ({r.get('replay_verdict')}: {r.get('replay_reason')})"
        if r["verdict"] != "pass":
            rep = f"record {r['verdict']}: {r['reason']}"
        lines.append(f"  {r['rank']:<5}{r['device'] or '-':<8}{r['library'] or '-':<8}{r['steps_per_s'] or 0:>9.1f}"
                     f"{r['tok_s'] or 0:>10,.0f}{share:>12}  {rep}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="cpu,cpu", help="one rank per entry (default cpu,cpu)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    doc = data_parallel_check(args.devices.split(","), args.steps, args.preset, args.timeout_s)
    print(json.dumps(doc) if args.json else format_check(doc))
    return 0 if all(r.get("bitwise_replay") for r in doc["ranks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
