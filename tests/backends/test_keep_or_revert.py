"""PendingChange (confirm or revert) and `tuner set`, including revert on SIGTERM/SIGHUP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.actions.keep_or_revert import PendingChange
from tuner.backends.simulated import SimulatedBackend
from tuner.core import signals
from tuner.core.signals import Terminated

from .conftest import amd_on_fake_kernel

TUNER = [sys.executable, "-m", "tuner"]


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


@pytest.fixture
def sim(tmp_path):
    return SimulatedBackend(state_path=tmp_path / "sim.json")


def test_keep_keeps_and_timer_counts(sim):
    clock = FakeClock()
    change = PendingChange(sim, "sim0", -50, timeout_s=15, clock=clock)
    with change:
        assert change.seconds_left() == 15 and not change.expired()
        clock.t += 16
        assert change.expired()
        change.keep()
    assert sim.knob("sim0").current == -50 and change.reverted_to is None


def test_leaving_without_keep_reverts_to_stock_via_reset(sim):
    with PendingChange(sim, "sim0", -50) as change:
        assert sim.knob("sim0").current == -50
    assert sim.knob("sim0").current == 0 and change.reverted_to.current == 0


def test_revert_restores_a_non_stock_previous(sim):
    sim.apply("sim0", -20)
    with PendingChange(sim, "sim0", -50):
        pass
    assert sim.knob("sim0").current == -20


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt(), Terminated(signal.SIGTERM)])
def test_exceptions_revert(sim, exc):
    with pytest.raises(type(exc)), PendingChange(sim, "sim0", -50):
        raise exc
    assert sim.knob("sim0").current == 0


def test_amd_signal_path_in_process_restores_stock(tmp_path):
    backend, fio = amd_on_fake_kernel(tmp_path, ["rdna4"])
    dev = backend.devices()[0].id
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    signals.install()
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with pytest.raises(Terminated), PendingChange(backend, dev, -40):
                os.kill(os.getpid(), sig)
                time.sleep(5)  # interrupted by the signal
            assert backend.knob(dev).current == 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert fio.commands() == ["vo -40", "c", "vo 0", "c"] * 2


def _start_set(tmp_path, *args):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [*TUNER, "--simulate", "set", "--offset", "-50", *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


def _sim_offset(tmp_path):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    out = subprocess.run(
        [*TUNER, "--simulate", "list", "--json"], env=env, capture_output=True, text=True, check=True
    ).stdout
    import json

    return json.loads(out)["devices"][0]["knob"]["current"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_set_killed_during_confirmation_restores_stock(tmp_path, sig):
    proc = _start_set(tmp_path, "--keep-timeout", "60")
    line = proc.stdout.readline()  # printed after the apply, before the prompt
    assert "-50 mV" in line
    assert _sim_offset(tmp_path) == -50
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert _sim_offset(tmp_path) == 0


def test_set_yes_line_on_piped_stdin_keeps(tmp_path):
    proc = _start_set(tmp_path)
    _out, err = proc.communicate("y\n", timeout=30)
    assert proc.returncode == 0, err
    assert _sim_offset(tmp_path) == -50


def test_set_eof_reverts_and_bad_values_exit_2(tmp_path):
    proc = _start_set(tmp_path)
    _, err = proc.communicate("", timeout=30)
    assert proc.returncode == 8 and "reverted" in err
    assert _sim_offset(tmp_path) == 0
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    for offset in ("-51", "+10", "-500"):
        r = subprocess.run(
            [*TUNER, "--simulate", "set", "--offset", offset, "--yes"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 2 and r.stderr.startswith("tuner: error:"), r.stderr
    assert _sim_offset(tmp_path) == 0


def test_signal_during_apply_is_held_and_then_reverts(tmp_path):
    """SIGTERM arriving while the write is in flight must not leave the new value behind."""
    import os
    import signal as _signal

    from tuner.actions.keep_or_revert import PendingChange
    from tuner.backends.simulated import SimulatedBackend
    from tuner.core import signals
    from tuner.core.signals import Terminated

    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    real_apply = backend.apply

    def apply_then_get_signalled(device_id, value, **kw):
        knob = real_apply(device_id, value, **kw)
        os.kill(os.getpid(), _signal.SIGTERM)  # delivered while the change is not yet recorded
        return knob

    backend.apply = apply_then_get_signalled
    previous = {s: _signal.getsignal(s) for s in (_signal.SIGTERM, _signal.SIGHUP)}
    signals.install()
    try:
        with pytest.raises(Terminated), PendingChange(backend, "sim0", -50):
            pytest.fail("the body must not run")
    finally:
        for s, h in previous.items():
            _signal.signal(s, h)
    assert backend.knob("sim0").current == 0
