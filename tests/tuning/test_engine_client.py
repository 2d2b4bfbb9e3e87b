"""tuner.tuning.engine_client: config -> argv, tolerant event parsing, the watchdog, stop(), result classification.

Most runs use a fake engine script (fast, no torch); a few run the real engine."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.engine.examples import EXAMPLES
from tests.polling import wait_until
from tuner.core.errors import UsageError
from tuner.core.models import StressTarget
from tuner.engine.events import (
    CanaryEvent,
    EndEvent,
    Event,
    FaultEvent,
    GemmEvent,
    HeartbeatEvent,
    InvalidEvent,
    LogEvent,
    PhaseEvent,
    SegmentEvent,
    StartEvent,
    StepEvent,
    UnknownEvent,
    WarningEvent,
    decode_line,
)
from tuner.engine.options import EngineOptions, Injection, parse_args
from tuner.engine.patterns import match_device_error
from tuner.tuning import engine_client as sc

FAKE = Path(__file__).parent.parent / "engine" / "fake_engine.py"
FAST = sc.WatchdogPolicy(min_silence_s=0.6, silence_factor=20, first_step_timeout_s=1.5, kill_grace_s=0.5,
                         poll_s=0.05)


@pytest.fixture
def fake_python(tmp_path):
    """An executable that runs the fake engine whatever "-u -m tuner.engine" arguments it gets."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def config(**options) -> sc.EngineConfig:
    return sc.EngineConfig(EngineOptions(**options))


def fake_run(fake_python, mode, *, policy=FAST, **options):
    options.setdefault("steps", 5)
    cfg = sc.EngineConfig(EngineOptions(**options), python=fake_python, env={"FAKE_ENGINE_MODE": mode})
    return sc.StressRun(cfg, watchdog=policy)


def finish(run, on_event=None):
    """start() (if needed), deliver every event to `on_event`, the result (the tuner's callers loop themselves)."""
    if run.proc is None:
        run.start()
    for ev in run.events():
        if on_event is not None:
            on_event(ev)
    return run.result()


# --- the request ------------------------------------------------------------------------------------------


def test_argv_is_the_engine_options_rendered_and_parses_back():
    opts = EngineOptions(device="cuda:1", preset="small", steps=100, duration_s=90, seed=3, dtype="bf16",
                         record="r.json", canary_every=50, fault_rate=0.25, idle_gap_s=1.0,
                         injections=[Injection.parse("hang@5"), Injection.parse("nan@9")],
                         expect_pci_bus_id="0000:03:00.0")
    a = sc.EngineConfig(opts).argv()
    assert a[:4] == [sys.executable, "-u", "-m", "tuner.engine"]
    for part in ("--device=cuda:1", "--preset=small", "--steps=100", "--duration=90", "--seed=3", "--dtype=bf16",
                 "--record=r.json", "--fault-rate=0.25", "--inject=hang@5", "--inject=nan@9", "--canary-every=50",
                 "--expect-pci-bus-id=0000:03:00.0", "--idle-gap-s=1.0", f"--parent-pid={os.getpid()}"):
        assert part in a
    assert parse_args(a[4:], environ={}) == replace(opts, parent_pid=os.getpid())
    assert not any(x.startswith("--fault-rate") for x in config(steps=1).argv())
    assert "--fault-seed=-50" in config(steps=1, fault_seed=-50).argv()
    assert not any(x.startswith("--fault-seed") for x in config(steps=1).argv())


def test_a_run_the_engine_would_refuse_is_refused_before_it_starts():
    with pytest.raises(UsageError, match="nothing bounds the run"):
        config()
    with pytest.raises(UsageError, match="--reference-loop"):
        config(steps=1, reference_loop=True)


