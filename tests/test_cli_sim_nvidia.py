"""The CLI on the NVIDIA-style simulated card (`--sim-kind nvidia`): list, status, set (with --lock-mhz), reset,
bisect (with the driver's fake engine, in process) and a profile that round-trips (--save, profile show, apply)."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_tuner
from tests.tuning.fake_engine import FakeEngine
from tuner.actions.context import Context
from tuner.backends.simulated import SimulatedBackend
from tuner.cli import build_parser
from tuner.tuning import trial

NV = ["--simulate", "--sim-kind", "nvidia"]


def tuner(*argv: str) -> int:
    """One command in this process (so a fake engine can stand in for the real one)."""
    args = build_parser().parse_args(list(argv))
    ctx = Context.from_args(args)
    try:
        return args.run(args, ctx)
    finally:
        ctx.close()


def test_list_and_status_show_an_mhz_knob_labelled_simulated():
    listed = run_tuner(*NV, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (card,) = json.loads(listed.stdout)["devices"] if isinstance(json.loads(listed.stdout), dict) else json.loads(
        listed.stdout)
    text = json.dumps(card)
    assert '"simulated": true' in text and "MHz" in text and "clock_offset" in text
    status = run_tuner(*NV, "status", "--device", "sim0", "--json")
    assert status.returncode == 0, status.stderr
    knob = json.loads(status.stdout)["knob"]
    assert (knob["unit"], knob["step"], knob["aggressive_direction"], knob["lock_clock_mhz"]) == ("MHz", 15, 1, 2505)
    human = run_tuner(*NV, "list")
    assert "[SIMULATED]" in human.stdout and "MHz" in human.stdout


def test_set_with_a_lock_clock_then_reset():
    done = run_tuner(*NV, "set", "--device", "sim0", "--offset", "45", "--lock-mhz", "2400", "--yes")
    assert done.returncode == 0, done.stderr
    assert "+0 MHz -> +45 MHz at a locked 2400 MHz (read back)" in done.stdout
    assert SimulatedBackend(kind="nvidia").knob("sim0").current == 45
    assert SimulatedBackend().knob("sim0").current == 0  # the AMD-style card is another card
    reset = run_tuner(*NV, "reset", "--device", "sim0")
    assert reset.returncode == 0 and SimulatedBackend(kind="nvidia").knob("sim0").current == 0


@pytest.mark.parametrize(("args", "fragment"), [
    (["set", "--device", "sim0", "--offset", "40", "--yes"], "15 MHz step"),
    (["set", "--device", "sim0", "--offset", "-30", "--yes"], "overvolt"),
    (["set", "--device", "sim0", "--offset", "30", "--lock-mhz", "9999", "--yes"], "--lock-mhz 9999"),
    (["--sim-vmin", "-50", "list"], "MHz"),
])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(args, fragment):
    proc = run_tuner(*NV, *args)
    assert proc.returncode == 2 and fragment in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    knob = SimulatedBackend(kind="nvidia").knob("sim0")
    assert (knob.current, knob.lock_clock_mhz) == (0, 2505)


def test_an_unknown_sim_kind_is_a_usage_error():
    proc = run_tuner("--simulate", "--sim-kind", "intel", "list")
    assert proc.returncode == 2 and "--sim-kind" in proc.stderr and "Traceback" not in proc.stderr


def test_lock_mhz_is_refused_on_the_amd_style_card():
    proc = run_tuner("--simulate", "set", "--device", "sim0", "--offset", "-10", "--lock-mhz", "2000", "--yes")
    assert proc.returncode == 2 and "only to NVIDIA" in proc.stderr
    assert SimulatedBackend().knob("sim0").current == 0


def test_bisect_recommends_in_mhz_and_the_profile_round_trips(boot, monkeypatch, capsys):
    monkeypatch.setattr(trial, "default_engine_factory", FakeEngine())
    code = tuner(*NV, "--sim-vmin", "100", "bisect", "--device", "sim0", "--trial", "1s", "--confirm", "2s",
                 "--yes", "--save", "nv-sim")
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert code == 0, out
    # defaults in the card's steps: 30 / 15 / 30 MHz; limit +100: +90 passes, +120 fails, +105 fails
    assert "step 30 res 15 margin 30 MHz" in out
    assert "recommendation for Simulated Ada-class GPU (NVIDIA-style) [SIMULATED]: +60 MHz (confirmed +90" in out
    assert "saved profile 'nv-sim'" in out
    assert captured.out.rstrip().endswith("next: tuner apply nv-sim")  # issue 24: the save says what comes next
    assert SimulatedBackend(kind="nvidia").knob("sim0").current == 0

    assert tuner(*NV, "profile", "show", "nv-sim", "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    setting = shown["setting"]
    assert (setting["kind"], setting["value"], setting["unit"]) == ("clock_offset", 60, "MHz")
    assert setting["lock_clock_mhz"] == 2325  # the clock it sustained at stock, power-limited below the 2505 top

    assert tuner(*NV, "apply", "nv-sim", "--yes") == 0
    assert "+60 MHz" in capsys.readouterr().out
    assert SimulatedBackend(kind="nvidia").knob("sim0").current == 60


def test_a_profile_saved_from_last_records_the_lock_the_trials_ran_at(boot, monkeypatch, capsys):
    """The lock is the process's choice: `--from-last` runs in a new process, where nothing has locked the card.
    Its profile must still say the clock the trials ran at (the baseline's sustained clock), as the save at the
    end of the run does, not the V/F table top this new process would default to."""
    from dataclasses import replace

    class SustainsLess(SimulatedBackend):  # sustains 1905 MHz under load, below its 2505 MHz max boost
        def telemetry(self, device_id):
            return replace(super().telemetry(device_id), core_clock_mhz=1905.0)

    # every command opens the card afresh, as a new process would
    monkeypatch.setattr("tuner.actions.context.open_backend", lambda **_kw: SustainsLess(kind="nvidia", vmin_mv=100))
    monkeypatch.setattr(trial, "default_engine_factory", FakeEngine())
    assert tuner(*NV, "bisect", "--device", "sim0", "--trial", "1s", "--confirm", "2s", "--yes", "--save", "now") == 0
    assert tuner(*NV, "bisect", "--device", "sim0", "--save", "later", "--from-last") == 0
    capsys.readouterr()
    locks = {}
    for name in ("now", "later"):
        assert tuner(*NV, "profile", "show", name, "--json") == 0
        locks[name] = json.loads(capsys.readouterr().out)["setting"]["lock_clock_mhz"]
    assert locks == {"now": 1905, "later": 1905}


def test_an_unconfirmed_apply_puts_back_the_lock_clock_the_card_had(monkeypatch, capsys):
    """`tuner apply` set the profile's lock clock before the keep-or-revert change, outside it: a change not
    confirmed then put the card's previous offset back at the profile's lock, a clock nobody confirmed (on NVIDIA
    the lock is what the next write locks to, tuner/backends/nvidia.py `set_lock_clock`)."""
    from dataclasses import replace

    from tests.profiles.helpers import tuner as tuner_in_process
    from tuner.profiles import build_profile, save_profile

    backend = SimulatedBackend(gpus=1, kind="nvidia")  # one process: the lock lives in the backend, as on NVIDIA
    monkeypatch.setattr("tuner.actions.context.open_backend", lambda **_kw: backend)
    dev = backend.devices()[0]
    profile = build_profile("nvlock", dev, backend.knob(dev.id), 45, kernel="6.14.0-test")
    save_profile(replace(profile, setting=replace(profile.setting, lock_clock_mhz=2400)))
    backend.set_lock_clock("sim0", 2280)
    backend.apply("sim0", 30)  # the card holds +30 MHz locked at 2280 MHz before the apply
    code, _out, err = tuner_in_process(capsys, *NV, "apply", "nvlock")  # stdin cannot answer: not confirmed
    assert code == 8, err
    knob = backend.knob("sim0")
    assert (knob.current, knob.lock_clock_mhz) == (30, 2280)
