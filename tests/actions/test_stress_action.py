"""tuner.actions.stress: the one place the CLI and the Tune screen get their stress policy from (issue 21 item 4)
and where a missing stock reference is decided (issue 24 item 2). Fast: engine runs are fakes that speak the
schema's own events (tests/engine/examples.py)."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest

from tests.engine.examples import example
from tests.polling import wait_until
from tuner.actions import stress
from tuner.backends.simulated import SimulatedBackend
from tuner.tuning import engine_client as sc
from tuner.tuning.kernel_log import KernelLogWatcher

RESET_LINE = "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!"


class FakeRun:
    """An engine run (StressRun's shape: start, events, stop, result) that passes after `steps` steps, writes its
    `--record` file as the engine does on a pass, fails at `fail_at`, or runs until stopped (`forever`)."""

    def __init__(self, config: sc.EngineConfig, watchdog: sc.WatchdogPolicy, *, steps: int = 3,
                 fail_at: int | None = None, forever: bool = False, write_record: bool = True):
        self.config, self.watchdog = config, watchdog
        self.steps, self.fail_at, self.forever, self.write_record = steps, fail_at, forever, write_record
        self.stopped = threading.Event()
        self._result: sc.StressResult | None = None

    def start(self) -> FakeRun:
        return self

    def events(self):
        # as the engine: a `--reference` it was given shows in its start and, compared, in its end
        ref = self.config.options.reference
        start = example("start", reference=None if ref is None else {"path": ref, "steps": self.steps})
        yield start
        step = 0
        while self.forever or step < self.steps:
            step += 1
            if self.stopped.wait(0.01 if self.forever else 0):
                self._result = _result("error", "stopped", "stopped", step, start=start)
                return
            if step == self.fail_at:
                yield example("fault", step=step)
                self._result = _result("fail", "mismatch", "loss bits differ", step, start=start)
                return
            yield example("step", step=step)
        if self.config.options.record and self.write_record:
            Path(self.config.options.record).write_text("{}")
        compared = None if ref is None else {
            "path": ref, "reference_steps": step, "compared_steps": step, "beyond_reference_steps": 0, "note": None,
            "tolerance": None, "loop": True, "segments": 1}
        end = example("end", steps=step, reference=compared)
        yield end
        self._result = _result("pass", None, "completed", step, start=start, end=end)

    def stop(self) -> None:
        self.stopped.set()

    def result(self, timeout: float | None = None) -> sc.StressResult | None:
        return self._result


def _result(verdict, kind, reason, steps, *, start=None, end=None):
    return sc.StressResult(verdict, kind, reason, steps if verdict == "fail" else None, steps, 1.0, 1000.0, None,
                           0 if verdict == "pass" else 1, start=start, end=end)


class Engines:
    """The engine factory: records each request and its watchdog, makes a FakeRun per request."""

    def __init__(self, **run_options):
        self.runs: list[FakeRun] = []
        self.options = run_options
        self.per_run: list[dict] = []

    def __call__(self, config, watchdog):
        extra = self.per_run[len(self.runs)] if len(self.runs) < len(self.per_run) else {}
        run = FakeRun(config, watchdog, **{**self.options, **extra})
        self.runs.append(run)
        return run


def session(backend, *, engines=None, seen=None, watcher=None, **request):
    return stress.StressSession(backend, stress.StressRequest("sim0", **{"steps": 3, "preset": "tiny", **request}),
                                on_event=(seen.append if seen is not None else None), engine_factory=engines,
                                kernel_watcher_factory=watcher, reference_record_s=2.0)


def lines(seen) -> list[str]:
    return [e for e in seen if isinstance(e, str)]


def detector(seen, name: str) -> list[str]:
    return [e.value for e in seen if isinstance(e, stress.DetectorState) and e.name == name]


# --- the plan --------------------------------------------------------------------------------------------------


def test_the_reference_plan_for_every_case(tmp_path):
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    device, target = backend.device("sim0"), backend.stress_target("sim0")
    plan = session(backend).reference_plan(device, target)
    assert (plan.state, plan.compared) == ("record-first", True) and "recording it first, at stock" in plan.why
    plan.path.parent.mkdir(parents=True)
    plan.path.write_text("{}")
    assert session(backend).reference_plan(device, target).state == "cached"
    assert session(backend, mode="gemm").reference_plan(device, target).state == "n/a"
    given = session(backend, reference=tmp_path / "r.ref").reference_plan(device, target)
    assert (given.state, given.path, given.compared) == ("given", tmp_path / "r.ref", True)
    recording = session(backend, record=tmp_path / "new.ref").reference_plan(device, target)
    assert (recording.state, recording.compared) == ("recording", False)
    off = session(backend, without_reference=True).reference_plan(device, target)
    assert (off.state, off.compared) == ("off", False)
    # another workload has its own reference; off stock with none, nothing is decided for the user
    backend.apply("sim0", -30)
    with pytest.raises(stress.NoStockReference) as e:
        session(backend, preset="small").reference_plan(device, target)
    assert (e.value.device_id, e.value.setting, e.value.unit, e.value.exit_code) == ("sim0", -30, "mV", 2)
    assert session(backend).reference_plan(device, target).state == "cached"  # the tiny one still compares


def test_one_request_one_policy_canary_watchdog_and_a_looped_reference(tmp_path):
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    engines = Engines()
    outcome = session(backend, engines=engines).run()
    record, run = engines.runs
    assert record.config.options.record and record.config.options.duration_s == 2.0  # at stock, first
    o = run.config.options
    assert (o.reference, o.reference_loop, o.record) == (record.config.options.record, True, None)
    assert o.canary_every == stress.SIM_CANARY_EVERY and o.steps == 3  # a simulated card's canary rule
    assert run.watchdog == sc.WatchdogPolicy.for_config(run.config)  # the bisect trials' watchdog
    assert outcome.verdict == "pass" and outcome.reference.compared and outcome.checks_off() == []
    assert outcome.summary().endswith("compared with the stock reference")
    assert not backend._loaded("sim0")


# --- the run ---------------------------------------------------------------------------------------------------


def test_record_first_is_said_and_the_stress_run_compares_with_it(tmp_path):
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    seen: list = []
    engines = Engines()
    session(backend, engines=engines, seen=seen).run()
    assert detector(seen, "reference") == ["recording", "ok"]
    assert any("recording it first, at stock" in line for line in lines(seen))
    assert [e.purpose for e in seen if isinstance(e, stress.RunStarted)] == ["reference", "stress"]
    assert detector(seen, "kernel log") == ["n/a (simulated)", "n/a (simulated)"]


def test_a_recording_that_fails_at_stock_ends_the_session_and_keeps_nothing(tmp_path):
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    engines = Engines()
    engines.per_run = [{"fail_at": 2}]
    outcome = session(backend, engines=engines).run()
    assert len(engines.runs) == 1 and outcome.purpose == "reference"
    assert (outcome.verdict, outcome.kind) == ("fail", "mismatch")
    assert "no stress run followed" in outcome.summary()
    assert not Path(engines.runs[0].config.options.record).exists()
    # a pass that wrote no file is not a pass: no stress ran
    engines = Engines(write_record=False)
    quiet = session(backend, engines=engines).run()
    assert len(engines.runs) == 1 and (quiet.verdict, quiet.kind) == ("error", "reference")


def test_without_a_reference_the_run_says_so_before_and_after(tmp_path):
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    backend.apply("sim0", -30)
    seen: list = []
    engines = Engines()
    outcome = session(backend, engines=engines, seen=seen, without_reference=True).run()
    assert len(engines.runs) == 1 and engines.runs[0].config.options.reference is None
    assert detector(seen, "reference") == ["OFF"]
    assert any(line.startswith("reference comparison OFF") for line in lines(seen))
    assert outcome.checks_off() == [("the stock-reference comparison did not run: you chose to run without a stock "
                                    "reference")]
    assert "the stock-reference comparison did not run" in outcome.summary()
    assert outcome.reference.compared is False


def test_an_unreadable_kernel_log_is_said_and_in_the_summary(tmp_path):
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    seen: list = []
    unreadable = lambda: KernelLogWatcher(warn=seen.append, source=lambda: None)  # noqa: E731
    outcome = session(backend, engines=Engines(), seen=seen, watcher=unreadable, without_reference=True).run()
    assert detector(seen, "kernel log") == ["OFF"]
    assert any("cannot read the kernel log" in line for line in lines(seen))
    assert any(line.startswith("the kernel log was not watched") for line in outcome.checks_off())
    assert "the kernel log was not watched" in outcome.summary()


class LiveLog:
    """A kernel-log source whose lines the test writes (KernelLogWatcher's `source` seam)."""

    def __init__(self) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()

    def __call__(self):
        def read():
            while (line := self.lines.get()) is not None:
                yield line

        return read(), lambda: self.lines.put(None)


def test_a_kernel_log_fault_stops_the_run_and_fails_it(tmp_path):
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    log = LiveLog()
    seen: list = []
    engines = Engines(forever=True)

    def on_event(event) -> None:
        seen.append(event)
        if getattr(event, "name", None) == "step" and event.step == 3:
            log.lines.put(RESET_LINE)  # decided by program state: the third step

    s = stress.StressSession(backend, stress.StressRequest("sim0", duration_s=3600.0, without_reference=True),
                             on_event=on_event, engine_factory=engines,
                             kernel_watcher_factory=lambda: KernelLogWatcher(source=log))
    outcome = s.run()  # only the fault can end this run
    assert engines.runs[0].stopped.is_set() and not outcome.stopped
    assert (outcome.verdict, outcome.kind) == ("fail", "gpu-reset")
    assert outcome.summary().startswith(f"FAIL (kernel log: {RESET_LINE})")
    assert detector(seen, "kernel log")[-1] == "FAULT" and f"FAULT kernel log: {RESET_LINE}" in lines(seen)


def test_a_kernel_log_that_stops_being_readable_mid_run_is_said_and_in_the_summary(tmp_path):
    """The stream ends while the engine runs (journalctl killed, the helper's stream closed, a read error): from
    then on nothing is watched, so the outcome must not say the kernel log was watched."""
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    seen: list = []
    watchers: list[KernelLogWatcher] = []

    def source():
        def read():
            raise OSError(5, "Input/output error")
            yield ""  # a generator

        return read(), lambda: None

    def watcher() -> KernelLogWatcher:
        watchers.append(KernelLogWatcher(warn=seen.append, source=source))
        return watchers[-1]

    def on_event(event) -> None:
        seen.append(event)
        if getattr(event, "name", None) == "step" and event.step == 1:  # program state: the reader is gone
            wait_until(lambda: not watchers[0]._thread.is_alive(), what="the kernel-log reader to end")

    s = stress.StressSession(backend, stress.StressRequest("sim0", steps=3, without_reference=True),
                             on_event=on_event, engine_factory=Engines(), kernel_watcher_factory=watcher)
    outcome = s.run()
    assert any(line.startswith("the kernel log was not watched") for line in outcome.checks_off())
    assert "the kernel log was not watched" in outcome.summary()
    assert detector(seen, "kernel log")[-1] == "OFF"


def test_a_pass_while_the_engine_was_stopped_from_outside_says_the_load_was_not_held(tmp_path):
    """An engine stopped from outside (SIGSTOP, a debugger) loads nothing meanwhile and its silence is no hang
    (docs/engine.md, "Whose clock"): a bisect trial calls such a pass inconclusive; a stress run's outcome must at
    least say the check did not run at full strength, not a plain PASS."""
    from dataclasses import replace

    backend = SimulatedBackend(state_path=tmp_path / "sim.json")

    class StoppedMeanwhile(FakeRun):
        def result(self, timeout=None):
            r = super().result(timeout)
            return None if r is None else replace(r, engine_stopped_s=42.0)

    outcome = session(backend, engines=lambda config, watchdog: StoppedMeanwhile(config, watchdog),
                      without_reference=True).run()
    assert outcome.verdict == "pass"
    assert any("stopped from outside for 42 s" in line for line in outcome.checks_off())
    assert "stopped from outside" in outcome.summary()


def test_a_stop_before_the_run_starts_nothing(tmp_path):
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    engines = Engines()
    s = session(backend, engines=engines, without_reference=True)
    s.stop()
    outcome = s.run()
    assert outcome.verdict == "stopped" and outcome.result is None and not backend._loaded("sim0")
