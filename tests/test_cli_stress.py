"""`tuner stress`: options -> the stress action's request and the engine configuration it makes, the progress line,
the summary, exit codes; end to end on the simulated card (the real engine below the card's limit) and with a fake
engine (fast paths)."""

from __future__ import annotations

import io
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.engine.examples import example
from tuner.actions import stress as stress_action
from tuner.actions.context import Context
from tuner.backends.simulated import SimulatedBackend
from tuner.cli import build_parser
from tuner.commands import stress
from tuner.core.errors import TunerError, UsageError
from tuner.core.models import StressTarget
from tuner.engine.options import EngineOptions
from tuner.tuning import engine_client as sc

FAKE = Path(__file__).parent / "engine" / "fake_engine.py"


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_parser_bounds_and_defaults():
    a = parse("stress", "--device", "sim0")
    assert (a.duration, a.steps, a.mode, a.preset, a.json, a.run) == (None, None, "train", None, False, stress.run)
    with pytest.raises(SystemExit):
        parse("stress", "--duration", "5m", "--steps", "10")
    with pytest.raises(SystemExit):
        parse("stress", "--steps", "0")


def config_of(argv, target, *, reference=None):
    request = stress.build_request(parse(*argv), "sim0")
    return stress_action.engine_config(request, target, duration_s=request.duration_s, steps=request.steps,
                                       reference=reference if reference is not None else request.reference)


def test_config_for_a_simulated_card():
    target = StressTarget("cpu", None, fault_rate=0.2, hang=True, simulated=True)
    o = config_of(["stress", "--duration", "90s", "--seed", "4"], target).options
    assert (o.device, o.preset, o.duration_s, o.steps, o.seed) == ("cpu", "tiny", 90.0, None, 4)
    assert o.fault_rate == 0.2 and [str(i) for i in o.injections] == ["hang@3"] and o.canary_every == 10


