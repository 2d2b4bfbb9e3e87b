"""The simulated fleet: `--sim-sdc-rate` (a bad card's per-step corruption at every setting, stock included) and
`--sim-driver` (another driver field), so the screen runs without hardware."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_tuner
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.core.errors import UsageError


def test_a_bad_card_corrupts_at_stock_and_deeper(tmp_path):
    b = SimulatedBackend(gpus=3, sdc_rate=(0.0, 0.01), vmin_mv=(-50, -50, -50), state_path=tmp_path / "s.json")
    assert b.stress_target("sim0").fault_rate == 0.0
    assert b.stress_target("sim1").fault_rate == 0.01  # at stock
    assert b.stress_target("sim2").fault_rate == 0.0  # not given: a good card
    b.apply("sim1", -55)
    deeper = b.stress_target("sim1").fault_rate
    assert deeper == pytest.approx(1 - (1 - 0.01) * (1 - 0.25))  # its own rate and the depth's, independent


@pytest.mark.parametrize("rates", [(0.1, 0.1, 0.1), (-0.1,), (1.5,), (float("nan"),)])
def test_bad_rates_are_refused(tmp_path, rates):
    with pytest.raises(UsageError, match="--sim-sdc-rate"):
        SimulatedBackend(gpus=2, sdc_rate=rates, state_path=tmp_path / "s.json")


def test_cli_driver_and_rate():
    r = run_tuner("--simulate", "--sim-gpus", "2", "--sim-driver", "999.1", "--sim-sdc-rate", "0,0.01", "list",
                  "--json")
    assert r.returncode == 0, r.stderr
    devices = json.loads(r.stdout)
    cards = devices["devices"] if isinstance(devices, dict) else devices
    assert {c.get("driver_version") or c["device"]["driver_version"] for c in cards} == {"999.1"}


@pytest.mark.parametrize("value", ["abc", "0.1,x", "2", "-0.5"])
def test_cli_bad_rate_is_one_line(value):
    r = run_tuner("--simulate", "--sim-sdc-rate", value, "list")
    assert r.returncode == exit_codes.USAGE
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_exit_codes_are_documented():
    r = run_tuner("--help")
    assert "10   screen: retest" in r.stdout and "11   screen: incomparable" in r.stdout


@pytest.mark.parametrize("value", ["٠.٥", "0.0_1", "0,٠.٥", "1e-3", "nan"])
def test_a_rate_is_ascii_decimal_digits_like_every_other_number(value):
    """float() takes other scripts' digits (`٠.٥` is 0.5), underscores and exponents; every other number on the
    command line is ASCII digits only (tuner.core.argtypes, tuner.core.numbers)."""
    r = run_tuner("--simulate", "--sim-sdc-rate", value, "list")
    assert r.returncode == exit_codes.USAGE, r.stdout
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "ASCII" in r.stderr
