"""bench/gpu_check.py, the prepared GPU check, on the CPU: the plan (sections in order, budgets, total), a module
the preflight cannot import named before anything runs, sections that write the --out JSON as they end (so a
check killed at any moment leaves what finished), a timeout that keeps the stderr tail and the last heartbeat, and
the exit code's rule."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import REPO
from tests.polling import wait_until

CHECK = REPO / "bench" / "gpu_check.py"
ORDER = ["preflight", "attention + GEMM", "nanochat record", "nanochat replay", "nanochat, no compile",
         "detection (compile off)", "NVML probe", "detector overhead", "preset tiny", "data-parallel"]
NANOCHAT_SECTIONS = ORDER[2:5]
# the budgets are sized for the GPU machine; on a shared 2-core box importing torch alone can take longer than the
# preflight's 45 s, so the plan tests give it 300 s (and the whole check 270 s more), and the runs more to each
SLOW_BOX = ["--budget", "preflight=300", "--budget-s", "800"]
SLOW_RUN = ["--budget-s", "3000", *(f"--budget={key}=300" for key in ("preflight", "attention", "overhead",
                                                                        "preset-tiny", "data-parallel"))]


@pytest.fixture(scope="module")
def gpu_check():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import gpu_check

        yield gpu_check
    finally:
        sys.path.remove(str(REPO / "bench"))


def _plan(env: dict | None = None) -> tuple[list[tuple[str, float, str]], str]:
    proc = subprocess.run([sys.executable, str(CHECK), "--device", "cpu", "--plan", "--wheels", "", *SLOW_BOX],
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = re.findall(r"^\s+\d+\s+(\S.*?)\s{2,}(\d+)\s+\d+\s+(.*)$", proc.stdout, re.M)
    return [(title, float(budget), note) for title, budget, note in rows], proc.stdout


def test_the_default_plan_fits_520_s_with_the_nanochat_sections_first(gpu_check):
    sections = gpu_check.plan_sections(gpu_check.parse_args(["--device", "cuda:0"]))
    assert [s.title for s in sections] == ORDER
    assert sum(s.budget_s for s in sections if s.key != "data-parallel") == 520  # data-parallel: --dp-steps only
    assert [s.key for s in sections if s.required] == ["preflight", "attention", "nanochat-record",
                                                       "nanochat-replay", "nanochat-eager", "detection"]


def test_the_plan_runs_the_preflight_and_lists_the_sections_in_order_with_budgets_and_total():
    rows, out = _plan()
    assert [r[0] for r in rows] == ORDER
    assert "python " in out and "torch " in out  # the preflight ran first and printed its findings
    total = float(re.search(r"total (\d+) s of 800 s", out).group(1))
    assert total == sum(budget for _, budget, _ in rows) == 510 - 45 + 300  # NVML and data-parallel skipped
    notes = {title: note for title, _, note in rows}
    assert notes["nanochat record"] == "required" and notes["preset tiny"] == "while time is left"
    assert notes["NVML probe"] == "skipped: GPUs only" and notes["data-parallel"] == "skipped: --dp-steps 0"


def test_a_missing_rustbpe_is_named_and_the_nanochat_sections_say_so(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "rustbpe.py").write_text("raise ImportError('rustbpe shadowed by the test')\n")
    env = dict(os.environ, PYTHONPATH=str(shadow))
    rows, out = _plan(env)
    assert "rustbpe missing (ImportError: rustbpe shadowed by the test)" in out
    notes = {title: (budget, note) for title, budget, note in rows}
    for title in NANOCHAT_SECTIONS:
        assert notes[title] == (0.0, "skipped: rustbpe missing"), title
    assert notes["attention + GEMM"][1] == "required"  # the rest still runs


@pytest.mark.heavy(seconds=30)
def test_the_sections_run_in_order_and_each_one_is_written_as_it_ends(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(CHECK), "--device", "cpu", "--sections",
                           "attention,overhead,preset-tiny,data-parallel", "--steps", "4", "--dp-steps", "4",
                           "--wheels", "",
                           *SLOW_RUN, "--cache-dir", str(tmp_path / "cache"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    sections = doc["sections"]
    assert [sections[k]["title"] for k in sections] == ORDER  # written in the plan's order
    assert sections["preflight"]["status"] == "ok" and sections["attention"]["status"] == "ok"
    rows = {r["row"]: r for r in sections["attention"]["rows"]}
    assert rows["causal (math)"]["bitwise_repeat"] and rows["math window"]["bitwise_repeat"]
    assert rows["flash window"]["ok"] is None  # not on the CPU, and said so
    assert rows["gemm"]["tflops"] > 0
    tiny = sections["preset-tiny"]
    assert tiny["status"] == "ok" and tiny["replay"]["repeatable"] is True and tiny["record"]["steps"] == 4
    assert [(r["rank"], r["bitwise_replay"]) for r in sections["data-parallel"]["ranks"]] == [(0, True), (1, True)]
    overhead = sections["overhead"]
    assert overhead["status"] == "ok", overhead
    assert overhead["result"]["engine"]["compared_steps"] > 0 and overhead["result"]["ratio"] > 0
    assert overhead["result"]["same_switches_as_engine"] is True  # the bare loop ran under the engine's switches
    for key in ("nanochat-record", "detection"):
        assert sections[key]["status"] == "skipped: not selected (--sections)"
    assert doc["exit_code"] == 0
    assert "[" in proc.stdout and "preset tiny" in proc.stdout  # each section printed its row


def test_a_killed_check_leaves_the_sections_that_ended_and_nothing_running(tmp_path):
    out = tmp_path / "check.json"
    cache = tmp_path / "cache-of-this-test"
    proc = subprocess.Popen([sys.executable, str(CHECK), "--device", "cpu", "--sections", "attention,preset-tiny",
                             "--steps", "10000000", "--wheels", "", *SLOW_RUN, "--cache-dir", str(cache),
                             "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            if out.exists() and "attention" in json.loads(out.read_text())["sections"]:
                break
            assert proc.poll() is None, "the check ended before it was killed"
            time.sleep(0.2)
        else:
            pytest.fail("the attention section never ended")
        # the tiny preset's engine is running (or starting) now
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    doc = json.loads(out.read_text())
    ran = [key for key, r in doc["sections"].items() if not r["status"].startswith("skipped")]
    assert ran == ["preflight", "attention"] and doc["sections"]["attention"]["status"] == "ok"
    assert "preset-tiny" not in doc["sections"]  # killed while it ran: not written

    def children() -> list[int]:
        pids = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and str(cache) in (entry / "cmdline").read_text():
                    pids.append(int(entry.name))
            except OSError:
                continue
        return [pid for pid in pids if _alive(pid)]

    deadline = time.monotonic() + 60
    while children() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = children()
    for pid in left:  # a failure must not leave a 10,000,000-step engine burning a core for the rest of the run
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert left == []  # the engine went with the check (parent-death signal)


def test_a_timed_out_process_keeps_its_stderr_tail_and_last_heartbeat_and_its_group_is_killed(gpu_check, tmp_path,
                                                                                             monkeypatch):
    ready = tmp_path / "ready"
    child = ("import json, pathlib, subprocess, sys, time\n"
             "grandchild = subprocess.Popen(['sleep', '600'])\n"
             "print(json.dumps({'event': 'heartbeat', 'step': 1, 'state': 'train', 'progress': 1}), flush=True)\n"
             "print(json.dumps({'event': 'heartbeat', 'step': 3, 'state': 'train', 'progress': 3,"
             " 'grandchild': grandchild.pid}), flush=True)\n"
             "print('engine: compiling, stuck', file=sys.stderr, flush=True)\n"
             "pathlib.Path(sys.argv[1]).touch()\n"
             "time.sleep(600)\n")

    class StartsTheTimeoutOnceTheChildWrote(subprocess.Popen):
        """run_process's timed wait begins only after the child wrote its heartbeats and stderr line (program
        state, not a guess at how long a loaded box takes to start Python), so its 1 s timeout is enough."""

        def wait(self, timeout=None):
            if timeout is not None:
                wait_until(ready.exists, 120, "the child's heartbeats and stderr line")
            return super().wait(timeout)

    monkeypatch.setattr(subprocess, "Popen", StartsTheTimeoutOnceTheChildWrote)
    p = gpu_check.run_process([sys.executable, "-c", child, str(ready)], 1.0, dict(os.environ))
    assert p.timed_out and p.code is None
    fields = gpu_check.timeout_fields(p)
    assert fields["last_heartbeat"]["step"] == 3 and "compiling, stuck" in fields["stderr_tail"]
    grandchild = fields["last_heartbeat"]["grandchild"]
    deadline = time.monotonic() + 30
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)  # killed with the group


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_exit_code_fails_a_required_section_that_did_not_run_but_not_an_optional_one(gpu_check, tmp_path):
    def code_for(statuses: dict[str, str]) -> int:
        check = gpu_check.Check(gpu_check.parse_args(["--device", "cpu", "--wheels", ""]))
        for s in check.sections:
            check.doc["sections"][s.key] = {"status": statuses.get(s.key, "ok")}
        return check.summary()

    assert code_for({}) == 0
    assert code_for({"preset-small": "not run (budget)", "data-parallel": "skipped: --dp-steps 0"}) == 0
    assert code_for({"nanochat-record": "skipped: rustbpe missing"}) == 1
    assert code_for({"nanochat-eager": "not run (budget)"}) == 1
    assert code_for({"nanochat-replay": "not repeatable"}) == 1
    assert code_for({"preset-tiny": "timed out"}) == 1


def test_a_child_whose_check_died_before_its_parent_death_signal_was_set_ends_itself(gpu_check):
    """The kernel sends the parent-death signal only for a death after the prctl: a check killed between the fork
    and the prctl (a killed check once left its engine running 13 minutes) must not leave the child running. Here
    the child is told to expect another parent, as it would find after such a death."""
    not_our_parent = os.getpid() + 1_000_000
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             preexec_fn=functools.partial(gpu_check._child_setup, not_our_parent))
    try:
        assert child.wait(timeout=30) == 137
    finally:
        if child.poll() is None:
            child.kill()
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            preexec_fn=functools.partial(gpu_check._child_setup, os.getpid()))
    try:  # with its real parent alive it runs on
        time.sleep(0.5)
        assert ours.poll() is None
    finally:
        ours.kill()
        ours.wait()


# The child behind the test below: runs the engine's CLI (tiny preset, 2 steps, the CPU) after loading the nanochat
# preset's tokenizer libraries, then prints every top-level module that was imported.
_IMPORTS_OF_AN_ENGINE = """
import json, runpy, sys
from tuner.engine import tokenizer
tokenizer._libraries()
sys.argv = ["tuner.engine", "--preset", "tiny", "--steps", "2", "--cache-dir", sys.argv[1], "--canary-every-s", "0"]
try:
    runpy.run_module("tuner.engine", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in list(sys.modules)})}), file=sys.stderr)
