"""One prepared check of the stress engine on a lent GPU, in an order that keeps the most valuable figures when the
window is short: each section has its own budget, prints its row and rewrites the `--out` JSON as soon as it ends.

    python bench/gpu_check.py [--device cuda:0] [--out FILE] [--json] [--plan] [--budget-s 520]
        [--wheels DIR] [--sections KEYS] [--budget KEY=S ...] [--presets tiny] [--cache-dir DIR]

Sections, in order (`--plan` runs the preflight and prints them with their budgets and what would be skipped):
 1. preflight: installs the prepared wheels (`--wheels`, default .whl/ when it exists: scripts/prepare-gpu-wheels.sh)
    with `pip install --no-index --no-deps --target DIR` and puts DIR on the children's PYTHONPATH, then
    bench/gpu_preflight.py: versions, the GPU, imports, allocator settings, free memory, the attention kernel of
    each nanochat layer; a missing module is named here, and the sections that need it say so instead of failing;
 2. attention: bench/gpu_attention.py at the nanochat shape under deterministic mode (flash causal, math with the
    window mask, flash with window_size: time, peak memory, bitwise repeatability) and one large GEMM, the TFLOP/s
    ceiling;
 3. nanochat record: `python -m tuner.engine --preset nanochat --record` (setup time including compile and the
    batch fit, the fitted batch, ms/step, tok/s, MFU against the data sheet and against the measured GEMM);
 4. nanochat replay: a second process replays the recording (`--verify-repeatable`): bit for bit or the first
    differing step and figure;
 5. nanochat without compile, at the record's batch (stepping down where only the compiled step fits it): ms/step,
    tok/s, MFU; what compile buys, as the record's tokens a second over these;
 6. detection: bench/engine_detection.py Part D on the device in bf16, compile off (it injects);
 7. NVML: bench/nvml_probe.py, read only (NVIDIA);
 8. detector overhead: bench/engine_throughput.py at the nanochat preset, compile off, at section 5's batch: the
    engine with every detector against a bare training loop of the same model (and the bare loop under torch's
    defaults: what determinism costs), steps sized to the budget from section 5's step time;
 9. the small presets (`--presets`, default tiny): record and replay each, while time is left;
10. data-parallel (`--dp-steps`, 0 by default: one GPU is lent): bench/dp_run.py over every visible GPU.
A section runs as its own processes under its budget (`--budget KEY=S` changes one); one that times out is killed
with its process group and keeps its stderr tail and the engine's last heartbeat. A section starts only with at
least half its budget left of `--budget-s` (520 by default; the budgets sum to it), else it is "not run (budget)",
which is reported apart from "not repeatable". Exit 0 when every section that ran passed and no required one
(1-6) was skipped; 1 otherwise. `--device cpu` runs the same plan on the CPU with small sizes (tested).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
sys.path[:0] = [str(BENCH), str(REPO)]  # a sibling script; the checkout (the GPU machine does not install it)

from gpu_nanochat import peak_tflops

from tuner.engine.lifeline import set_parent_death_signal  # torch-free

TOTAL_BUDGET_S = 520.0
STDERR_TAIL_CHARS = 2000
# what an engine process imports beyond torch (tuner/engine/events.py, the event schema), and the nanochat preset
# beyond that (tuner/engine/tokenizer.py): without them the sections that run it are skipped, and say why
ENGINE_NEEDS = ("msgspec",)
NANOCHAT_NEEDS = (*ENGINE_NEEDS, "rustbpe", "tiktoken")
PRESET_STEPS_GPU = {"tiny": 200, "small": 200, "large": 60}


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    budget_s: float
    required: bool = True
    needs: tuple[str, ...] = ()  # modules the preflight must find
    gpu_only: bool = False


def plan_sections(args: argparse.Namespace) -> list[Section]:
    """The sections in order, with their default budgets (seconds; they sum to 520)."""
    sections = [
        # about twice what each took on the first lent H200 (a fresh machine, cold caches; docs/engine.md): 9.5,
        # 10.3, 59.4 (50.5 of it setup: the tokenizer, the batch fit, the compile), 27.0, 15.7, 16.4, 0.2, 57.2 s
        Section("preflight", "preflight", 45),
        Section("attention", "attention + GEMM", 30),
        Section("nanochat-record", "nanochat record", 130, needs=NANOCHAT_NEEDS),
        Section("nanochat-replay", "nanochat replay", 60, needs=NANOCHAT_NEEDS),
        Section("nanochat-eager", "nanochat, no compile", 40, needs=NANOCHAT_NEEDS),
        Section("detection", "detection (compile off)", 40, needs=ENGINE_NEEDS),
        Section("nvml", "NVML probe", 10, required=False, needs=("pynvml",), gpu_only=True),
        Section("overhead", "detector overhead", 90, required=False, needs=NANOCHAT_NEEDS),
    ]
    # tiny took 61 s there (record and replay, each compiling: setup 27.3 s); 25 s timed it out in its compile
    preset_budgets = {"tiny": 75.0, "small": 90.0, "large": 150.0}
    for preset in [p for p in args.presets.split(",") if p]:
        sections.append(Section(f"preset-{preset}", f"preset {preset}", preset_budgets.get(preset, 60.0),
                                required=False, needs=ENGINE_NEEDS))
    sections.append(Section("data-parallel", "data-parallel", 60.0, required=False, needs=ENGINE_NEEDS))
    out = []
    for s in sections:
        if s.key in args.budget:
            s = Section(s.key, s.title, args.budget[s.key], s.required, s.needs, s.gpu_only)
        out.append(s)
    return out


# --- processes -----------------------------------------------------------------------------------------------------

@dataclass
class Proc:
    code: int | None  # None: killed at its timeout
    stdout: str
    stderr_tail: str
    wall_s: float
    events: list[dict] = field(default_factory=list)

    @property
    def timed_out(self) -> bool:
        return self.code is None

    def last(self, name: str) -> dict | None:
        return next((e for e in reversed(self.events) if e.get("event") == name), None)

    def first(self, name: str) -> dict | None:
        return next((e for e in self.events if e.get("event") == name), None)


def _json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _child_setup(check_pid: int) -> None:
    """In the child, before exec: its own process group (a timeout kills the whole group: Inductor's compile
    workers too) and SIGKILL when this check dies (a `timeout -s KILL` of the check leaves nothing running).
    A check that died between the fork and the prctl sends no signal, ever: the child then ends itself (a fresh
    clone's test run once found an engine still running 60 s after the check was killed)."""
    os.setpgid(0, 0)
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != check_pid:
        os._exit(137)


def run_process(cmd: list[str], timeout_s: float, env: dict[str, str]) -> Proc:
    """Run `cmd` with stdout and stderr in files (so a timeout keeps what was written), kill its group at the
    timeout."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=REPO,
                                preexec_fn=functools.partial(_child_setup, os.getpid()))
        try:
            code: int | None = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            code = None
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return Proc(code, stdout, stderr[-STDERR_TAIL_CHARS:], round(time.monotonic() - t0, 1), _json_lines(stdout))


def timeout_fields(p: Proc) -> dict:
    """What a timed-out or failed process leaves: the stderr tail and the engine's last heartbeat."""
    return {"stderr_tail": p.stderr_tail, "last_heartbeat": p.last("heartbeat"), "wall_s": p.wall_s}


# --- the check -----------------------------------------------------------------------------------------------------

class Check:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.gpu = args.device.startswith(("cuda", "hip"))
        self.sections = plan_sections(args)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget_s
        self.tmp = Path(tempfile.gettempdir())  # run() makes its own folder (references, installed wheels)
        self.site: Path | None = None
        self.doc: dict = {"format": "tuner-gpu-check", "version": 1, "device": args.device, "budget_s": args.budget_s,
                          "plan": [], "sections": {}, "wall_s": 0.0}
        self.preflight: dict = {}

    # environment of every child: the checkout, the caller's PYTHONPATH (so a test can shadow a module), then the
    # installed wheels
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        parts = [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if self.site is not None:
            parts.append(str(self.site))
        env["PYTHONPATH"] = os.pathsep.join(parts)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def write(self) -> None:
        """Rewrite --out atomically, so a check killed at any moment leaves the sections that ended."""
        self.doc["wall_s"] = round(self.elapsed(), 1)
        if not self.args.out:
            return
        path = Path(self.args.out)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str))
        os.replace(tmp, path)

    def say(self, text: str) -> None:
        if not self.args.json:
            print(text, flush=True)

    # --- skipping ---

    def missing(self, needs: tuple[str, ...]) -> list[str]:
        mods = self.preflight.get("modules") or {}
        return [m for m in needs if m in mods and not mods[m].get("ok")]

    def skip_reason(self, s: Section) -> str | None:
        """Why `s` will not run, known before it starts (the plan shows the same)."""
        if self.args.sections and s.key not in self.args.sections:
            return "skipped: not selected (--sections)"
        if s.key != "preflight" and self.preflight.get("no_gpu"):
            return f"skipped: {self.preflight['no_gpu']}"
        if s.gpu_only and not self.gpu:
            return "skipped: GPUs only"
        gone = self.missing(("torch", *s.needs))  # every section after the preflight runs torch
        if gone:
            return "skipped: " + ", ".join(f"{m} missing" for m in gone)
        if s.key == "data-parallel":
            gpus = (self.preflight.get("gpu") or {}).get("count") or 0
            if self.args.dp_steps <= 0:
                return "skipped: --dp-steps 0"
            if self.gpu and gpus < 2:
                return f"skipped: {gpus} GPU visible (NCCL needs one device per rank)"
        if s.key == "nanochat-replay" and "nanochat-record" in self.doc["sections"]:
            rec = self.doc["sections"]["nanochat-record"]
            if rec.get("status") != "ok":
                return "skipped: the record did not pass"
        record = self.doc["sections"].get("nanochat-record")
        if s.key == "nanochat-eager" and record is not None and not record.get("batch_size"):
            return "skipped: no fitted batch (the record did not start)"
        return None

    # --- running ---

    def run(self) -> int:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            self.tmp = Path(tmp)
            return self._run()

    def _run(self) -> int:
        self.section_preflight(self.sections[0])
        self.print_plan()
        self.write()
        if self.args.plan:
            return 0
        for s in self.sections[1:]:
            reason = self.skip_reason(s)
            timeout_s = min(s.budget_s, self.left())
            if reason is None and timeout_s < s.budget_s / 2:
                reason = "not run (budget)"
            if reason is not None:
                self.finish(s, {"status": reason})
                continue
            t = time.monotonic()
            result = getattr(self, "section_" + s.key.split("-")[0])(s, timeout_s)
            result.setdefault("wall_s", round(time.monotonic() - t, 1))
            self.finish(s, result)
        return self.summary()

    def finish(self, s: Section, result: dict) -> None:
        result = {"title": s.title, "budget_s": s.budget_s, "required": s.required, **result}
        self.doc["sections"][s.key] = result
        self.write()
        self.say(self.format_row(s, result))

    def format_row(self, s: Section, r: dict) -> str:
        head = f"[{self.elapsed():5.0f} s] {s.title:<24} {r['status']}"
        lines = [head]
        for line in r.get("lines", []):
            lines.append(f"             {line}")
        if r.get("status") in ("timed out", "failed"):
            hb = r.get("last_heartbeat")
            if hb:
                lines.append(f"             last heartbeat: {json.dumps(hb)}")
            tail = (r.get("stderr_tail") or "").strip().splitlines()[-6:]
            lines += [f"             stderr: {t[:200]}" for t in tail]
        return "\n".join(lines)

    # 1. preflight
    def section_preflight(self, s: Section) -> None:
        t = time.monotonic()
        lines: list[str] = []
        wheels = self.install_wheels(s.budget_s / 2, lines)
        p = run_process([sys.executable, str(BENCH / "gpu_preflight.py"), "--device", self.args.device],
                        max(5.0, min(s.budget_s, self.left()) - (time.monotonic() - t)), self.env())
        docs = [e for e in p.events if "modules" in e]
        if not docs:
            result = {"status": "timed out" if p.timed_out else "failed", "wheels": wheels, **timeout_fields(p)}
            self.preflight = {}
            self.finish(s, {**result, "lines": lines})
            return
        pf = docs[-1]
        self.preflight = pf
        gpu = pf.get("gpu") or {}
        if self.gpu and (gpu.get("error") or not gpu.get("cuda_available")):
            pf["no_gpu"] = f"no GPU ({gpu.get('error') or 'torch sees none'})"
        tv = pf.get("torch") or {}
        lines.append(f"python {pf.get('python')}; torch {tv.get('version')} (CUDA {tv.get('cuda')}, HIP "
                     f"{tv.get('hip')}, cuDNN {tv.get('cudnn')}, Triton {tv.get('triton')})")
        if gpu.get("name"):
            lines.append(f"{gpu['name']} (sm {'.'.join(map(str, gpu.get('capability') or []))}, "
                         f"{gpu.get('multiprocessors')} SMs) at {gpu.get('pci_bus_id')}; {gpu.get('count')} GPU(s); "
                         f"{gpu.get('free_memory_gib')} of {gpu.get('total_memory_gib')} GiB free; driver "
                         f"{gpu.get('driver')}")
            lines.append(f"allocator {gpu.get('allocator_backend')}, {json.dumps(pf.get('allocator_conf'))}; "
                         f"flash built: {gpu.get('flash_built')}")
            lines += [f"nvidia-smi: {line}" for line in (gpu.get("nvidia_smi") or "").splitlines()]
        att = pf.get("attention") or {}
        if att.get("layers"):
            lines.append(f"nanochat layers (windows {att.get('windows')}): {' '.join(att['layers'])} "
                         f"({att.get('dtype')}, deterministic {att.get('switches', {}).get('deterministic')})")
        elif att.get("error"):
            lines.append(f"attention plan: {att['error']}")
        mods = pf.get("modules") or {}
        lines.append("imports: " + ", ".join(f"{n} {m.get('version')}" for n, m in mods.items() if m.get("ok")))
        for name in pf.get("missing") or []:
            lines.append(f"{name} missing ({mods[name].get('error')})")
        if pf.get("environment_notes"):
            lines += [f"environment: {n}" for n in pf["environment_notes"]]
        status = "ok"
        if pf.get("no_gpu"):
            status = "failed"
            lines.append(pf["no_gpu"])
        elif pf.get("missing"):
            status = "ok, " + ", ".join(f"{m} missing" for m in pf["missing"])
        self.finish(s, {"status": status, "wheels": wheels, "report": pf, "lines": lines,
                        "wall_s": round(time.monotonic() - t, 1)})

    def install_wheels(self, timeout_s: float, lines: list[str]) -> dict:
        if self.args.wheels == "":
            lines.append("wheels: none (--wheels '')")
            return {"folder": None, "installed": []}
        folder = Path(self.args.wheels) if self.args.wheels is not None else REPO / ".whl"
        wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
        if not wheels:
            lines.append(f"wheels: none prepared ({folder}; scripts/prepare-gpu-wheels.sh fetches them)")
            return {"folder": str(folder), "installed": []}
        site = self.tmp / "site"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--disable-pip-version-check", "--upgrade", "--target", str(site),
               *map(str, wheels)]
        p = run_process(cmd, timeout_s, dict(os.environ))
        names = [w.name for w in wheels]
        if p.code == 0:
            self.site = site
            lines.append(f"wheels: installed {', '.join(names)} into {site} (on the children's PYTHONPATH)")
            return {"folder": str(folder), "installed": names, "target": str(site)}
        why = "timed out" if p.timed_out else (p.stderr_tail.strip().splitlines() or ["pip failed"])[-1][:300]
        lines.append(f"wheels: NOT installed ({why})")
        return {"folder": str(folder), "installed": [], "error": why}

    def print_plan(self) -> None:
        self.doc["plan"] = []
        lines = [f"plan for {self.args.device} ({self.args.budget_s:g} s in all):",
                 f"  {'#':>2}  {'section':<24} {'budget s':>8} {'ends by':>8}  note"]
        at = 0.0
        total = 0.0
        for i, s in enumerate(self.sections, 1):
            reason = None if s.key == "preflight" else self.skip_reason(s)
            budget = 0.0 if reason else s.budget_s
            at += budget
            total += budget
            note = reason or ("required" if s.required else "while time is left")
            if not reason and at > self.args.budget_s:
                note = "not run (budget) unless earlier sections end early"
            self.doc["plan"].append({"key": s.key, "title": s.title, "budget_s": budget, "note": note})
            lines.append(f"  {i:>2}  {s.title:<24} {budget:>8.0f} {at:>8.0f}  {note}")
        lines.append(f"  total {min(total, self.args.budget_s):.0f} s of {self.args.budget_s:g} s")
        self.doc["plan_total_s"] = min(total, self.args.budget_s)
        if self.args.json and self.args.plan:
            print(json.dumps({"plan": self.doc["plan"], "total_s": self.doc["plan_total_s"],
                              "preflight": self.doc["sections"].get("preflight")}, default=str))
        elif not self.args.json:
            print("\n".join(lines), flush=True)

    # 2. attention + GEMM
    def section_attention(self, s: Section, timeout_s: float) -> dict:
        cmd = [sys.executable, str(BENCH / "gpu_attention.py"), "--device", self.args.device]
        if not self.gpu:
            cmd += ["--seq-len", "512", "--repeats", "1", "--gemm-n", "512"]
        p = run_process(cmd, timeout_s, self.env())
        rows = [e for e in p.events if "row" in e]
        lines = []
        for r in rows:
            if r["row"] == "setup":
                continue
            if r.get("ok") is None:
                lines.append(f"{r['row']:<16} {r.get('skipped')}")
            elif not r.get("ok"):
                lines.append(f"{r['row']:<16} FAILED: {r.get('error')}")
            elif r["row"] == "gemm":
                lines.append(f"{'gemm':<16} {r['n']}^3 {r['dtype']}: {r['median_ms']:.2f} ms, {r['tflops']:g} TFLOP/s")
            else:
                diff = r.get("rel_diff_vs_math_window")
                lines.append(f"{r['row']:<16} {r['median_ms']:9.2f} ms {r['tflops']:9.4g} TFLOP/s  peak "
                             f"{r['peak_gib']} GiB  bitwise {'yes' if r['bitwise_repeat'] else 'NO'}"
                             + ("" if diff is None else f"  vs math window {diff:.2e}"))
        ran = [r for r in rows if r["row"] != "setup" and r.get("ok") is not None]
        status = "ok"
        if p.timed_out:
            status = "timed out"
        elif p.code != 0 or any(not r["ok"] for r in ran) or not ran:
            status = "failed"
        elif any(r.get("bitwise_repeat") is False for r in ran):
            status = "not repeatable"
        elif any(r.get("agrees_with_math_window") is False for r in ran):
            status = "failed"
            lines.append("flash window does not compute what math window does (relative difference above "
                         "5e-2): its layers would train another model")
        gemm = next((r for r in ran if r["row"] == "gemm" and r.get("ok")), None)
        out = {"status": status, "rows": rows, "lines": lines,
               "gemm_tflops": gemm["tflops"] if gemm else None}
        if status != "ok":
            out.update(timeout_fields(p))
        return out

    # 3-5. nanochat
    def engine_cmd(self, *extra: str) -> list[str]:
        cmd = [sys.executable, "-m", "tuner.engine", "--device", self.args.device, "--canary-every", "0",
               "--canary-every-s", "0", *extra]
        if self.args.cache_dir:
            cmd += ["--cache-dir", self.args.cache_dir]
        return cmd

    def nanochat_steps(self) -> int:
        return self.args.nanochat_steps or (60 if self.gpu else 3)

    def engine_figures(self, p: Proc) -> dict:
        start, end = p.first("start") or {}, p.last("end") or {}
        ms = end.get("median_step_ms")
        flops = start.get("flops_per_step")
        peak = peak_tflops(start.get("device_name") or "")
        ceiling = (self.doc["sections"].get("attention") or {}).get("gemm_tflops")
        achieved = flops / (ms / 1e3) / 1e12 if ms and flops else None
        return {
            "exit": p.code, "verdict": end.get("verdict"), "kind": end.get("kind"), "reason": end.get("reason"),
            "setup_s": start.get("t"), "batch_size": start.get("batch_size"),
            "tokens_per_step": start.get("tokens_per_step"), "compile": start.get("compile"),
            "attention_kernels": start.get("attention_kernels"), "kernels": start.get("kernels"),
            "start_repeatability": start.get("repeatability"), "setup_problems": start.get("setup_problems"),
            "steps": end.get("steps"), "median_step_ms": ms, "median_tok_s": end.get("median_tok_s"),
            "tflops": None if achieved is None else round(achieved, 3),
            "mfu": None if achieved is None or not peak else round(achieved / peak, 4),
            "mfu_of_measured_gemm": None if achieved is None or not ceiling else round(achieved / ceiling, 4),
            "peak_bf16_tflops": peak, "wall_s": p.wall_s,
        }

    def engine_line(self, f: dict) -> str:
        def num(v, fmt):
            return "-" if v is None else format(v, fmt)
        return (f"setup {num(f['setup_s'], '.1f')} s, batch {f['batch_size']}, compile {f['compile']}, "
                f"{num(f['median_step_ms'], '.1f')} ms/step, {num(f['median_tok_s'], ',.0f')} tok/s, "
                f"{num(f['tflops'], '.3g')} TFLOP/s, MFU {num(f['mfu'], '.1%')} (of the measured GEMM "
                f"{num(f['mfu_of_measured_gemm'], '.1%')})")

    def engine_status(self, p: Proc, f: dict) -> str:
        if p.timed_out:
            return "timed out"
        if f["kind"] == "not-repeatable":
            return "not repeatable"
        return "ok" if p.code == 0 and f["verdict"] == "pass" else "failed"

    def section_nanochat(self, s: Section, timeout_s: float) -> dict:
        return getattr(self, "nanochat_" + s.key.split("-", 1)[1])(timeout_s)

    def nanochat_record(self, timeout_s: float) -> dict:
        ref = self.tmp / "nanochat.json"
        p = run_process(self.engine_cmd("--preset", "nanochat", "--steps", str(self.nanochat_steps()),
                                        "--record", str(ref)), timeout_s, self.env())
        f = self.engine_figures(p)
        status = self.engine_status(p, f)
        f.update(status=status, reference=str(ref) if ref.exists() else None,
                 lines=[self.engine_line(f), (f"attention {' '.join(f['attention_kernels'] or [])}; start-up check "
                                              f"{json.dumps(f['start_repeatability'])}")])
        if status != "ok":
            f.update(timeout_fields(p))
            f["lines"].append(f"reason: {f['reason']}")
        return f

    def nanochat_replay(self, timeout_s: float) -> dict:
        rec = self.doc["sections"].get("nanochat-record") or {}
        ref = rec.get("reference")
        if not ref:
            return {"status": "skipped: no recording"}
        p = run_process(self.engine_cmd("--preset", "nanochat", "--steps", str(self.nanochat_steps()),
                                        "--reference", ref, "--verify-repeatable"), timeout_s, self.env())
        f = self.engine_figures(p)
        doc = json.loads(Path(ref).read_text())
        f.update(repeatable=doc.get("repeatable"), first_difference=doc.get("first_difference"),
                 replayed_steps=doc.get("replayed_steps"))
        status = self.engine_status(p, f)
        if status == "ok" and f["repeatable"] is not True:
            status = "not repeatable"
        diff = f["first_difference"]
        f.update(status=status, lines=[
            f"bitwise across processes: {'yes' if f['repeatable'] else 'NO' if f['repeatable'] is False else '-'}"
            f" ({f['replayed_steps']} steps)" + (f"; first difference step {diff['step']} {diff['figure']}"
                                                 if diff else ""),
            self.engine_line(f)])
        if status != "ok":
            f.update(timeout_fields(p))
            f["lines"].append(f"reason: {f['reason']}")
        return f

    def nanochat_eager(self, timeout_s: float) -> dict:
        rec = self.doc["sections"].get("nanochat-record") or {}
        # fewer steps than the compiled runs (eager steps are slower; 10 steady steps after the warm-up's 20 on GPUs)
        steps = min(self.nanochat_steps(), 30)
        p = run_process(self.engine_cmd("--preset", "nanochat", "--steps", str(steps), "--no-compile",
                                        "--batch-size", str(rec["batch_size"])), timeout_s, self.env())
        f = self.engine_figures(p)
        status = self.engine_status(p, f)
        # by tokens a second: the eager kernels may not fit the record's batch (its fit can take one that only the
        # compiled step fits) and then step down
        speedup = None
        if f["median_tok_s"] and rec.get("median_tok_s"):
            speedup = round(rec["median_tok_s"] / f["median_tok_s"], 3)
        f.update(status=status, compile_speedup=speedup, lines=[
            self.engine_line(f) + ("" if speedup is None else f"; compiled {speedup:g}x the tokens a second")])
        if status != "ok":
            f.update(timeout_fields(p))
            f["lines"].append(f"reason: {f['reason']}")
        return f

    # 6. detection
    def section_detection(self, s: Section, timeout_s: float) -> dict:
        trials = self.args.detection_trials or (3 if self.gpu else 1)
        cmd = [sys.executable, str(BENCH / "engine_detection.py"), "--parts", "D", "--trials", str(trials),
               "--device", self.args.device, "--dtypes", "bf16", "--preset", "tiny", "--json"]
        p = run_process(cmd, timeout_s, self.env())
        docs = [e for e in _json_lines(p.stdout) if "sites" in e]
        if p.timed_out or p.code != 0 or not docs:
            return {"status": "timed out" if p.timed_out else "failed", **timeout_fields(p)}
        det = docs[-1]
        sites = det["sites"]
        tot = sum(x["consequential"] for x in sites)
        own = sum(x["caught_own_step"] for x in sites)
        tol = sum(x["tolerance_own_step"] for x in sites)
        note = next((ln for ln in p.stderr_tail.splitlines() if "compile" in ln), None)
        lines = [(f"{own}/{tot} consequential flips caught bit for bit on their own step; tolerance {tol}/{tot} "
                  f"({trials} per site, tiny preset, bf16)")]
        lines += [f"{x['site']:<25} {x['caught_own_step']}/{x['consequential']} own step, tolerance "
                  f"{x['tolerance_own_step']}/{x['consequential']}" for x in sites]
        if note:
            lines.append(note)
        return {"status": "ok", "trials": trials, "sites": sites, "caught_own_step": own, "consequential": tot,
                "tolerance_own_step": tol, "compile_note": note, "lines": lines}

    # 7. NVML
    def section_nvml(self, s: Section, timeout_s: float) -> dict:
        probe = BENCH / "nvml_probe.py"
        if not probe.exists():
            return {"status": "skipped: bench/nvml_probe.py is not there"}
        p = run_process([sys.executable, str(probe)], timeout_s, self.env())
        text = (p.stdout + p.stderr_tail).strip()[-4000:]
        status = "timed out" if p.timed_out else ("ok" if p.code == 0 else "failed")
        return {"status": status, "report": text, "lines": text.splitlines()[-20:]}

    # 8. detector overhead
    def section_overhead(self, s: Section, timeout_s: float) -> dict:
        """engine_throughput.py's three loops in one process, compile off (three compiles would not fit), steps
        sized so the four runs (bare, bare default, the engine's recording and its compared run) take about half
        the budget at the eager step time section 5 measured; the CPU runs the tiny preset."""
        eager = self.doc["sections"].get("nanochat-eager") or {}
        record = self.doc["sections"].get("nanochat-record") or {}
        cmd = [sys.executable, str(BENCH / "engine_throughput.py"), "--device", self.args.device, "--no-compile",
               "--rounds", "1", "--json"]
        if self.gpu:
            step_s = (eager.get("median_step_ms") or 500.0) / 1e3
            steps = int(max(10, min(100, 0.5 * timeout_s / (4 * step_s) - 5)))
            cmd += ["--preset", "nanochat", "--steps", str(steps), "--warmup", "5"]
            # the batch the eager run took (the record's, or the one eager kernels stepped down to): the bare
            # loops run eager at exactly that batch, with no fit of their own
            batch = eager.get("batch_size") or record.get("batch_size")
            if batch:
                cmd += ["--batch-size", str(batch)]
        else:
            steps = 6
            cmd += ["--preset", "tiny", "--steps", str(steps), "--warmup", "2"]
        from tuner.core.paths import cache_dir  # torch-free: the engine's default cache

        # the tokenizer the nanochat record trained (and cached there), not a fresh one trained inside the budget
        env = dict(self.env(), TUNER_BENCH_CACHE=self.args.cache_dir or str(cache_dir()))
        p = run_process(cmd, timeout_s, env)
        docs = [e for e in _json_lines(p.stdout) if "ratio" in e]
        if p.timed_out or p.code != 0 or not docs:
            return {"status": "timed out" if p.timed_out else "failed", "steps": steps, **timeout_fields(p)}
        r = docs[-1]
        bare, default, eng = r["bare"], r["bare_default"], r["engine"]
        goal = "met" if r["meets_goal"] else "NOT met"
        lines = [f"{r['preset']}, compile off, batch {bare['batch']}, {steps} steady steps, 1 round",
                 f"bare default {default['tok_s']:,.0f} tok/s ({default['median_step_ms']:.1f} ms/step)",
                 f"bare deterministic {bare['tok_s']:,.0f} tok/s ({bare['median_step_ms']:.1f} ms/step)",
                 (f"engine {eng['tok_s']:,.0f} tok/s ({eng['median_step_ms']:.1f} ms/step, {eng['compared_steps']} "
                 f"steps compared, {eng['canaries']} canaries)"),
                 f"detectors: engine / bare deterministic {r['ratio']:.3f} (goal >= {r['goal']:.2f}: {goal})",
                 (f"determinism: bare deterministic / bare default {r['determinism_ratio']:.3f}; same switches as "
                 f"the engine: {r['same_switches_as_engine']}")]
        return {"status": "ok", "steps": steps, "result": r, "lines": lines}

    # 9. presets
    def section_preset(self, s: Section, timeout_s: float) -> dict:
        preset = s.key.split("-", 1)[1]
        steps = self.args.steps or (PRESET_STEPS_GPU.get(preset, 100) if self.gpu else 8)
        ref = self.tmp / f"{preset}.json"
        end_by = time.monotonic() + timeout_s
        common = ["--preset", preset, "--steps", str(steps)]
        rec = run_process(self.engine_cmd(*common, "--record", str(ref)), timeout_s, self.env())
        f = self.engine_figures(rec)
        status = self.engine_status(rec, f)
        out = {"steps": steps, "record": f}
        lines = [f"record: {self.engine_line(f)}"]
        if status == "ok":
            left = end_by - time.monotonic()
            if left < 5:
                status = "not run (budget): the replay"
            else:
                rep = run_process(self.engine_cmd(*common, "--reference", str(ref), "--verify-repeatable"), left,
                                  self.env())
                g = self.engine_figures(rep)
                doc = json.loads(ref.read_text())
                g.update(repeatable=doc.get("repeatable"), first_difference=doc.get("first_difference"))
                out["replay"] = g
                status = self.engine_status(rep, g)
                if status == "ok" and g["repeatable"] is not True:
                    status = "not repeatable"
                diff = g["first_difference"]
                lines.append(f"replay: bitwise {'yes' if g['repeatable'] else 'NO'}"
                             + (f", first difference step {diff['step']} {diff['figure']}" if diff else ""))
                if status != "ok":
                    out.update(timeout_fields(rep))
        else:
            out.update(timeout_fields(rec))
            lines.append(f"reason: {f['reason']}")
        return {"status": status, **out, "lines": lines}

    # 10. data-parallel
    def section_data(self, s: Section, timeout_s: float) -> dict:
        from dp_run import data_parallel_check, format_check

        gpus = (self.preflight.get("gpu") or {}).get("count") or 0
        devices = ["cpu", "cpu"] if not self.gpu else [f"cuda:{i}" for i in range(gpus)]
        preset = "tiny" if not self.gpu else "nanochat"
        try:
            dp = data_parallel_check(devices, self.args.dp_steps, preset, timeout_s=timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": "timed out"}
        ok = all(r.get("bitwise_replay") for r in dp["ranks"])
        return {"status": "ok" if ok else "not repeatable", **dp, "lines": format_check(dp).splitlines()}

    def summary(self) -> int:
        bad = []
        for s in self.sections:
            r = self.doc["sections"].get(s.key) or {}
            st = r.get("status", "")
            failed = st in ("failed", "timed out", "not repeatable") or st.startswith("not run (budget):")
            # a required section that did not run at all (unless --sections left it out) fails the check too
            not_run = s.required and st.startswith(("skipped", "not run")) and "not selected" not in st
            if failed or not_run:
                bad.append(f"{s.title}: {st}")
        code = 1 if bad else 0
        self.doc["problems"] = bad
        self.doc["exit_code"] = code
        self.write()
        if self.args.json:
            print(json.dumps(self.doc, default=str))
        else:
            print(f"({self.elapsed():.0f} s; {'every section that ran passed' if not bad else '; '.join(bad)})")
        return code


def _budget(text: str) -> tuple[str, float]:
    m = re.fullmatch(r"([a-z-]+)=(\d+(?:\.\d+)?)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad --budget {text!r}: use KEY=SECONDS, e.g. nanochat-record=200")
    return m.group(1), float(m.group(2))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--plan", action="store_true", help="run the preflight, print the sections and budgets, stop")
    ap.add_argument("--budget-s", type=float, default=TOTAL_BUDGET_S,
                    help=f"the whole check's time (default {TOTAL_BUDGET_S:g}); nothing starts that would not fit")
    ap.add_argument("--budget", type=_budget, action="append", default=[], metavar="KEY=S",
                    help="one section's budget in seconds (keys: see --plan's JSON)")
    ap.add_argument("--sections", default=None, help="only these section keys, comma-separated (preflight always)")
    ap.add_argument("--wheels", default=None, help="wheels to install before anything runs (default .whl/ when it "
                    "exists; '' for none)")
    ap.add_argument("--presets", default="tiny", help="the small presets, run while time is left (default "
                    "tiny; small and large on request)")
    ap.add_argument("--steps", type=int, default=None, help="steps per process of the small presets (default: tiny "
                    "and small 200, large 60 on GPUs; 8 on the CPU)")
    ap.add_argument("--nanochat-steps", type=int, default=None, help="steps per nanochat process (default 60 on "
                    "GPUs, 3 on the CPU)")
    ap.add_argument("--detection-trials", type=int, default=None, help="flips per site (default 3 on GPUs, 1 on "
                    "the CPU)")
    ap.add_argument("--dp-steps", type=int, default=0, help="steps per rank of the data-parallel section (default "
                    "0: off)")
    ap.add_argument("--cache-dir", default=None, help="the engine's cache (tokenizer, compiled kernels); default "
                    "its own ($XDG_CACHE_HOME/tuner)")
    ap.add_argument("--json", action="store_true", help="print one JSON document at the end instead of rows")
    ap.add_argument("--out", help="write the JSON document here, rewritten after every section")
    args = ap.parse_args(argv)
    args.budget = dict(args.budget)
    args.sections = None if args.sections is None else {"preflight", *args.sections.split(",")}
    return args


def main(argv: list[str] | None = None) -> int:
    return Check(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
