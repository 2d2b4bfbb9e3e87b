"""A value that froze, hung or reset the card in a trial is never applied again without an explicit override."""

import json

from tests.cli_helpers import run_tuner
from tuner.tuning import journal


def _mark_unsafe(setting):
    journal.add_unsafe("sim0", setting, unit="mV", kind="system-reset", reason="machine reset during a trial",
                       edge=True)


def test_set_refuses_values_at_or_beyond_an_unsafe_one():
    _mark_unsafe(-80)
    for value in ("-80", "-95"):
        proc = run_tuner("--simulate", "set", "--device", "sim0", "--offset", value, "--yes")
        assert proc.returncode == 2, proc.stderr
        assert "failed hard" in proc.stderr and "--ignore-unsafe" in proc.stderr
    status = json.loads(run_tuner("--simulate", "status", "--device", "sim0", "--json").stdout)
    assert status["knob"]["current"] == 0  # nothing was written
    assert run_tuner("--simulate", "set", "--device", "sim0", "--offset", "-75", "--yes").returncode == 0
    ok = run_tuner("--simulate", "set", "--device", "sim0", "--offset", "-80", "--yes", "--ignore-unsafe")
    assert ok.returncode == 0, ok.stderr


def test_apply_refuses_an_unsafe_profile_value(tmp_path):
    from tuner.backends.simulated import SimulatedBackend
    from tuner.profiles import build_profile, save_profile

    backend = SimulatedBackend()
    device = backend.devices()[0]
    save_profile(build_profile("edge", device, backend.knob("sim0"), -60))
    _mark_unsafe(-60)
    proc = run_tuner("--simulate", "apply", "edge", "--yes")
    assert proc.returncode == 2 and "failed hard" in proc.stderr, proc.stderr
    assert SimulatedBackend().knob("sim0").current == 0


def test_a_later_entry_in_another_unit_at_the_same_number_does_not_hide_an_unsafe_value():
    """The slot's list holds -40 mV (the card that reset the machine) and, later, -40 MHz (another kind of card
    swapped into the slot): the entries were first keyed by setting, the latest winning, then filtered by the
    knob's unit, so the -40 mV entry was gone before the filter and -40 mV was applied to the card that crashed."""
    import pytest

    from tuner.backends.simulated import SimulatedBackend
    from tuner.core.errors import UsageError

    _mark_unsafe(-40)
    journal.add_unsafe("sim0", -40, unit="MHz", kind="hang", reason="hang at -40 MHz", edge=True)
    knob = SimulatedBackend().knob("sim0")
    assert knob.unit == "mV"
    with pytest.raises(UsageError, match="failed hard"):
        journal.refuse_unsafe("sim0", knob, -40)


def test_an_entry_follows_its_card_to_another_slot():
    """The card now in sim1 reset the machine at -60 mV while it sat in sim0 (the entry, filed under the slot,
    names its serial). The per-user list was read by slot alone, so set, apply, boot apply and the bisect plan
    asked only sim1's file and -60 mV was applied again to the card that crashed at it; sim0's entry still
    refuses whatever card is in sim0 now (the safe direction)."""
    import pytest

    from tuner.backends.simulated import SimulatedBackend
    from tuner.core.errors import UsageError

    backend = SimulatedBackend(gpus=2)
    moved = backend.device("sim1").serial
    journal.add_unsafe("sim0", -60, unit="mV", kind="system-reset", reason="machine reset during a trial",
                       edge=True, serial=moved)
    knob = backend.knob("sim1")
    with pytest.raises(UsageError, match="failed hard"):
        journal.refuse_unsafe("sim1", knob, -60, backend)
    assert -60 in journal.unsafe_settings("sim1", backend, unit="mV")
    with pytest.raises(UsageError, match="failed hard"):
        journal.refuse_unsafe("sim0", backend.knob("sim0"), -60, backend)  # the slot still refuses
    proc = run_tuner("--simulate", "--sim-gpus", "2", "set", "--device", "sim1", "--offset", "-65", "--yes")
    assert proc.returncode == 2 and "failed hard" in proc.stderr, proc.stderr
    assert SimulatedBackend(gpus=2).knob("sim1").current == 0


def test_unsafe_clear_removes_an_entry_that_followed_its_card():
    """What the card's list shows (an entry recorded at its old slot) is what clear removes; the old slot's other
    entries stay."""
    from tuner.backends.simulated import SimulatedBackend

    backend = SimulatedBackend(gpus=2)
    journal.add_unsafe("sim0", -60, unit="mV", kind="hang", reason="hang", edge=True,
                       serial=backend.device("sim1").serial)
    journal.add_unsafe("sim0", -70, unit="mV", kind="hang", reason="hang", edge=True,
                       serial=backend.device("sim0").serial)
    assert [e["setting"] for e in journal.clear_unsafe("sim1", backend=backend)] == [-60]
    assert journal.unsafe_settings("sim1", backend) == {}
    assert list(journal.unsafe_settings("sim0", backend)) == [-70]
