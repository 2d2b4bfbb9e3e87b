"""One prepared check of the stress engine on a real GPU (issue 12): versions, the GPU, the kernels chosen, each
preset's repeatability across two engine processes, a short bf16 detection run, and throughput per preset.

    python bench/gpu_check.py [--device cuda:0] [--presets nanochat,tiny,small,large] [--steps 120]
        [--budget-s 450] [--detection-trials 3] [--nanochat-steps 40] [--json] [--out FILE]

For each preset: process 1 records a reference (`--record`, steps bounded), process 2 replays it at the same
settings (`--verify-repeatable`) and compares every step bit for bit; the reference file then says whether it
repeated and, if not, the first differing step and figure. Throughput (median tok/s, median TFLOP/s after the
warm-up) comes from process 1. The detection run is `bench/engine_detection.py --parts D` on the same device in
bf16 (single-bit flips at every site of a training step). If `bench/nvml_probe.py` exists (a read-only NVML probe)
it runs first. Nothing is downloaded; the engine trains on the Python standard library's sources.

The `nanochat` preset (issue 14) is checked like the others, compiled as on any GPU (so its replay is the
repeatability proof with compile on), and then gets its own section (`bench/gpu_nanochat.py`): tok/s and MFU
against the GPU's peak dense bf16 rate with compile on and off (`--nanochat-steps`, 0 skips it; GPUs only).

The data-parallel section (issue 16, `bench/dp_run.py`): one engine rank per device, gradients all-reduced every
step (nccl over every visible GPU; `--device cpu`: 2 gloo ranks on the CPU; a single GPU: skipped, NCCL needs one
device per rank), each rank recording at stock and replaying its recording: steps/s per rank, bitwise stock
replay per rank, and the share of the loop spent in collectives (`--dp-steps`, 0 skips it). NVML is only read.

Sized for an H200 to finish in under 8 minutes: `--budget-s` (default 450) skips whatever would start after it,
and says so. `--device cpu --presets tiny --steps 8 --detection-trials 1` runs it on a CPU (tested).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS_BY_PRESET = {"tiny": 200, "small": 200, "large": 60, "nanochat": 60}


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_engine(args: list[str], timeout_s: float) -> tuple[int | None, list[dict], str]:
    """(exit code or None on timeout, events, stderr tail)."""
    cmd = [sys.executable, "-m", "tuner.engine", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_env(), cwd=REPO,
                              check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, _events(out), "timed out"
    return proc.returncode, _events(proc.stdout), proc.stderr[-1500:]


def _events(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _one(events: list[dict], name: str) -> dict:
    return next((e for e in events if e.get("event") == name), {})


def check_preset(device: str, preset: str, steps: int, timeout_s: float, tmp: Path) -> dict:
    ref = tmp / f"{preset}.json"
    common = ["--device", device, "--preset", preset, "--steps", str(steps), "--canary-every", "0",
              "--canary-every-s", "0"]
    code, events, err = run_engine([*common, "--record", str(ref)], timeout_s)
    start, end = _one(events, "start"), _one(events, "end")
    row = {"preset": preset, "steps": steps, "record_exit": code, "record_verdict": end.get("verdict"),
           "record_reason": end.get("reason") or err.strip().splitlines()[-1:] or None,
           "dtype": start.get("dtype"), "batch_size": start.get("batch_size"),
           "tokens_per_step": start.get("tokens_per_step"), "kernels": start.get("kernels"),
           "kernel_env": start.get("kernel_env"), "start_repeatability": start.get("repeatability"),
           "median_tok_s": end.get("median_tok_s"), "median_tflops": None, "repeatable": None,
           "first_difference": None, "replay_exit": None, "start": start}
    warm = start.get("warmup_steps") or 0
    tf = [e["tflops"] for e in events if e.get("event") == "step" and e.get("step", 0) > warm and e.get("tflops")]
    row["median_tflops"] = round(statistics.median(tf), 4) if tf else None
    if code != 0 or not ref.exists():
        return row
    code, events, err = run_engine([*common, "--reference", str(ref), "--verify-repeatable"], timeout_s)
    end = _one(events, "end")
    doc = json.loads(ref.read_text())
    row.update(replay_exit=code, replay_verdict=end.get("verdict"), replay_reason=end.get("reason"),
               repeatable=doc.get("repeatable"), first_difference=doc.get("first_difference"))
    return row


def detection(device: str, trials: int, timeout_s: float) -> dict | None:
    cmd = [sys.executable, str(REPO / "bench" / "engine_detection.py"), "--parts", "D", "--trials", str(trials),
           "--device", device, "--dtypes", "bf16", "--preset", "tiny", "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_env(), cwd=REPO,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def nvml_probe(timeout_s: float) -> str | None:
    probe = REPO / "bench" / "nvml_probe.py"
    if not probe.exists():
        return None
    try:
        proc = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=timeout_s,
                              env=_env(), cwd=REPO, check=False)
    except subprocess.TimeoutExpired:
        return "nvml_probe.py: timed out"
    return (proc.stdout + proc.stderr).strip()[-4000:]


def versions() -> dict:
    code = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
            "'hip': torch.version.hip, 'cudnn': torch.backends.cudnn.version() if torch.backends.cudnn.is_available()"
            " else None, 'gpus': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env(),
                          check=False)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": proc.stderr.strip()[-300:]}


def print_report(doc: dict) -> None:
    v = doc["versions"]
    print(f"python {doc['python']}; torch {v.get('torch')} (CUDA {v.get('cuda')}, HIP {v.get('hip')}, cuDNN "
          f"{v.get('cudnn')}); GPUs: {', '.join(v.get('gpus') or []) or 'none'}")
    first = next((r for r in doc["presets"] if r.get("start")), None)
    if first:
        s = first["start"]
        print(f"device {s.get('device')}: {s.get('device_name')} at {s.get('pci_bus_id')}; driver "
              f"{s.get('driver_version')}; deterministic mode {s.get('deterministic_mode')}")
        print(f"kernels: {json.dumps(s.get('kernels'))}")
        print(f"kernel environment: {json.dumps(s.get('kernel_env'))}")
    if doc.get("nvml_probe"):
        print("nvml_probe:\n  " + doc["nvml_probe"].replace("\n", "\n  "))
    print(f"{'preset':<7}{'dtype':<6}{'batch':>6}{'steps':>7}  {'bitwise across processes':<26}{'first diff':<18}"
          f"{'tok/s':>12}{'TFLOP/s':>9}  {'start-up check'}")
    for r in doc["presets"]:
        rep = {True: "yes", False: "NO", None: "not run"}[r["repeatable"]]
        if r["record_verdict"] != "pass":
            rep = f"record {r['record_verdict'] or 'failed'}"
        diff = r["first_difference"]
        diff_s = "-" if not diff else f"step {diff.get('step')} {diff.get('figure')}"
        tok = "-" if r["median_tok_s"] is None else f"{r['median_tok_s']:,.0f}"
        tfl = "-" if r["median_tflops"] is None else f"{r['median_tflops']:g}"
        print(f"{r['preset']:<7}{r['dtype'] or '-':<6}{r['batch_size'] or '-':>6}{r['steps']:>7}  {rep:<26}"
              f"{diff_s[:17]:<18}{tok:>12}{tfl:>9}  {json.dumps(r['start_repeatability'])}")
        if r["record_verdict"] != "pass":
            print(f"    record: {r['record_reason']}")
        elif r["repeatable"] is False:
            print(f"    replay: {r.get('replay_reason')}")
    det = doc.get("detection")
    if det and det.get("sites"):
        tot = sum(s["consequential"] for s in det["sites"])
        own = sum(s["caught_own_step"] for s in det["sites"])
        tol = sum(s["tolerance_own_step"] for s in det["sites"])
        print(f"bf16 detection (tiny preset on the device, {det.get('trials')} flips per site): {own}/{tot} "
              f"consequential flips caught bit for bit on their own step; tolerance mode {tol}/{tot}")
        for s in det["sites"]:
            print(f"  {s['site']:<25} {s['caught_own_step']}/{s['consequential']} own step, tolerance "
                  f"{s['tolerance_own_step']}/{s['consequential']}")
    elif det:
        print(f"bf16 detection: {det.get('error')}")
    if doc.get("nanochat"):
        sys.path.insert(0, str(REPO / "bench"))
        from gpu_nanochat import format_rows

        rows = doc["nanochat"]
        if rows and rows[0].get("config") == "error":
            print(f"nanochat section: {rows[0]['reason']}")
        else:
            print(format_rows(rows))
    if doc.get("data_parallel"):
        sys.path.insert(0, str(REPO / "bench"))
        from dp_run import format_check

        print(format_check(doc["data_parallel"]))
    for line in doc["skipped"]:
        print(f"skipped: {line}")
    print(f"({doc['wall_s']:.0f} s)")


def data_parallel_section(args: argparse.Namespace, doc: dict, left_s: float) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from dp_run import data_parallel_check

    gpus = doc["versions"].get("gpus") or []
    if args.device == "cpu":
        devices = ["cpu", "cpu"]
    elif len(gpus) >= 2:
        devices = [f"cuda:{i}" for i in range(len(gpus))]
    else:
        doc["skipped"].append(f"data-parallel section ({len(gpus)} GPU visible; NCCL needs one device per rank)")
        return
    if left_s < 60:
        doc["skipped"].append("data-parallel section (budget)")
        return
    preset = args.dp_preset or ("tiny" if args.device == "cpu" else "nanochat")
    doc["data_parallel"] = data_parallel_check(devices, args.dp_steps, preset, timeout_s=max(60.0, left_s / 2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--presets", default="nanochat,tiny,small,large")
    ap.add_argument("--steps", type=int, default=None, help="steps per process (default: tiny/small 200, large 60)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="start nothing new after this (default 450)")
    ap.add_argument("--detection-trials", type=int, default=3, help="flips per site in the bf16 run (0: skip)")
    ap.add_argument("--nanochat-steps", type=int, default=40,
                    help="steps per run of the nanochat section, compile on and off (0: skip; GPUs only)")
    ap.add_argument("--dp-steps", type=int, default=60,
                    help="steps per rank of the data-parallel section (0: skip)")
    ap.add_argument("--dp-preset", default=None, help="its preset (default tiny on the CPU, nanochat on GPUs)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the report")
    ap.add_argument("--out", help="also write the JSON document here")
    args = ap.parse_args(argv)
    t0 = time.monotonic()

    def left() -> float:
        return args.budget_s - (time.monotonic() - t0)

    doc: dict = {"python": sys.version.split()[0], "device": args.device, "versions": versions(),
                 "nvml_probe": nvml_probe(60), "presets": [], "detection": None, "skipped": [], "nanochat": None,
                 "data_parallel": None}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for preset in args.presets.split(","):
            if left() < 30:
                doc["skipped"].append(f"preset {preset} (budget)")
                continue
            steps = args.steps or STEPS_BY_PRESET.get(preset, 100)
            doc["presets"].append(check_preset(args.device, preset, steps, max(30.0, left() / 2), Path(tmp)))
    if args.nanochat_steps > 0 and args.device.startswith(("cuda", "hip")):
        if left() > 60:
            sys.path.insert(0, str(REPO / "bench"))
            from gpu_nanochat import nanochat_section

            try:
                doc["nanochat"] = nanochat_section(args.device, args.nanochat_steps, timeout_s=max(60.0, left() / 2))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                doc["nanochat"] = [{"config": "error", "reason": str(e)[:300]}]
        else:
            doc["skipped"].append("nanochat section (budget)")
    if args.dp_steps > 0:
        data_parallel_section(args, doc, left())
    if args.detection_trials > 0:
        if left() > 20:
            doc["detection"] = detection(args.device, args.detection_trials, max(20.0, left()))
        else:
            doc["skipped"].append("bf16 detection (budget)")
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    for r in doc["presets"]:
        if not args.json:
            continue
        r.pop("start", None)
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    if args.json:
        print(json.dumps(doc, default=str))
    else:
        print_report(doc)
    ok = all(r["repeatable"] for r in doc["presets"]) and bool(doc["presets"])
    if doc.get("data_parallel"):
        ok = ok and all(r.get("bitwise_replay") for r in doc["data_parallel"]["ranks"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
