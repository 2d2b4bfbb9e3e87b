"""What data-parallel costs on the CPU: one engine alone vs two gloo ranks (the simulated cards' rig confirmation).

    python bench/dp_overhead.py [--steps 200] [--repeats 3] [--preset tiny] [--json]

For each configuration, `--repeats` runs of `--steps` training steps (no canaries); reported: each rank's median
steps/s, the total tokens/s of the group (the sum over ranks), and the share of the loop the ranks spent in
collectives (the gradient all-reduce, the per-step agreement, and waiting for the slower rank). Medians over the
repeats. On a box with fewer cores than ranks the ranks share cores: the total is what the machine gives, not what
two devices would.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dp_run import run_group, summarize


def measure(ranks: int, steps: int, repeats: int, preset: str) -> dict:
    runs = []
    with tempfile.TemporaryDirectory(prefix="dp-overhead-") as tmp:
        for i in range(repeats):
            events = run_group(["cpu"] * ranks, [f"--preset={preset}", f"--steps={steps}", "--canary-every=0",
                                                 "--canary-every-s=0"], Path(tmp), f"r{ranks}-{i}", 600.0)
            rows = [summarize(e) for e in events]
            if any(r["verdict"] != "pass" for r in rows):
                return {"ranks": ranks, "error": "; ".join(f"rank {r['rank']}: {r['reason']}" for r in rows)}
            runs.append(rows)

    def med(key: str, rank: int) -> float | None:
        vals = [run[rank][key] for run in runs if run[rank][key] is not None]
        return round(statistics.median(vals), 3) if vals else None

    per_rank = [{"rank": r, "steps_per_s": med("steps_per_s", r), "tok_s": med("tok_s", r),
                 "collective_share": med("collective_share", r)} for r in range(ranks)]
    total = statistics.median(sum(row["tok_s"] or 0 for row in run) for run in runs)
    return {"ranks": ranks, "per_rank": per_rank, "total_tok_s": round(total, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    doc = {"cpus": os.cpu_count(), "preset": args.preset, "steps": args.steps, "repeats": args.repeats,
           "configs": [measure(n, args.steps, args.repeats, args.preset) for n in (1, 2)]}
    if args.json:
        print(json.dumps(doc))
        return 0
    print(f"{doc['cpus']} CPUs, preset {args.preset}, {args.steps} steps, median of {args.repeats} runs")
    print(f"{'ranks':<6}{'steps/s per rank':<24}{'total tok/s':>12}  all-reduce share per rank")
    for c in doc["configs"]:
        if "error" in c:
            print(f"{c['ranks']:<6}error: {c['error']}")
            continue
        sps = ", ".join(f"{r['steps_per_s']:.1f}" for r in c["per_rank"])
        share = ", ".join("-" if r["collective_share"] is None else f"{r['collective_share'] * 100:.0f} %"
                          for r in c["per_rank"])
        print(f"{c['ranks']:<6}{sps:<24}{c['total_tok_s']:>12,.0f}  {share}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