"""


def _requirements(dist: str) -> set[str]:
    """`dist` and everything it requires (its extras left out), by distribution name, lower case."""
    import importlib.metadata as md

    seen: set[str] = set()
    todo = [dist]
    while todo:
        name = re.split(r"[<>=!~;\[ (]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [r for r in requires if "extra ==" not in r]
    return seen


@pytest.mark.heavy(seconds=4)
def test_every_module_an_engine_imports_is_one_the_gpu_preflight_checks_and_the_wheel_script_fetches(tmp_path):
    """The lent GPU image holds torch and a fixed package list, nothing else, and nothing can be fetched there: a
    module the engine imports that the preflight does not name fails every engine section on the first lent GPU
    (msgspec, once the event schema used it). Each module an engine process imports, beyond the standard library,
    the tuner and torch with its requirements, must be in gpu_preflight.NEEDED."""
    import importlib.metadata as md

    sys.path.insert(0, str(REPO / "bench"))
    try:
        import gpu_preflight
    finally:
        sys.path.remove(str(REPO / "bench"))
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_OF_AN_ENGINE, str(tmp_path / "cache")], capture_output=True,
                          text=True, timeout=300, cwd=REPO, check=False)
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["code"] == 0, proc.stderr[-2000:]
    owners = md.packages_distributions()
    allowed = _requirements("torch") | {d.lower() for d in gpu_preflight.NEEDED.values()}
    foreign = {}
    for module in result["modules"]:
        if module in sys.stdlib_module_names or module in ("tuner", "__main__") or module.startswith("_"):
            continue
        dists = {d.lower().replace("_", "-") for d in owners.get(module, [module])}
        if not dists & allowed:
            foreign[module] = sorted(dists)
    assert foreign == {}, f"add these to bench/gpu_preflight.py NEEDED (and IMAGE_HAS if the image has them): {foreign}"
    assert "msgspec" in result["modules"] and "rustbpe" in result["modules"]  # the check saw what it checks
    # what the wheel script fetches: each needed distribution the image lacks, at the version this checkout runs
    fetched = {req.split("==")[0] for req in gpu_preflight.fetch_list()}
    assert fetched == {d for d in gpu_preflight.NEEDED.values() if d not in gpu_preflight.IMAGE_HAS}
    assert "msgspec" in fetched and "rustbpe" in fetched
