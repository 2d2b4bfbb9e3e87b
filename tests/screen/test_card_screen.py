"""One card's screen with engine runs faked from the schema's own events (tests/engine/examples.py): what is run
after a fault, where the card is left, and what no engine run can show (a hang, a kernel-log reset, rising
uncorrectable counters, a stop)."""

from __future__ import annotations

import threading

import pytest

from tests.engine.examples import example
from tests.screen.helpers import bundle
from tuner.actions.screen.attribution import TIERS
from tuner.actions.screen.card import CardScreen, ScreenPlan
from tuner.backends.simulated import SimulatedBackend
from tuner.core.models import ErrorCounters
from tuner.profiles import reference_bundle as rb
from tuner.tuning import engine_client as sc
from tuner.tuning import journal
from tuner.tuning.kernel_log import KernelEvent, NullWatcher


class Run:
    """An engine run (StressRun's shape) that passes, fails with `kind` at `fail_at`, or blocks until stopped."""

    def __init__(self, config, watchdog, *, fail_at=None, kind="mismatch", block=False, on_start=None):
        self.config, self.fail_at, self.kind, self.block, self.on_start = config, fail_at, kind, block, on_start
        self.stopped = threading.Event()
        self._result = None

    def start(self):
        return self

    def stop(self):
        self.stopped.set()

    def events(self):
        if self.on_start:
            self.on_start(self)
        yield example("start")
        if self.block:
            self.stopped.wait(30)
            end = example("end", verdict="error", reason="interrupted by SIGTERM", kind="interrupted", steps=3,
                          exit_code=130)
            self._result = sc.StressResult("error", "interrupted", end.reason, None, 3, 1.0, None, None, 130, end=end)
            yield end
            return
        if self.kind == "hang":  # the watchdog's verdict: the engine never ends on its own (no `end`)
            self._result = sc.StressResult("fail", "hang", f"no progress after step {self.fail_at}", self.fail_at,
                                           self.fail_at, None, None, None, None)
            return
        ref = {"path": "r", "reference_steps": 5, "compared_steps": 5, "beyond_reference_steps": 0, "note": None,
               "tolerance": None, "loop": True, "segments": 1}
        if self.fail_at is not None:
            ref["compared_steps"] = self.fail_at
            end = example("end", verdict="fail", reason=f"{self.kind} at step {self.fail_at}", kind=self.kind,
                          step=self.fail_at, reference_step=self.fail_at, steps=self.fail_at, reference=ref,
                          exit_code=1, bpb=None, figure="state" if self.kind == "mismatch" else None)
            self._result = sc.StressResult("fail", self.kind, end.reason, self.fail_at, self.fail_at, 2.0, None, None,
                                           1, reference_step=self.fail_at, end=end)
        else:
            end = example("end", steps=5, reference=ref)
            self._result = sc.StressResult("pass", None, "completed", None, 5, 2.0, None, None, 0, end=end)
        yield end

    def result(self, timeout=None):
        return self._result


class Engines:
    def __init__(self, *plans):
        self.plans, self.runs = list(plans), []

    def __call__(self, config, watchdog):
        run = Run(config, watchdog, **(self.plans[len(self.runs)] if len(self.runs) < len(self.plans) else {}))
        self.runs.append(run)
        return run


def card(tmp_path, backend, engines, **kw) -> CardScreen:
    b = bundle(tmp_path)
    plan = ScreenPlan(b, rb.materialize(b, tmp_path), TIERS["quick"], host="h")
    return CardScreen(backend, "sim0", plan, engine_factory=engines, kernel_watcher_factory=NullWatcher, **kw)


@pytest.fixture
def backend(tmp_path):
    return SimulatedBackend(state_path=tmp_path / "sim")


def test_a_fault_off_stock_is_run_at_stock_and_the_card_put_back(tmp_path, backend):
    backend.apply("sim0", -30)
    seen = []
    engines = Engines({"fail_at": 4}, {"fail_at": 2},
                      {"on_start": lambda run: seen.append(backend.knob("sim0").current)})
    v = card(tmp_path, backend, engines).run()
    assert (v.verdict, v.attribution, v.action) == ("fail", "persistent at this setting", "raise voltage")
    assert seen == [0]  # the stock run ran at stock
    assert backend.knob("sim0").current == -30  # and the card is back at its setting
    assert [r.purpose for r in v.evidence.runs] == ["screen", "repeat", "stock"]
    # the repeat and the stock run last 3x the time the first fault took, at least the tier's load
    assert [run.config.options.duration_s for run in engines.runs] == [30.0, 30.0, 30.0]


def test_the_card_is_put_back_when_the_stock_run_is_interrupted(tmp_path, backend):
    backend.apply("sim0", -30)
    engines = Engines({"fail_at": 4}, {"fail_at": 2}, {"block": True})
    screen = card(tmp_path, backend, engines)
    out = {}
    worker = threading.Thread(target=lambda: out.update(v=screen.run()))
    worker.start()
    while len(engines.runs) < 3:
        worker.join(0.05)
    assert backend.knob("sim0").current == 0
    screen.stop()
    worker.join(30)
    assert backend.knob("sim0").current == -30
    assert out["v"].verdict == "fail" and out["v"].action == "reset to stock"  # stock never proven


