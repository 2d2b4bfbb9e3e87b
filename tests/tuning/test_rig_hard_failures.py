"""Issue 28, items 4 and 6: a rig's hard failure is handled as a single card's is (one rule, one place), and a
dead or torn rig journal is seen by `status` and refused by `set` and `apply` as a card's journal is.

Each test failed on the code before the fix: the rig confirmation never added to the unsafe list and backed a hung
card off one resolution step; `status` said nothing about cards left at -40/-30 mV by a dead rig trial (warnings
`[]`) nor about a torn rig journal; `set` and `apply rig --yes` went ahead over a torn rig journal.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.profiles.helpers import sim, tuner
from tests.tuning.fake_engine import FakeEngine
from tests.tuning.rig_fakes import FakeRigTrial
from tuner.actions.bisect import prepare_bisect
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.profiles import RigPart, build_rig_profile, save_profile
from tuner.tuning import journal
from tuner.tuning.events import RigConfirmFinished
from tuner.tuning.job import BisectParams

LIMITS = (-52, -67)
CARDS = ("sim0", "sim1")
DEAD_PID = 2**22 + 4321


def _rig(kind: str | None):
    """Two cards (own recommendations -40 and -55 mV); under the rig load sim1 fails at -55 with `kind`."""
    backend = SimulatedBackend(gpus=2, vmin_mv=LIMITS)
    rig = FakeRigTrial(pin=(lambda d, s: d == "sim1" and s == -55) if kind else None, pin_kind=kind or "mismatch")
    events: list = []
    job = prepare_bisect(backend, CARDS, BisectParams(trial_s=1, confirm_s=2), events.append, run_trial=rig,
                         engine_factory=FakeEngine())
    return job, rig, events


@pytest.mark.parametrize("kind", ["hang", "gpu-reset"])  # an engine's and a kernel line's edge: one path
def test_a_hard_failure_in_the_rig_confirmation_goes_on_the_unsafe_list_with_the_edge_margin(boot, kind):
    job, rig, events = _rig(kind)
    outcome = job.run()
    # the value that failed hard is never tried again on that card; nothing is blamed on the other card
    assert journal.unsafe_settings("sim1")[-55]["edge"] and journal.unsafe_settings("sim1")[-55]["kind"] == kind
    # under the serial of the card it ran on (the root helper files an imported line by it: service._key_for)
    assert journal.unsafe_settings("sim1")[-55]["serial"] == SimulatedBackend(gpus=2).device("sim1").serial
    assert journal.unsafe_settings("sim0") == {}
    # backed off by the edge margin (15 mV), as a single card's recommendation keeps it after a hard failure
    first = next(e for e in events if isinstance(e, RigConfirmFinished) and e.attempt == 1)
    assert first.pinned == ("sim1",) and first.backed_off == {"sim0": -40, "sim1": -40}
    assert [c[0] for c in rig.calls[1:]] == [{"sim0": -40, "sim1": -55}, {"sim0": -40, "sim1": -40}]
    assert dict(outcome.settings) == {"sim0": -40, "sim1": -40}


def test_a_soft_failure_in_the_rig_confirmation_backs_off_one_step_and_blames_nothing_for_good(boot):
    job, rig, _events = _rig("mismatch")
    outcome = job.run()
    assert [c[0] for c in rig.calls[1:]] == [{"sim0": -40, "sim1": -55}, {"sim0": -40, "sim1": -50}]
    assert dict(outcome.settings) == {"sim0": -40, "sim1": -50}
    assert journal.unsafe_settings("sim0") == {} and journal.unsafe_settings("sim1") == {}


# --- item 6: a dead or torn rig journal -------------------------------------------------------------------------
def _rig_journal_path():
    return journal.journal_dir() / "rig+sim0+sim1.rig.json"


def _dead_rig_trial(boot_id: str = "boot-a") -> None:
    """What a kill -9 during the rig confirmation leaves: the open rig trial, every card at its setting."""
    doc = {"version": 1, "session": "20250101-000000-abcdef", "devices": list(CARDS), "state": "active",
           "phase": "confirm", "pid": DEAD_PID, "boot_id": boot_id, "params": {}, "stock": {"sim0": 0, "sim1": 0},
           "sessions": {}, "candidates": {"sim0": -40, "sim1": -30}, "attempts": [], "never": [],
           "open_trial": {"phase": "rig-confirm", "attempt": 1, "settings": {"sim0": -40, "sim1": -30},
                          "boot_id": boot_id, "pid": DEAD_PID, "started_at": 1.0}}
    path = _rig_journal_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    backend = sim(gpus=2)
    backend.apply("sim0", -40)
    backend.apply("sim1", -30)


def test_status_warns_about_a_dead_rig_trial_on_every_card_it_left_changed(capsys, boot):
    _dead_rig_trial()
    code, out, _err = tuner(capsys, "--simulate", "--sim-gpus", "2", "status", "--json")
    assert code == 0
    warnings = {d["device"]["id"]: d["warnings"] for d in json.loads(out)["devices"]}
    assert "sim0 reads -40 mV, left over: a rig-confirm trial at -40 mV did not finish" in warnings["sim0"][0]
    assert "sim1 reads -30 mV, left over: a rig-confirm trial at -30 mV did not finish" in warnings["sim1"][0]
    assert all("tuner reset --device" in w[0] and "--resume" in w[0] for w in warnings.values())


def test_status_says_the_machine_rebooted_during_a_rig_trial(capsys, boot):
    _dead_rig_trial(boot_id="boot-earlier")
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "status")
    assert code == 0 and "a rig-confirm trial at -40 mV did not finish (the machine rebooted during it)" in err


def test_a_live_rig_trial_is_not_a_leftover(capsys, boot):
    _dead_rig_trial()
    doc = json.loads(_rig_journal_path().read_text())
    doc["open_trial"]["pid"] = os.getppid()  # a live process: another tuner running the rig right now
    _rig_journal_path().write_text(json.dumps(doc))
    code, out, _err = tuner(capsys, "--simulate", "--sim-gpus", "2", "status", "--json")
    assert code == 0 and all(d["warnings"] == [] for d in json.loads(out)["devices"])


def _tear_rig_journal() -> None:
    _dead_rig_trial()
    path = _rig_journal_path()
    path.write_bytes(path.read_bytes()[:-20])  # a crash mid-write of a non-atomic copy, a full disk: torn
    sim(gpus=2).reset("sim0")
    sim(gpus=2).reset("sim1")


def test_status_warns_about_a_torn_rig_journal(capsys, boot):
    _tear_rig_journal()
    code, out, _err = tuner(capsys, "--simulate", "--sim-gpus", "2", "status", "--json")
    assert code == 0
    for doc in json.loads(out)["devices"]:
        assert any(str(_rig_journal_path()) in w and "damaged" in w for w in doc["warnings"]), doc["warnings"]


def test_set_refuses_over_a_torn_rig_journal(capsys, boot):
    _tear_rig_journal()
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "set", "--device", "sim1", "--offset", "-20",
                            "--yes")
    assert code == exit_codes.USAGE and str(_rig_journal_path()) in err and "damaged" in err, err
    assert len(err.strip().splitlines()) == 1
    assert sim(gpus=2).knob("sim1").current == 0


def test_apply_refuses_a_rig_profile_over_a_torn_rig_journal(capsys, boot):
    backend = sim(gpus=2)
    parts = [RigPart(d, backend.knob(d.id), v) for d, v in zip(backend.devices(), (-40, -30), strict=True)]
    save_profile(build_rig_profile("rig", parts, rig={"backend": "gloo", "attempts": 1}, kernel="6.14.0-test"))
    _tear_rig_journal()
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "rig", "--yes")
    assert code == exit_codes.USAGE and "damaged" in err, err
    assert [sim(gpus=2).knob(d).current for d in CARDS] == [0, 0]
