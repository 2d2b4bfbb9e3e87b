"""`tuner stress`: options -> engine configuration, the progress line, the summary, exit codes; end to end on
the simulated card (the real engine below the card's limit) and with a fake engine (fast paths)."""

from __future__ import annotations

import io
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

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


def test_config_for_a_simulated_card():
    target = StressTarget("cpu", None, fault_rate=0.2, hang=True, simulated=True)
    config, policy = stress.build_config(parse("stress", "--duration", "90s", "--seed", "4"), target)
    o = config.options
    assert (o.device, o.preset, o.duration_s, o.steps, o.seed) == ("cpu", "tiny", 90.0, None, 4)
    assert o.fault_rate == 0.2 and [str(i) for i in o.injections] == ["hang@3"] and o.canary_every == 10
    assert policy.min_silence_s == 5.0 and policy.kill_grace_s == 2.0


def test_config_for_a_real_card():
    target = StressTarget("cuda:1", "0000:03:00.0", env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    config, policy = stress.build_config(parse("stress", "--steps", "500", "--mode", "mixed", "--dtype", "fp16",
                                               "--reference", "r.json"), target)
    o = config.options
    assert (o.device, o.preset, o.steps, o.duration_s) == ("cuda:1", "nanochat", 500, None)
    assert (o.mode, o.dtype, o.reference, o.fault_rate) == ("mixed", "fp16", "r.json", 0.0)
    assert o.expect_pci_bus_id == "0000:03:00.0" and o.canary_every == 100  # the engine's default
    assert o.compile is None and not any("compile" in a for a in config.argv())
    off, _ = stress.build_config(parse("stress", "--steps", "5", "--no-compile", "--preset", "small"), target)
    assert off.options.compile is False and "--no-compile" in off.argv() and off.options.preset == "small"
    assert policy == sc.WatchdogPolicy()
    with pytest.raises(UsageError):
        stress.build_config(parse("stress", "--duration", "soon"), target)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_draws_step_loss_throughput_and_eta():
    now = [100.0]
    out = _Tty()
    line = stress.ProgressLine(out, steps=None, duration_s=60.0, clock=lambda: now[0])
    line.update(sc.parse_event('{"event":"start","t":1}'))
    now[0] = 115.0
    line.update(sc.parse_event('{"event":"step","t":2,"step":42,"loss":2.5,"grad_norm":1,"dt_ms":20,"tok_s":25600}'))
    assert out.getvalue() == "\r\033[Kstep 42  loss 2.5000  25,600 tok/s  ETA 45s"  # _output.StatusLine
    now[0] = 115.1
    line.update(sc.parse_event('{"event":"step","t":2,"step":43,"loss":2.4,"dt_ms":20,"tok_s":25600}'))
    assert out.getvalue().count("\r") == 1  # at most 4 redraws a second
    line.clear()
    by_steps = stress.ProgressLine(_Tty(), steps=100, duration_s=None, clock=lambda: 0.0)
    by_steps.update(sc.parse_event('{"event":"start","t":1}'))
    ev = sc.parse_event('{"event":"step","t":2,"step":40,"loss":"NaN","dt_ms":500,"tok_s":1000}')
    by_steps.update(ev)
    assert by_steps.text(ev) == "step 40/100  loss nan  1,000 tok/s  ETA 30s"
    quiet = io.StringIO()
    stress.ProgressLine(quiet, steps=5, duration_s=None).update(ev)
    assert quiet.getvalue() == ""  # not a terminal: no progress line


def _result(**kw):
    base = {"verdict": "pass", "kind": None, "reason": "completed", "failure_step": None, "steps": 10,
            "duration_s": 1.0, "median_tok_s": 5000.0, "bpb": 3.2, "exit_code": 0, "sensitivity": "full"}
    return sc.StressResult(**{**base, **kw})


def test_exit_codes_and_summary():
    assert stress.exit_code_for(_result()) == 0
    assert stress.exit_code_for(_result(verdict="fail", kind="hang")) == 1
    assert stress.exit_code_for(_result(verdict="error", kind="setup")) == 2
    assert stress.exit_code_for(_result(verdict="error", kind="stopped")) == 130
    dev = SimulatedBackend().device("sim0")
    cfg = sc.EngineConfig(EngineOptions(steps=10))
    text = "\n".join(stress.summary_lines(dev, cfg, _result(verdict="fail", kind="mismatch", failure_step=7,
                                                             reason="loss bits differ")))
    assert "FAIL" in text and "mismatch at step 7: loss bits differ" in text and "10 steps in 1.0 s" in text


def test_unknown_device_is_a_usage_error():
    args = parse("--simulate", "stress", "--device", "sim9", "--steps", "5")
    with pytest.raises(TunerError, match="sim9"):
        stress.run(args, Context.from_args(args))


def test_below_the_simulated_limit_the_real_engine_fails_and_json_forwards_events(capsys):
    SimulatedBackend(vmin_mv=-50).apply("sim0", -60)
    args = parse("--simulate", "--sim-vmin", "-50", "stress", "--device", "sim0", "--steps", "300", "--json")
    ctx = Context.from_args(args)
    code = stress.run(args, ctx)
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert code == 1
    names = [d["event"] for d in lines]
    assert names[0] in ("start", "heartbeat") and names[-2:] == ["end", "result"] and "fault" in names
    result = lines[-1]
    assert (result["verdict"], result["device"], result["exit_code"]) == ("fail", "sim0", 1)
    assert result["kind"] in ("canary", "gemm", "nonfinite", "mismatch") and result["failure_step"] <= 300
    assert ctx.backend.knob("sim0").current == -60  # stress never changes the setting


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """`build_config` pointed at the fake engine script (no torch), with FAKE_ENGINE_MODE set per test."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(0o755)
    real = stress.build_config
    mode = {"value": "pass"}

    def build(args, target):
        config, _ = real(args, target)
        policy = sc.WatchdogPolicy(min_silence_s=1, first_step_timeout_s=5, kill_grace_s=0.5, poll_s=0.05)
        return replace(config, python=str(wrapper), env={"FAKE_ENGINE_MODE": mode["value"]}), policy

    monkeypatch.setattr(stress, "build_config", build)
    return mode


def test_a_pass_prints_a_summary_and_exits_0(fake_engine, capsys):
    args = parse("--simulate", "stress", "--steps", "5")
    assert stress.run(args, Context.from_args(args)) == 0
    out = capsys.readouterr().out
    assert "stress sim0 (Simulated RDNA-class GPU [SIMULATED]) on cpu, preset tiny, train: PASS" in out
    assert "5 steps in 0.1 s, median 51,200 tok/s, held-out 3.500 bits/byte" in out


def test_ctrl_c_stops_the_engine_and_ends_the_load(fake_engine, monkeypatch):
    fake_engine["value"] = "term-graceful"
    args = parse("--simulate", "stress", "--duration", "60")
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