def test_a_hang_is_not_re_run_and_goes_on_the_unsafe_list(tmp_path, backend):
    backend.apply("sim0", -60)
    engines = Engines({"fail_at": 3, "kind": "hang"})
    v = card(tmp_path, backend, engines).run()
    assert (v.verdict, v.attribution, v.action) == ("fail", "not attributed", "reset to stock")
    assert len(engines.runs) == 1 and v.evidence.detectors["watchdog"] == "fired"
    assert [e["setting"] for e in journal.unsafe_entries("sim0")] == [-60]
    assert backend.knob("sim0").current == -60  # left as it reads: never written


def test_a_hang_at_stock_drains(tmp_path, backend):
    v = card(tmp_path, backend, Engines({"fail_at": 3, "kind": "hang"})).run()
    assert v.action == "drain" and journal.unsafe_entries("sim0") == []


def test_rising_uncorrectable_counters_fail_a_card_whose_steps_matched(tmp_path, backend, monkeypatch):
    reads = iter([ErrorCounters((("ecc_uncorrected_volatile", 0),), "nvml"),
                  ErrorCounters((("ecc_uncorrected_volatile", 2),), "nvml")])
    monkeypatch.setattr(backend, "error_counters", lambda device_id: next(reads))
    v = card(tmp_path, backend, Engines({})).run()
    assert (v.verdict, v.action) == ("fail", "drain")
    assert v.evidence.counters.counters[0].change == 2 and "error counters" in v.evidence.detectors_fired


def test_a_falling_uncorrectable_counter_is_no_rise(tmp_path, backend, monkeypatch):
    """A pending remap done during the screen (remap_pending 1 -> 0) is a counter that fell: nothing rose."""
    reads = iter([ErrorCounters((("ecc_uncorrected_volatile", 0), ("remap_pending", 1)), "nvml"),
                  ErrorCounters((("ecc_uncorrected_volatile", 0), ("remap_pending", 0)), "nvml")])
    monkeypatch.setattr(backend, "error_counters", lambda device_id: next(reads))
    v = card(tmp_path, backend, Engines({})).run()
    assert v.verdict == "pass", v.reason
    assert "error counters" not in v.evidence.detectors_fired


@pytest.mark.parametrize("after", [
    ErrorCounters(why="could not be read: NVML: GPU is lost"),  # none readable after the screen
    ErrorCounters((("ecc_corrected_volatile", 0),), "nvml", unreadable=("ecc_uncorrected_volatile",)),  # one not
])
def test_counters_unreadable_after_the_screen_are_said_never_silent(tmp_path, backend, monkeypatch, after):
    """The uncorrectable counter could not be read after the screen, so whether it rose is unknown: the evidence
    says why (never a silent null) and the check is listed as not at full strength."""
    reads = iter([ErrorCounters((("ecc_corrected_volatile", 0), ("ecc_uncorrected_volatile", 0)), "nvml"), after])
    monkeypatch.setattr(backend, "error_counters", lambda device_id: next(reads))
    v = card(tmp_path, backend, Engines({})).run()
    ue = next(c for c in v.evidence.counters.counters if c.name == "ecc_uncorrected_volatile")
    assert ue.after is None and ue.change is None
    assert v.evidence.counters.why and "ecc_uncorrected_volatile" in v.evidence.counters.why
    assert any("ecc_uncorrected_volatile" in off for off in v.evidence.checks_off), v.evidence.checks_off


def test_a_stop_is_never_a_pass(tmp_path, backend):
    engines = Engines({"block": True})
    screen = card(tmp_path, backend, engines)
    out = {}
    worker = threading.Thread(target=lambda: out.update(v=screen.run()))
    worker.start()
    while not engines.runs:
        worker.join(0.05)
    screen.stop()
    worker.join(30)
    assert out["v"].verdict == "retest" and out["v"].bound is None


def test_a_kernel_log_reset_is_hard(tmp_path, backend):
    class Watcher(NullWatcher):
        def stop(self):
            return [KernelEvent("gpu-reset", "amdgpu: GPU reset begin!", True)]

    backend.apply("sim0", -30)
    b = bundle(tmp_path)
    plan = ScreenPlan(b, rb.materialize(b, tmp_path), TIERS["quick"], host="h")
    v = CardScreen(backend, "sim0", plan, engine_factory=Engines({}), kernel_watcher_factory=Watcher).run()
    assert (v.verdict, v.attribution) == ("fail", "not attributed")
    assert v.evidence.kernel_log == ["amdgpu: GPU reset begin!"] and "kernel log" in v.evidence.detectors_fired


