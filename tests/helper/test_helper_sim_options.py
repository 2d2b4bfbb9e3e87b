"""`tuner-helper --simulate` takes the simulator's options as `tuner --simulate` does: a tuner compares its own with
the helper's (tuner.actions.context), and its refusal says "start the helper with the same --sim options". So the
two parse them with one declaration (tuner.backends.simulated_options): the same values, the same refusals."""

from __future__ import annotations

import pytest

from tuner import cli
from tuner.helper import cli as helper_cli

# What a simulated helper describes to its clients (tuner.helper.schema.SimConfig); the client compares these.
SHARED = ("sim_gpus", "sim_seed", "sim_kind", "sim_vmin", "sim_nondeterministic", "sim_contention_after")


@pytest.mark.parametrize("argv", [
    ["--sim-vmin", "-52,-67"],  # the README's rig of two: refused by the helper as "expected one argument"
    ["--sim-vmin", "-40"],
    ["--sim-gpus", "2", "--sim-seed", "7"],
    ["--sim-kind", "nvidia", "--sim-vmin", "120,90", "--sim-gpus", "2"],
    ["--sim-nondeterministic", "--sim-contention-after", "30"],
])
def test_the_helper_reads_the_simulator_options_as_the_tuner_does(argv):
    ours = cli._parse(["--simulate", *argv])
    helpers = helper_cli.build_parser().parse_args(["--simulate", *argv])
    assert {name: getattr(helpers, name) for name in SHARED} == {name: getattr(ours, name) for name in SHARED}


@pytest.mark.parametrize("argv", [
    ["--sim-vmin", "-٣٠"],  # int() reads other scripts' digits
    ["--sim-vmin=-3_0"],  # and underscores
    ["--sim-gpus", "٢"],
    ["--sim-seed", "1_0"],
    ["--sim-contention-after", "nan"],  # float() reads nan and inf
    ["--sim-contention-after", "inf"],
])
def test_a_number_the_tuner_refuses_the_helper_refuses_with_one_line(argv, capsys):
    for parse in (cli._parse, helper_cli.build_parser().parse_args):
        with pytest.raises(SystemExit) as ended:
            parse(["--simulate", *argv])
        assert ended.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ": error: argument " + argv[0].split("=")[0] in err, err