def test_environment_is_unbuffered_and_finds_the_package():
    env = sc.EngineConfig(EngineOptions(steps=1), env={"CUDA_VISIBLE_DEVICES": "1"}).environ({"PYTHONPATH": "/x"})
    assert env["PYTHONUNBUFFERED"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "1"
    root = env["PYTHONPATH"].split(":")[0]
    assert (Path(root) / "tuner" / "engine" / "__main__.py").exists() and env["PYTHONPATH"].endswith(":/x")


def test_request_for_simulated_and_real_targets():
    sim = sc.engine_request(StressTarget("cpu", None, fault_rate=0.3, hang=True, simulated=True), setting=-40)
    o = sim.options
    assert (o.preset, o.fault_rate, [str(i) for i in o.injections], o.duration_s) == ("tiny", 0.3, ["hang@3"], 300.0)
    assert o.fault_seed == sc.fault_seed_for(0, -40) and o.expect_pci_bus_id is None
    real = sc.engine_request(StressTarget("cuda:0", "0000:03:00.0", env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
                             mode="mixed", duration_s=60, dtype=None, canary_every=None)
    o = real.options
    assert (o.preset, o.mode, o.expect_pci_bus_id, o.injections) == ("nanochat", "mixed", "0000:03:00.0", [])
    assert (o.dtype, o.canary_every, o.fault_seed) == ("auto", 100, None)  # None: the engine's default
    assert real.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    with pytest.raises(UsageError):
        sc.engine_request(StressTarget("gpu0", None), steps=5)


def test_watchdog_policy_limits_and_validation():
    p = sc.WatchdogPolicy(first_step_timeout_s=5, silence_factor=10, kill_grace_s=2, min_silence_s=3)
    assert (p.first_step_timeout_s, p.silence_factor, p.kill_grace_s) == (5, 10, 2)
    assert p.limit_s(None) == 3 and p.limit_s(0.1) == 3 and p.limit_s(1.0) == 10
    d = sc.WatchdogPolicy()
    assert (d.min_silence_s, d.silence_factor, d.first_step_timeout_s, d.kill_grace_s) == (60, 20, 600, 30)
    for bad in (0, -1, True, "5"):
        with pytest.raises(ValueError):
            sc.WatchdogPolicy(min_silence_s=bad)
    assert sc.WatchdogPolicy.for_config(config(steps=1)).min_silence_s < 60
    assert sc.WatchdogPolicy.for_config(config(steps=1, device="cuda:0")) == d


# --- events -----------------------------------------------------------------------------------------------


def _line(name: str, **fields) -> str:
    return json.dumps({"event": name, "t": 1.5, **EXAMPLES[name], **fields})


def test_parse_typed_events():
    step = decode_line(_line("step", step=7, loss="NaN", dt_ms=12, tok_s=4000.5))
    assert isinstance(step, StepEvent) and step.step == 7 and math.isnan(step.loss) and step.dt_ms == 12.0
    assert step.name == "step" and step.raw["tok_s"] == 4000.5 and step.t == 1.5
    end = decode_line(_line("end", verdict="fail", kind="mismatch", step=7, steps=7, exit_code=1,
                               eval_losses=[1.5, "Infinity"], setup_problems=["x"], figure="loss",
                               reference={"path": "r", "reference_steps": 7, "compared_steps": 7,
                                          "beyond_reference_steps": 0, "note": None, "tolerance": None,
                                          "loop": False, "segments": 1}))
    assert isinstance(end, EndEvent) and end.verdict == "fail" and end.eval_losses == (1.5, math.inf)
    assert end.reference is not None and end.reference.compared_steps == 7 and end.setup_problems == ("x",)
    assert end.figure == "loss"  # declared: a reader never digs it out of `raw`
    fault = decode_line(_line("fault", kind="mismatch", step=100, reference_step=40, figure="state"))
    assert isinstance(fault, FaultEvent) and (fault.kind, fault.step, fault.reference_step, fault.figure) == \
        ("mismatch", 100, 40, "state")
    hb = decode_line(_line("heartbeat", step=4, state="train", progress=9))
    assert isinstance(hb, HeartbeatEvent) and hb.progress == 9
    start = decode_line(_line("start", repeatable=False, data_parallel={
        "world_size": 2, "rank": 1, "backend": "gloo", "library": "gloo", "collectives": 3, "collective_s": 0.1}))
    assert isinstance(start, StartEvent) and start.repeatable is False and start.data_parallel.library == "gloo"
    for name, cls in (("canary", CanaryEvent), ("warning", WarningEvent), ("phase", PhaseEvent),
                      ("gemm", GemmEvent), ("segment", SegmentEvent)):
        assert isinstance(decode_line(_line(name)), cls)


def test_unexpected_lines_never_raise():
    assert isinstance(decode_line("Traceback (most recent call last):"), LogEvent)
    assert isinstance(decode_line("[1,2]"), LogEvent)
    future = decode_line('{"event":"future","t":1,"x":2}')  # a newer engine's event: kept, not an error
    assert isinstance(future, UnknownEvent) and future.name == "future" and future.raw["x"] == 2
    newer = decode_line(_line("step", newer_field=[1]))  # a newer engine's field: ignored, kept in raw
    assert isinstance(newer, StepEvent) and newer.raw["newer_field"] == [1]
    wrong = decode_line('{"event":"step","t":"soon","step":"seven","loss":[1]}')
    assert isinstance(wrong, InvalidEvent) and wrong.name == "step" and math.isnan(wrong.t)
    assert "step" in wrong.problem
    missing = decode_line('{"event":"start","t":0.1,"repeatable":false}')
    assert isinstance(missing, InvalidEvent) and "protocol" in missing.problem
    bad_end = decode_line(_line("end", verdict="pass", exit_code=1))  # a verdict and exit code that disagree
    assert isinstance(bad_end, InvalidEvent) and "exit code 1" in bad_end.problem


@given(st.text(max_size=200))
def test_parse_event_is_total_on_text(text):
    assert isinstance(decode_line(text), Event)


@given(st.dictionaries(st.sampled_from(["event", "t", "step", "loss", "verdict", "kind", "eval_losses", "ok"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
                                 st.lists(st.integers(), max_size=3)), max_size=8))
def test_parse_event_is_total_on_json(obj):
    assert isinstance(decode_line(json.dumps(obj)), Event)


def test_stderr_classifier():
    assert match_device_error("HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION") == "HSA error"
    assert match_device_error("engine: train on CPU") is None


# --- runs with the fake engine ----------------------------------------------------------------------------


def test_a_passing_run_delivers_every_event_in_order(fake_python):
    run = fake_run(fake_python, "pass")
    seen = []
    result = finish(run, seen.append)
    assert [e.name for e in seen] == ["start"] + ["step"] * 5 + ["end"]
    assert result.passed and result.verdict == "pass" and result.steps == 5 and result.exit_code == 0
    assert result.median_tok_s == 51200.0 and result.bpb == 3.5 and result.sensitivity == "full"
    assert '"--steps=5"' in result.stderr_tail  # the fake's own line: it was launched with the request


def test_a_failing_run_reports_kind_and_step(fake_python):
    result = finish(fake_run(fake_python, "fail"))
    assert (result.verdict, result.kind, result.failure_step) == ("fail", "canary", 2)
    assert result.reference_step == 2


def test_silence_is_a_hang_and_sigkill_follows_an_ignored_sigterm(fake_python):
    t0 = time.monotonic()
    result = finish(fake_run(fake_python, "silent-hang"))
    assert (result.verdict, result.kind, result.failure_step) == ("fail", "hang", 4)
    assert "no output" in result.reason and result.exit_code == -9
    assert time.monotonic() - t0 < 15


def test_heartbeats_without_progress_are_a_hang(fake_python):
    result = finish(fake_run(fake_python, "stall"))
    assert (result.verdict, result.kind) == ("fail", "hang") and "no progress" in result.reason


def test_idle_heartbeats_are_not_a_hang(fake_python):
    result = finish(fake_run(fake_python, "idle"))
    assert result.verdict == "pass", result


DP = {"world_size": 2, "rank": 1, "rendezvous": "file:///tmp/rdv"}


def test_a_rank_waiting_for_its_peers_is_not_a_hang_within_its_collective_timeout(fake_python):
    result = finish(fake_run(fake_python, "collective", collective_timeout_s=5.0, **DP))
    assert result.verdict == "pass", result


def test_a_collective_wait_past_the_rank_s_own_timeout_is_a_hang(fake_python, monkeypatch):
    monkeypatch.setattr(sc, "COLLECTIVE_MARGIN_S", 0.1)
    result = finish(fake_run(fake_python, "collective", collective_timeout_s=0.5, **DP))
    assert (result.verdict, result.kind) == ("fail", "hang") and "no progress" in result.reason
    # a single engine has no peers: a "collective" state there is a stall like any other
    single = finish(fake_run(fake_python, "collective"))
    assert (single.verdict, single.kind) == ("fail", "hang")


def test_no_first_step_in_time_is_a_hang(fake_python):
    result = finish(fake_run(fake_python, "no-first-step"))
    assert (result.verdict, result.kind, result.failure_step) == ("fail", "hang", 1)
    assert "first step" in result.reason


def test_death_by_signal_is_a_crash(fake_python):
    result = finish(fake_run(fake_python, "segv"))
    assert (result.verdict, result.kind, result.failure_step) == ("fail", "crash", 4) and "SIGSEGV" in result.reason


def test_a_runtime_abort_with_a_gpu_message_is_a_device_error(fake_python):
    result = finish(fake_run(fake_python, "hip-abort"))
    assert (result.verdict, result.kind) == ("fail", "device-error")
    assert "Memory access fault" in result.stderr_tail


def test_exit_without_end_is_a_crash_but_before_start_a_setup_error(fake_python):
    assert (finish(fake_run(fake_python, "exit-no-end")).kind) == "crash"
    r = finish(fake_run(fake_python, "exit-before-start"))
    assert (r.verdict, r.kind, r.exit_code) == ("error", "setup", 1) and "torch" in r.stderr_tail


def test_an_end_that_breaks_the_protocol_is_an_error_never_a_verdict(fake_python):
    seen = []
    result = finish(fake_run(fake_python, "bad-end"), seen.append)
    assert [type(e).__name__ for e in seen][-1] == "InvalidEvent"
    assert (result.verdict, result.kind) == ("error", "internal") and "broke its protocol" in result.reason
    assert "exit code 1 does not go with verdict 'pass'" in result.reason
    assert "broke its protocol" in result.stderr_tail


@pytest.mark.parametrize(("mode", "kind", "words"), [("segv-after-end", "crash", "SIGSEGV"),
                                                     ("hip-abort-after-end", "device-error", "memory access fault")])
def test_an_engine_that_dies_after_a_passing_end_is_no_pass(fake_python, mode, kind, words):
    # the `end` said pass, then the process died of a signal in its teardown (HIP reports an asynchronous memory
    # access fault at the context's last synchronize and aborts): the result was a pass, exit 0, a faulting
    # setting reported as stable
    result = finish(fake_run(fake_python, mode))
    assert (result.verdict, result.kind) == ("fail", kind) and words in result.reason, result
    assert result.exit_code < 0


def test_an_engine_that_never_exits_after_its_end_is_stopped_as_a_hang(fake_python):
    # the watchdog stopped watching once `end` arrived, and the events end only when the process exits: an engine
    # stuck after its end (a wedged GPU's teardown) kept the trial, and the card at its setting, waiting forever
    done: list = []
    worker = threading.Thread(target=lambda: done.append(finish(fake_run(fake_python, "linger"))), daemon=True)
    worker.start()
    wait_until(lambda: done, timeout_s=60.0, what="the run to end")
    result = done[0]
    assert (result.verdict, result.kind) == ("fail", "hang") and result.exit_code < 0, result


def test_a_second_end_never_turns_a_fail_into_a_pass(fake_python):
    """The last `end` read was the verdict: a fail followed by a pass read as a pass. The engine writes one end, so a
    second is a broken protocol and neither counts."""
    result = finish(fake_run(fake_python, "two-ends"))
    assert (result.verdict, result.kind) == ("error", "internal") and "second `end`" in result.reason


def test_garbage_on_stdout_is_kept_not_fatal(fake_python):
    seen = []
    result = finish(fake_run(fake_python, "garbage"), seen.append)
    assert result.passed
    assert [type(e).__name__ for e in seen if e.name not in ("start", "step", "end")] == \
        ["LogEvent", "UnknownEvent", "LogEvent"]


def test_stop_is_thread_safe_idempotent_and_graceful(fake_python):
    run = fake_run(fake_python, "term-graceful", steps=None, duration_s=60).start()
    it = run.events()
    while next(it).name != "step":
        pass
    threads = [threading.Thread(target=run.stop) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.stop()
    result = run.result(timeout=10)
    assert (result.verdict, result.kind, result.exit_code) == ("error", "stopped", 130)
    assert list(run.events()) == [] or all(isinstance(e, Event) for e in run.events())


def test_stop_escalates_to_sigkill(fake_python):
    run = fake_run(fake_python, "ignore-term", steps=None, duration_s=60).start()
    it = run.events()
    while next(it).name != "step":
        pass
    t0 = time.monotonic()
    run.stop()
    result = run.result(timeout=10)
    assert (result.verdict, result.kind, result.exit_code) == ("error", "stopped", -9)
    assert 0.4 < time.monotonic() - t0 < 8


# --- the real engine --------------------------------------------------------------------------------------


def test_real_engine_hang_is_caught_by_the_watchdog():
    policy = sc.WatchdogPolicy(min_silence_s=2, first_step_timeout_s=120, kill_grace_s=0.3, poll_s=0.1)
    hang = finish(sc.StressRun(config(steps=50, injections=[Injection.parse("hang@5")]), watchdog=policy))
    assert (hang.verdict, hang.kind, hang.failure_step, hang.steps) == ("fail", "hang", 5, 4), hang
    assert hang.exit_code == -9  # the hung engine ignores SIGTERM, like a process stuck in a GPU call


def test_real_engine_stock_reference_then_fault_rate_fails(tmp_path):
    """The simulated GPU's contract: record at stock (fault rate 0 passes), then P = 0.1 fails on a mismatch."""
    ref = tmp_path / "stock.json"
    ok = finish(sc.StressRun(config(steps=20, seed=1, record=str(ref), canary_every=10)))
    assert ok.passed and ok.steps == 20 and ok.bpb is not None and ok.start.params > 0, ok
    # 20 steps are enough for P = 0.1: seed 1's faults are drawn the same every run (the first one caught is at
    # step 10 today), so this is no matter of luck
    bad = finish(sc.StressRun(config(steps=20, seed=1, reference=str(ref), fault_rate=0.1)))
    assert (bad.verdict, bad.kind) == ("fail", "mismatch") and bad.failure_step <= 20


# --- stopped processes (issue 28): time nobody could watch is not silence -----------------------------------


def _wait_for(condition, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_an_engine_stopped_from_outside_is_not_a_hang_and_says_how_long(fake_python):
    """SIGSTOP for many times the silence limit, then SIGCONT: the run ends as the engine says (a pass here) and
    reports the time it spent stopped; the trial decides what that means (tests/tuning/test_stopped_trials.py)."""
    run = fake_run(fake_python, "busy", steps=None, duration_s=60).start()
    events = run.events()
    while next(events).name != "step":
        pass
    os.kill(run.proc.pid, signal.SIGSTOP)
    try:  # the watchdog itself measures the stop: 3 x its silence limit
        _wait_for(lambda: run._engine_stopped_s > 3 * FAST.min_silence_s)
    finally:
        os.kill(run.proc.pid, signal.SIGCONT)
    for _ in events:
        pass
    result = run.result()
    assert (result.verdict, result.kind) == ("pass", None), result
    assert result.engine_stopped_s >= round(3 * FAST.min_silence_s, 1)


class _StopOfThisProcess:
    """The clock of a process stopped once for `jump_s` (SIGSTOP, a suspend): once armed, the watchdog's next
    reading jumps, and every thread sees the jump from then on."""

    def __init__(self, jump_s: float, *, armed: bool) -> None:
        self.jump_s, self.armed, self._offset_s = jump_s, armed, 0.0

    def __call__(self) -> float:
        if self.armed and threading.current_thread().name == "stress-watchdog":
            self._offset_s, self.armed = self.jump_s, False
        return time.monotonic() + self._offset_s


def test_this_process_stopped_before_the_watchdogs_first_poll_is_not_engine_silence(fake_python):
    """The same stop, but before the watchdog's first poll (a laptop suspended just after the engine was launched,
    or a loaded machine that ran the engine's first step before the watchdog thread ever ran): the first poll had
    no earlier one to measure its lateness from, so the whole jump read as silence, and the run failed as a hang
    ('no first step within 1.5 s of launch'; in a fresh clone's CI run once, as 'no output for 30.0 s' in the
    test above). The launch is the first poll's starting point."""
    cfg = sc.EngineConfig(EngineOptions(steps=None, duration_s=60), python=fake_python,
                          env={"FAKE_ENGINE_MODE": "busy"})
    # the first poll may come before the first step: then the first-step timeout applies, and up to the slack
    # (2 s) of the late poll counts against it, so it is well above the slack here (the real one is minutes);
    # the stop (30 s) is far beyond both
    policy = replace(FAST, min_silence_s=sc.OWN_STOP_SLACK_S + 1.0, first_step_timeout_s=sc.OWN_STOP_SLACK_S + 10.0)
    # armed before the start: the watchdog's very first reading jumps
    now = _StopOfThisProcess(10 * policy.min_silence_s, armed=True)
    run = sc.StressRun(cfg, watchdog=policy, clock=now).start()
    for _ in run.events():
        pass
    result = run.result()
    assert (result.verdict, result.kind, result.engine_stopped_s) == ("pass", None, 0.0), result


def test_this_process_stopped_is_not_engine_silence(fake_python):
    """The tuner stopped (SIGSTOP, a suspended laptop): its clock jumps between two watchdog polls while the
    engine's own clock (its heartbeats' `t`) shows steady work. Before issue 28 that jump read as a hang."""
    cfg = sc.EngineConfig(EngineOptions(steps=None, duration_s=60), python=fake_python,
                          env={"FAKE_ENGINE_MODE": "busy"})
    # The hard order, every time: the watchdog's first poll after the stop comes before any event read after it
    # (the jump shows to every thread from the watchdog's next reading of the clock; events read before that keep
    # their old times). The watchdog counts up to OWN_STOP_SLACK_S (2 s) of a late poll as silence, so that a busy
    # machine's late poll is never excused in full: the limit here is just above the slack (the real one is 60 s),
    # and the stop is 10 x it.
    policy = replace(FAST, min_silence_s=sc.OWN_STOP_SLACK_S + 1.0)
    now = _StopOfThisProcess(10 * policy.min_silence_s, armed=False)
    run = sc.StressRun(cfg, watchdog=policy, clock=now).start()
    events = run.events()
    while next(events).name != "step":
        pass
    now.armed = True
    for _ in events:
        pass
    result = run.result()
    assert (result.verdict, result.kind, result.engine_stopped_s) == ("pass", None, 0.0), result