def test_every_card_at_once_one_engine_each_the_worst_decides(tmp_path):
    """`Screen` (tuner.actions.screen.fleet): a thread and an engine per card, the verdicts in the cards' order,
    the worst card's exit code. The end-to-end variant (real engines) is gated in test_screen_cli.py."""
    from tuner.actions.screen.fleet import Screen
    from tuner.core import exit_codes

    backend = SimulatedBackend(gpus=2, state_path=tmp_path / "sim")
    runs: dict[str, list[Run]] = {"sim0": [], "sim1": []}

    def engines(config, watchdog):  # sim1 is the bad card: every run of it faults (the card's thread names it)
        device = threading.current_thread().name.removeprefix("screen-")
        run = Run(config, watchdog, **({"fail_at": 2} if device == "sim1" else {}))
        runs[device].append(run)
        return run

    b = bundle(tmp_path)
    report = Screen(backend, ["sim0", "sim1"], b, tmp_path / "A.ref", TIERS["quick"], engine_factory=engines,
                    kernel_watcher_factory=NullWatcher).run()
    assert [(c.card.id, c.verdict) for c in report.verdicts] == [("sim0", "pass"), ("sim1", "fail")]
    assert report.exit_code == exit_codes.TEST_FAILED and report.summary == "2 cards: 1 fail, 1 pass"
    assert (len(runs["sim0"]), len(runs["sim1"])) == (1, 2)  # the bad card's fault was repeated, the good one not


def test_a_hang_in_the_repeat_goes_on_the_unsafe_list_and_nothing_more_runs(tmp_path, backend):
    """docs/screen.md: a value that hung the machine or reset the card is never re-run and goes on the card's
    unsafe list, whichever run it hung in; after it nothing more is written to the card or run on it (the stock run
    could not be made: `reset to stock`, the safe side)."""
    backend.apply("sim0", -60)
    engines = Engines({"fail_at": 4}, {"fail_at": 2, "kind": "hang"}, {})
    v = card(tmp_path, backend, engines).run()
    assert [e["setting"] for e in journal.unsafe_entries("sim0")] == [-60]
    assert len(engines.runs) == 2 and [r.purpose for r in v.evidence.runs] == ["screen", "repeat"]
    assert (v.verdict, v.action) == ("fail", "reset to stock")
    assert backend.knob("sim0").current == -60  # left as it reads: never written


def test_a_hang_goes_on_the_unsafe_list_under_the_serial_of_the_card_it_ran_on(tmp_path, backend):
    """The screen's entry named no serial: it stayed with the slot when the card moved (set, apply and boot apply
    on its new slot never saw it) and the helper's import filed it under whatever card was in the slot."""
    backend.apply("sim0", -60)
    card(tmp_path, backend, Engines({"fail_at": 3, "kind": "hang"})).run()
    [entry] = journal.own_unsafe_entries("sim0")
    assert entry["serial"] == backend.device("sim0").serial


def test_an_amd_card_with_overdrive_off_is_screened_at_stock(tmp_path):
    """Overdrive off (amdgpu's default ppfeaturemask, no pp_od_clk_voltage: control.md §2): the driver allows no
    offset, so the card runs at stock. A screen at its own setting writes nothing and needs none: it is screened at
    stock, and says overdrive is off; never a whole screen refused for a knob it does not need."""
    from tests.backends.fakes.trees import make_tree
    from tuner.backends import amd
    from tuner.backends.amd_sysfs import amd_card_dirs

    make_tree(tmp_path / "root", ["rdna4"], mask="0xfff7bfff")
    backend = amd.AmdBackend(amd_card_dirs(tmp_path / "root"), root=tmp_path / "root")
    device_id = backend.devices()[0].id
    b = bundle(tmp_path)
    plan = ScreenPlan(b, rb.materialize(b, tmp_path), TIERS["quick"], tolerance=True, host="h")
    v = CardScreen(backend, device_id, plan, engine_factory=Engines({}), kernel_watcher_factory=NullWatcher).run()
    s = v.setting
    assert (s.at_stock, s.value, s.stock, s.left_at) == (True, 0, 0, 0)
    assert s.source.startswith("current") and "overdrive off" in s.source, s.source
    from tuner.commands.screen import card_lines
    assert "Overdrive is off" in card_lines(v)[0], card_lines(v)[0]


def test_a_reference_is_recorded_on_an_amd_card_with_overdrive_off(tmp_path, monkeypatch):
    """`tuner reference record` needs the card at stock and writes nothing to it: a card with Overdrive off runs at
    stock (the driver allows no offset), so the recording goes on to its engine run; never refused for the knob."""
    from tests.backends.fakes.trees import make_tree
    from tuner.actions.screen import record
    from tuner.backends import amd
    from tuner.backends.amd_sysfs import amd_card_dirs

    make_tree(tmp_path / "root", ["rdna4"], mask="0xfff7bfff")
    backend = amd.AmdBackend(amd_card_dirs(tmp_path / "root"), root=tmp_path / "root")
    device_id = backend.devices()[0].id

    class Started(Exception):
        pass

    def session(backend, request, **kw):
        raise Started(request.record)

    monkeypatch.setattr(record, "StressSession", session)
    with pytest.raises(Started):
        record.record_reference(backend, record.RecordRequest(device_id=device_id, out=tmp_path / "A.ref",
                                                              tier=TIERS["quick"]))
