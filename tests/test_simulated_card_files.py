"""The simulated cards keep one file per card, changed under a lock (issue 28, item 9): two processes that touch
different cards of one simulated rig never undo each other's writes (sim0 ended at -50 mV with no owner)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.cli_helpers import REPO
from tuner.backends.simulated import SimulatedBackend
from tuner.backends.simulated_card_files import RECORD_BYTES

WRITER = textwrap.dedent("""
    import sys
    from tuner.backends.simulated import SimulatedBackend

    card, value, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sim = SimulatedBackend(gpus=2)  # its own view of the rig, taken before the other process writes
    print("ready", flush=True)
    sys.stdin.readline()  # both start together
    for i in range(rounds):
        sim.note_load(card, True)
        sim.apply(card, value if i % 2 else -5)
        sim.note_load(card, False)
    sim.apply(card, value)
""")


def _writer(card: str, value: int, rounds: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, card, str(value), str(rounds)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_two_processes_on_two_cards_of_one_rig_keep_both_settings():
    writers = [_writer("sim0", -50, 150), _writer("sim1", -30, 150)]
    for proc in writers:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in writers:
        proc.stdin.close()
        assert proc.wait(120) == 0
    rig = SimulatedBackend(gpus=2)
    assert (rig.knob("sim0").current, rig.knob("sim1").current) == (-50, -30)
    assert not rig._loaded("sim0") and not rig._loaded("sim1")


def test_a_stale_view_of_the_rig_never_overwrites_another_card(tmp_path):
    """The same race without timing: two backends opened before either writes (two processes' memories)."""
    first, second = SimulatedBackend(gpus=2), SimulatedBackend(gpus=2)
    first.apply("sim0", -50)
    second.apply("sim1", -30)
    second.note_load("sim1", True)
    assert SimulatedBackend(gpus=2).knob("sim0").current == -50


def test_each_card_is_one_fixed_size_record_rewritten_in_place():
    """In place: once written, a card needs no new disk block to go back to stock (a full disk cannot stop it)."""
    sim = SimulatedBackend(gpus=2)
    sim.apply("sim1", -40)
    card = sim.state_path / "sim1.json"
    inode = os.stat(card).st_ino
    assert os.path.getsize(card) == RECORD_BYTES and json.loads(card.read_text()) == {"offset_mv": -40}
    sim.reset("sim1")
    assert os.stat(card).st_ino == inode and json.loads(card.read_text()) == {}
    assert not (sim.state_path / "sim0.json").exists()  # never written: stock, no file
