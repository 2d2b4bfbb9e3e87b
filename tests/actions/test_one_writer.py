"""One writer per card through the real CLI: while another process holds the card (a bisect, a pending `set`),
`set`, `apply`, `reset` and `bisect` are refused with the holder named and the card untouched; `reset --force`
is the way out for a stuck holder (issue 11, defect 4)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.cli_helpers import REPO, run_tuner
from tests.profiles.helpers import sim_profile
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.profiles import save_profile


@pytest.fixture
def holder():
    """Another process holding sim0's writer lock, as a running bisect does, until the test ends."""
    code = textwrap.dedent("""
        import sys
        from tuner.core.card_lock import CardLock
        with CardLock("sim0", "auto-bisect of sim0"):
            print("held", flush=True)
            sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.stdin.close()
    proc.wait(10)


def _card(value: int) -> None:
    backend = SimulatedBackend()
    backend.apply("sim0", value)


@pytest.mark.parametrize("command", [
    ["set", "--device", "sim0", "--offset", "-30", "--yes"],
    ["apply", "held-test", "--yes"],
    ["reset"],
    ["bisect", "--device", "sim0", "--trial", "2s", "--confirm", "2s"],
], ids=["set", "apply", "reset", "bisect"])
def test_a_second_writer_is_refused_with_the_holder_named(holder, command):
    save_profile(sim_profile("held-test", value=-45))
    _card(-10)  # what the holder (a bisect's trial) has on the card
    proc = run_tuner("--simulate", *command)
    assert proc.returncode == exit_codes.BUSY, proc.stderr
    assert f"pid {holder.pid} (auto-bisect of sim0)" in proc.stderr and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tuner: error:")]
    assert len(errors) == 1
    assert SimulatedBackend().knob("sim0").current == -10  # nothing changed under the holder


def test_reset_force_puts_the_card_back_despite_a_stuck_holder(holder):
    _card(-10)
    proc = run_tuner("--simulate", "reset", "--force")
    assert proc.returncode == 0, proc.stderr
    assert f"held by pid {holder.pid}" in proc.stderr and "--force" in proc.stderr
    assert SimulatedBackend().knob("sim0").current == 0


def test_a_change_nobody_confirmed_has_its_own_exit_code():
    proc = run_tuner("--simulate", "set", "--device", "sim0", "--offset", "-30", input="")
    assert proc.returncode == exit_codes.NOT_CONFIRMED == 8
    assert "not confirmed: reverted to +0 mV" in proc.stderr
    assert SimulatedBackend().knob("sim0").current == 0


def test_reset_all_resets_every_card_it_can_when_one_is_held():
    """`tuner reset --all` with one card held by another writer: the held card is refused (exit 6, its holder named)
    but every other card still goes back to stock. Before, the reset stopped at the held card: sim2 kept its
    undervolt, sim0 had been reset without a word, and the one line said "nothing was changed"."""
    code = textwrap.dedent("""
        import sys
        from tuner.core.card_lock import CardLock
        with CardLock("sim1", "auto-bisect of sim1"):
            print("held", flush=True)
            sys.stdin.read()
    """)
    backend = SimulatedBackend(gpus=3)
    for card in ("sim0", "sim1", "sim2"):
        backend.apply(card, -10)
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}) as holder:
        assert holder.stdout.readline().strip() == "held"
        proc = run_tuner("--simulate", "--sim-gpus", "3", "reset", "--all")
        holder.stdin.close()
    assert proc.returncode == exit_codes.BUSY, proc.stderr
    assert f"pid {holder.pid} (auto-bisect of sim1)" in proc.stderr and "Traceback" not in proc.stderr
    assert "sim0" in proc.stdout and "sim2" in proc.stdout, proc.stdout  # what was reset is said
    after = SimulatedBackend(gpus=3)
    assert [after.knob(c).current for c in ("sim0", "sim1", "sim2")] == [0, -10, 0]
