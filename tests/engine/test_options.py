"""Command-line parsing of the engine: bounds, durations, dtypes, injections, usage errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.engine.options import EngineOptions, Injection, UsageProblem, parse_args


def test_defaults_need_a_bound():
    with pytest.raises(UsageProblem, match="nothing bounds the run"):
        parse_args([], environ={})


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1h", 3600.0),
                                               ("1.5", 1.5)])
def test_duration_forms(text, seconds):
    assert parse_args(["--duration", text], environ={}).duration_s == seconds


@pytest.mark.parametrize("argv", [
    ["--duration", "5x"], ["--steps", "0"], ["--steps", "3", "--fault-rate", "1.5"], ["--steps", "3", "--mode", "x"],
    ["--steps", "3", "--device", "gpu0"], ["--steps", "3", "--inject", "flip@3"], ["--steps", "3", "--inject",
    "bitflip@0"], ["--steps", "3", "--inject", "nan@3:weight"], ["--steps", "3", "--dtype", "int8"],
    ["--steps", "3", "--record", "a.json", "--reference", "a.json"], ["--steps", "x"], ["--bogus"],
    ["--mode", "gemm", "--steps", "3", "--reference", "r.json"], ["--steps", "3", "--reference-loop"],
    ["--steps", "3", "--reference", "r.json", "--record", "s.json", "--reference-loop"],
])
def test_usage_errors(argv):
    with pytest.raises(UsageProblem):
        parse_args(argv, environ={})


@pytest.mark.parametrize("flag", ["--canary-every-s", "--heartbeat-s", "--mixed-full-s", "--mixed-partial-s",
                                  "--idle-gap-s"])
def test_nan_is_a_usage_error(flag):
    # NaN compares false both ways, so `< 0` and `> 1` let it through: --canary-every-s nan turned the timed canary
    # off without a word (`elapsed >= nan` is never true), --heartbeat-s nan gave the heartbeat no interval
    with pytest.raises(UsageProblem, match=flag):
        parse_args(["--steps", "3", flag, "nan"], environ={})


def test_dtype_flag_beats_environment_which_beats_auto():
    assert parse_args(["--steps", "1"], environ={}).dtype == "auto"
    assert parse_args(["--steps", "1"], environ={"TUNER_DTYPE": "bfloat16"}).dtype == "bf16"
    assert parse_args(["--steps", "1", "--dtype", "fp32"], environ={"TUNER_DTYPE": "float16"}).dtype == "fp32"


def test_injections_parse():
    opts = parse_args(["--steps", "9", "--inject", "bitflip@3", "--inject", "bitflip@4:activation:30",
                       "--inject", "nan@5", "--inject", "hang@6"], environ={})
    assert [str(i) for i in opts.injections] == ["bitflip@3:weight", "bitflip@4:activation:30", "nan@5", "hang@6"]
    assert opts.injections[1] == Injection("bitflip", 4, "activation", 30)


@given(kind=st.sampled_from(["bitflip", "nan", "hang"]), step=st.integers(1, 10**6),
       target=st.sampled_from(["weight", "activation"]), bit=st.one_of(st.none(), st.integers(0, 31)))
def test_injection_round_trip(kind, step, target, bit):
    inj = Injection(kind, step, target if kind == "bitflip" else ("activation" if kind == "nan" else "weight"),
                    bit if kind == "bitflip" else None)
    assert Injection.parse(str(inj)) == inj


def test_fault_seed_defaults_to_the_seed_and_may_be_negative():
    assert parse_args(["--steps", "1", "--seed", "3"], environ={}).effective_fault_seed == 3
    opts = parse_args(["--steps", "1", "--seed", "3", "--fault-seed=-50"], environ={})
    assert (opts.seed, opts.fault_seed, opts.effective_fault_seed) == (3, -50, -50)


def test_warmup_default_comes_from_the_preset():
    assert EngineOptions(steps=1).effective_warmup_steps == 5
    assert EngineOptions(steps=1, preset="small").effective_warmup_steps == 20
    assert EngineOptions(steps=1, warmup_steps=0).effective_warmup_steps == 0


def test_nanochat_is_the_gpu_default_and_compile_follows_the_device():
    from tuner.engine.options import parse_args

    assert parse_args(["--device", "cuda:0", "--steps", "1"], environ={}).preset == "nanochat"
    assert parse_args(["--steps", "1"], environ={}).preset == "tiny"
    gpu = parse_args(["--device", "cuda:0", "--steps", "1"], environ={})
    assert gpu.compile is None and gpu.compile_enabled("cuda") and not gpu.compile_enabled("cpu")
    assert parse_args(["--steps", "1", "--compile"], environ={}).compile_enabled("cpu")
    assert not parse_args(["--device", "cuda:0", "--steps", "1", "--no-compile"], environ={}).compile_enabled("cuda")
    injected = parse_args(["--device", "cuda:0", "--steps", "1", "--fault-rate", "0.1"], environ={})
    assert not injected.compile_enabled("cuda")  # fault injection hooks eager modules
    with pytest.raises(UsageProblem):
        parse_args(["--steps", "1", "--compile", "--inject", "bitflip@1"], environ={})


def test_compile_preset_and_cache_dir_survive_the_command_line():
    from tuner.engine.options import to_argv

    for compile_on in (None, True, False):
        for device, preset in (("cuda:0", "tiny"), ("cpu", "nanochat"), ("cuda:1", "nanochat")):
            opts = EngineOptions(device=device, preset=preset, steps=3, compile=compile_on, cache_dir="/x y/c")
            back = parse_args(to_argv(opts), environ={})
            assert (back.preset, back.compile, back.cache_dir) == (preset, compile_on, "/x y/c")