def test_config_for_a_real_card():
    target = StressTarget("cuda:1", "0000:03:00.0", env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    config = config_of(["stress", "--steps", "500", "--mode", "mixed", "--dtype", "fp16", "--reference", "r.json"],
                       target)
    o = config.options
    assert (o.device, o.preset, o.steps, o.duration_s) == ("cuda:1", "nanochat", 500, None)
    assert (o.mode, o.dtype, o.reference, o.fault_rate) == ("mixed", "fp16", "r.json", 0.0)
    assert o.reference_loop  # every step of a run of any length is compared
    assert o.expect_pci_bus_id == "0000:03:00.0" and o.canary_every == 100  # the engine's default
    assert o.compile is None and not any("compile" in a for a in config.argv())
    off = config_of(["stress", "--steps", "5", "--no-compile", "--preset", "small"], target)
    assert off.options.compile is False and "--no-compile" in off.argv() and off.options.preset == "small"
    assert sc.WatchdogPolicy.for_config(config) == sc.WatchdogPolicy()  # the bisect trials' watchdog
    with pytest.raises(UsageError):
        stress.build_request(parse("stress", "--duration", "soon"), "sim0")
    with pytest.raises(SystemExit):  # one way to compare at a time
        parse("stress", "--reference", "r.json", "--no-reference")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_draws_step_loss_throughput_and_eta():
    now = [100.0]
    out = _Tty()
    line = stress.ProgressLine(out, steps=None, duration_s=60.0, clock=lambda: now[0])
    line.update(example("start"))
    now[0] = 115.0
    line.update(example("step", step=42, loss=2.5, dt_ms=20, tok_s=25600))
    assert out.getvalue() == "\r\033[Kstep 42  loss 2.5000  25,600 tok/s  ETA 45s"  # _output.StatusLine
    now[0] = 115.1
    line.update(example("step", step=43, loss=2.4, dt_ms=20, tok_s=25600))
    assert out.getvalue().count("\r") == 1  # at most 4 redraws a second
    line.clear()
    by_steps = stress.ProgressLine(_Tty(), steps=100, duration_s=None, clock=lambda: 0.0)
    by_steps.update(example("start"))
    ev = example("step", step=40, loss="NaN", dt_ms=500, tok_s=1000)
    by_steps.update(ev)
    assert by_steps.text(ev) == "step 40/100  loss nan  1,000 tok/s  ETA 30s"
    quiet = io.StringIO()
    stress.ProgressLine(quiet, steps=5, duration_s=None).update(ev)
    assert quiet.getvalue() == ""  # not a terminal: no progress line


def _result(**kw):
    base = {"verdict": "pass", "kind": None, "reason": "completed", "failure_step": None, "steps": 10,
            "duration_s": 1.0, "median_tok_s": 5000.0, "bpb": 3.2, "exit_code": 0, "sensitivity": "full"}
    return sc.StressResult(**{**base, **kw})


COMPARED = stress_action.ReferencePlan("cached", Path("r.ref"), "compared with this card's stock reference")
OFF = stress_action.ReferencePlan("off", None, "you chose to run without a stock reference")


def _outcome(reference=COMPARED, **kw):
    """A run as the engine ends it: its `end` names the comparison when one ran (as the real engine's does)."""
    compared = {"path": "r.ref", "reference_steps": 10, "compared_steps": 10, "beyond_reference_steps": 0,
                "note": None, "tolerance": None, "loop": True, "segments": 1} if reference.compared else None
    result = replace(_result(**kw), end=example("end", reference=compared))
    return stress_action.StressOutcome(result, reference, "n/a (simulated)")


def test_exit_codes_and_summary():
    assert stress.exit_code_for(_outcome()) == 0
    assert stress.exit_code_for(_outcome(verdict="fail", kind="hang")) == 1
    assert stress.exit_code_for(_outcome(verdict="error", kind="setup")) == 2
    assert stress.exit_code_for(_outcome(verdict="error", kind="stopped")) == 130
    dev = SimulatedBackend().device("sim0")
    cfg = sc.EngineConfig(EngineOptions(steps=10))
    text = "\n".join(stress.summary_lines(dev, cfg, _outcome(verdict="fail", kind="mismatch", failure_step=7,
                                                              reason="loss bits differ")))
    assert "FAIL" in text and "mismatch at step 7: loss bits differ" in text and "10 steps in 1.0 s" in text
    assert "reference: compared" in text
    weaker = "\n".join(stress.summary_lines(dev, cfg, _outcome(OFF)))
    assert "reference: NOT compared (you chose to run without a stock reference)" in weaker


def test_the_text_summary_says_every_check_json_lists_as_off():
    """No silent downgrade in either form: an engine stopped from outside for a while (SIGSTOP, a debugger) is in
    --json's checks_off, and the text summary of the same pass said nothing of it."""
    dev = SimulatedBackend().device("sim0")
    cfg = sc.EngineConfig(EngineOptions(steps=10))
    outcome = _outcome(engine_stopped_s=42.0)
    assert any("stopped from outside for 42 s" in line for line in outcome.checks_off())
    text = "\n".join(stress.summary_lines(dev, cfg, outcome))
    assert "stopped from outside for 42 s" in text, text


def test_unknown_device_is_a_usage_error():
    args = parse("--simulate", "stress", "--device", "sim9", "--steps", "5")
    with pytest.raises(TunerError, match="sim9"):
        stress.run(args, Context.from_args(args))


@pytest.mark.parametrize("existing", ["file", "directory"])
def test_record_never_replaces_what_is_at_its_path(tmp_path, existing):
    """`tuner reference record --out` and `tuner report` refuse a path that exists unless asked to overwrite;
    `tuner stress --record PATH` replaced whatever was there (a portable `.ref` bundle that took a recording and
    its replay, any file) once the run passed, and at a directory it ran the whole stress, then ended in an
    internal error. Now nothing runs and nothing is touched."""
    target = tmp_path / "stock.ref"
    if existing == "file":
        target.write_bytes(b"precious")
    else:
        target.mkdir()
    args = parse("--simulate", "stress", "--device", "sim0", "--steps", "5", "--record", str(target))
    with pytest.raises(UsageError, match="already exists"):
        stress.run(args, Context.from_args(args))
    assert target.is_dir() if existing == "directory" else target.read_bytes() == b"precious"


def test_without_a_stock_reference_off_stock_nothing_starts_unless_asked(capsys, monkeypatch):
    """Issue 24 item 2, the CLI's side: after an undervolt there is no stock reference to compare with. The run
    does not start on weaker checks by itself: a one-line usage error says so and how to get the full check."""
    SimulatedBackend(vmin_mv=-50).apply("sim0", -60)
    started = []
    monkeypatch.setattr(stress_action, "default_engine_factory", lambda *a: started.append(a))
    args = parse("--simulate", "--sim-vmin", "-50", "stress", "--device", "sim0", "--steps", "300")
    ctx = Context.from_args(args)
    with pytest.raises(stress_action.NoStockReference) as e:
        stress.run(args, ctx)
    assert e.value.exit_code == 2 and "--no-reference" in e.value.one_line() and "-60 mV" in e.value.one_line()
    assert "tuner reset --device sim0" in e.value.one_line()
    assert started == [] and not ctx.backend._loaded("sim0") and ctx.backend.knob("sim0").current == -60


def test_below_the_simulated_limit_the_real_engine_fails_and_json_says_the_comparison_did_not_run(capsys):
    SimulatedBackend(vmin_mv=-50).apply("sim0", -60)
    args = parse("--simulate", "--sim-vmin", "-50", "stress", "--device", "sim0", "--steps", "300", "--json",
                 "--no-reference")
    ctx = Context.from_args(args)
    code = stress.run(args, ctx)
    captured = capsys.readouterr()
    lines = [json.loads(ln) for ln in captured.out.splitlines()]
    assert code == 1
    names = [d["event"] for d in lines]
    assert names[0] in ("start", "heartbeat") and names[-2:] == ["end", "result"] and "fault" in names
    result = lines[-1]
    assert (result["verdict"], result["device"], result["exit_code"]) == ("fail", "sim0", 1)
    assert result["kind"] in ("canary", "gemm", "nonfinite", "mismatch") and result["failure_step"] <= 300
    assert result["reference"]["compared"] is False and result["reference"]["state"] == "off"
    assert result["checks_off"] == [("the stock-reference comparison did not run: you chose to run without a stock "
                                     "reference")]
    assert lines[-2]["reference"] is None  # the engine's own end: no comparison ran
    assert "reference comparison OFF" in captured.err  # said before the run, on stderr
    assert ctx.backend.knob("sim0").current == -60  # stress never changes the setting


def test_at_stock_the_first_run_records_the_reference_then_compares_and_json_says_so(capsys, monkeypatch):
    """One policy with the Tune screen: at stock with no reference cached, it is recorded first (said), and the
    run is compared with it; the --json stream is the stress run's alone, its result says the comparison ran."""
    monkeypatch.setattr(stress_action, "REFERENCE_RECORD_S", 2.0)
    args = parse("--simulate", "stress", "--device", "sim0", "--steps", "20", "--json")
    ctx = Context.from_args(args)
    assert stress.run(args, ctx) == 0
    captured = capsys.readouterr()
    lines = [json.loads(ln) for ln in captured.out.splitlines()]
    assert [d["event"] for d in lines].count("start") == 1  # the stock recording is not forwarded
    result, end = lines[-1], lines[-2]
    assert result["reference"]["compared"] is True and result["reference"]["state"] == "record-first"
    assert result["checks_off"] == [] and result["verdict"] == "pass"
    assert end["reference"]["compared_steps"] == 20 and end["reference"]["loop"] is True
    assert "recording it first, at stock" in captured.err and "stock reference recorded" in captured.err


def test_a_reference_the_engine_could_not_read_is_not_reported_as_compared(capsys, tmp_path):
    """The result said the plan, not what ran: with a `--reference` file that is not there, the engine ends at its
    setup (nothing compared), yet the --json result said `"compared": true` and `checks_off` was empty."""
    missing = tmp_path / "gone.ref"
    args = parse("--simulate", "stress", "--device", "sim0", "--steps", "5", "--json", "--reference", str(missing))
    assert stress.run(args, Context.from_args(args)) == 2
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["verdict"] == "error" and result["reference"]["state"] == "given"
    assert result["reference"]["compared"] is False
    [off] = result["checks_off"]
    assert off.startswith("the stock-reference comparison did not run: ") and "no such file" in off


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """The stress action's engine pointed at the fake engine script (no torch), with FAKE_ENGINE_MODE set per
    test."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(0o755)
    mode = {"value": "pass"}

    def factory(config, _policy):
        policy = sc.WatchdogPolicy(min_silence_s=1, first_step_timeout_s=5, kill_grace_s=0.5, poll_s=0.05)
        return sc.StressRun(replace(config, python=str(wrapper), env={"FAKE_ENGINE_MODE": mode["value"]}),
                            watchdog=policy)

    monkeypatch.setattr(stress_action, "default_engine_factory", factory)
    return mode


def test_a_pass_prints_a_summary_and_exits_0(fake_engine, capsys):
    args = parse("--simulate", "stress", "--steps", "5", "--no-reference")
    assert stress.run(args, Context.from_args(args)) == 0
    out = capsys.readouterr().out
    assert "stress sim0 (Simulated RDNA-class GPU [SIMULATED]) on cpu, preset tiny, train: PASS" in out
    assert "5 steps in 0.1 s, median 51,200 tok/s, held-out 3.500 bits/byte" in out
    assert "reference: NOT compared (you chose to run without a stock reference)" in out


def test_a_stock_recording_that_keeps_no_reference_is_an_error_and_no_stress_runs(fake_engine, capsys):
    """The fake engine passes without writing the file: nothing to compare with, so no stress run follows (never
    a quiet run on weaker checks), and the verdict is not a pass."""
    args = parse("--simulate", "stress", "--steps", "5")
    assert stress.run(args, Context.from_args(args)) == 2
    out = capsys.readouterr().out
    assert ": ERROR" in out and "no stress run followed and no reference was kept" in out


def test_ctrl_c_stops_the_engine_and_ends_the_load(fake_engine, monkeypatch):
    fake_engine["value"] = "term-graceful"
    args = parse("--simulate", "stress", "--duration", "60", "--no-reference")
    ctx = Context.from_args(args)
    loads, runs = [], []
    monkeypatch.setattr(type(ctx.backend), "note_load", lambda self, dev, active: loads.append(active))
    real_start = sc.StressRun.start

    def start(self):
        runs.append(self)
        return real_start(self)

    def interrupt(self, ev):
        if ev.name == "step":
            raise KeyboardInterrupt

    monkeypatch.setattr(sc.StressRun, "start", start)
    monkeypatch.setattr(stress.ProgressLine, "update", interrupt)
    with pytest.raises(KeyboardInterrupt):
        stress.run(args, ctx)
    assert loads == [True, False]
    assert runs[0].proc.poll() is not None and runs[0].result().kind == "stopped"


def test_json_result_labels_a_simulated_card(fake_engine, capsys):
    """SIMULATED is always labelled: the text summary says `[SIMULATED]`, the `result` line of --json said nothing
    (a fleet script read a simulated card's pass like a real one's)."""
    args = parse("--simulate", "stress", "--steps", "5", "--no-reference", "--json")
    assert stress.run(args, Context.from_args(args)) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["event"] == "result" and result["simulated"] is True


def test_record_in_a_folder_that_cannot_be_written_is_refused_before_the_run(fake_engine, monkeypatch):
    """As `reference record --out`: `stress --record` in a folder this user cannot write is a usage error before the
    engine starts, never an internal error after the whole run (the engine's rename failed at its end). /proc/1 is
    a folder even root may not write."""
    import os

    folder = Path("/proc/1")
    if not folder.is_dir() or os.access(folder, os.W_OK):
        pytest.skip("no folder here that root may not write")
    started = []
    monkeypatch.setattr(sc.StressRun, "start", lambda self: started.append(self) or pytest.fail("the engine ran"))
    args = parse("--simulate", "stress", "--steps", "5", "--record", str(folder / "x.ref"))
    with pytest.raises(UsageError, match="--record"):
        stress.run(args, Context.from_args(args))
    assert started == []



def test_a_given_reference_with_a_gemm_burn_is_refused_like_record(fake_engine, monkeypatch, tmp_path):
    """`--mode gemm --record` is refused (the engine would refuse it); `--mode gemm --reference FILE` ran a PASS,
    exit 0, that compared nothing with the file the user named."""
    ref = tmp_path / "stock.ref"
    ref.write_text("x")
    monkeypatch.setattr(sc.StressRun, "start", lambda self: pytest.fail("the engine ran"))
    args = parse("--simulate", "stress", "--steps", "5", "--mode", "gemm", "--reference", str(ref))
    with pytest.raises(UsageError, match="--reference"):
        stress.run(args, Context.from_args(args))
