"""The journal asks the machine's safety state too (issue 22 item 3): the boot path skips after a trial the root
helper recovered as a freeze or reset, or one its journal still holds open from another boot; a bisect resuming
through the helper takes the helper's word that its open trial ended in a reset."""

from __future__ import annotations

import os

import msgspec

from tests.tuning.fake_engine import FakeEngine
from tuner.backends.simulated import SimulatedBackend
from tuner.core import paths
from tuner.helper.schema import OpenTrial, RecoveredTrial
from tuner.profiles import boot as boot_path
from tuner.tuning import journal
from tuner.tuning.events import TrialRecovered
from tuner.tuning.job import BisectJob, BisectParams


def open_trial(boot_id: str | None, *, setting: int = -60, session: str | None = None) -> OpenTrial:
    return OpenTrial(card="sim0", key="amd-slot-sim0", setting=setting, stock=0, unit="mV", phase="coarse",
                     session=session, uid=1000, pid=2**22 + 7, helper_pid=2**22 + 8, boot_id=boot_id, started_at=1.0)


def recovered(trial: OpenTrial, boot_id: str | None, verdict: str = "fail") -> RecoveredTrial:
    return RecoveredTrial(trial=trial, verdict=verdict, kind="system-reset", reason="open in an earlier boot",
                          recovered_at=2.0, recovered_boot_id=boot_id)


def test_the_boot_path_skips_after_a_trial_the_helper_recovered_as_a_reset(boot):
    boot("boot-b")
    root = paths.system_state_dir()
    assert journal.trial_open_at_previous_boot() is None and boot_path.skip_reason() is None  # no helper state
    root.mkdir(parents=True)
    lines = [recovered(open_trial("boot-a"), "boot-b", verdict="inconclusive")]  # a client death: not a reset
    (root / "recovered.jsonl").write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in lines))
    assert journal.trial_open_at_previous_boot() is None
    lines.append(recovered(open_trial("boot-a"), "boot-b"))
    (root / "recovered.jsonl").write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in lines))
    found = journal.trial_open_at_previous_boot()
    assert found is not None and (found["device"], found["setting"]) == ("sim0", -60)
    assert "nothing is applied" in (boot_path.skip_reason() or "")
    boot("boot-c")  # recovered in an earlier boot than this one: that boot already skipped
    assert journal.trial_open_at_previous_boot() is None


def test_the_boot_path_skips_while_the_helper_journal_holds_a_trial_of_another_boot(boot):
    boot("boot-b")
    root = paths.system_state_dir()
    root.mkdir(parents=True)
    (root / "trials.json").write_bytes(msgspec.json.encode({"amd-slot-sim0": open_trial("boot-b")}))
    assert journal.trial_open_at_previous_boot() is None  # this boot's: running (or the helper recovers it)
    (root / "trials.json").write_bytes(msgspec.json.encode({"amd-slot-sim0": open_trial("boot-a")}))
    assert journal.trial_open_at_previous_boot()["setting"] == -60
    (root / "trials.json").write_bytes(b"{not json")
    assert "unreadable" in journal.trial_open_at_previous_boot()["reason"]  # fail closed


class RecoveringBackend(SimulatedBackend):
    """A backend whose keeper of the machine's state recovered trials (HelperBackend.recovered_trials answers
    with the helper's `read_trials`: tuner/helper/service.py _op_read_trials)."""

    def __init__(self, trials: list[RecoveredTrial], **kw):
        super().__init__(**kw)
        self.trials = trials

    def recovered_trials(self, device_id: str) -> list[RecoveredTrial]:
        return list(self.trials)


def test_a_resume_takes_the_helpers_word_that_its_open_trial_ended_in_a_reset(boot):
    """The tuner's own journal sees a dead process in this boot (inconclusive, run again); the helper found the
    trial open after a reset (its boot id differs from the one this user's journal read): a failure, unsafe."""
    boot("boot-a")
    backend = SimulatedBackend(vmin_mv=-52)
    params = BisectParams(trial_s=1, confirm_s=2, preset="tiny")
    j = journal.Journal.create("sim0", params=params.search(), knob=backend.knob("sim0").to_dict(), backend=backend)
    j.finish_trial({"setting": 0, "unit": "mV", "phase": "baseline", "verdict": "pass", "tok_s": 1000.0,
                    "power_w": 300.0, "tok_per_j": 3.3})
    j.reference.write_text('{"steps": 1000}')
    j.begin_trial("coarse", setting=-30)
    j.doc["open_trial"]["pid"] = 2**22 + 4321  # dead
    j._save()
    assert os.getpid() != 2**22 + 4321
    events: list[object] = []
    machine = [recovered(open_trial("boot-a", setting=-30, session=j.session), "boot-a")]
    resumed = BisectJob(RecoveringBackend(machine, vmin_mv=-52), "sim0", BisectParams(trial_s=1, confirm_s=2,
                        resume=True), events.append, engine_factory=FakeEngine())
    resumed.run()
    [event] = [e for e in events if isinstance(e, TrialRecovered)]
    assert event.result.verdict == "fail" and event.result.kind == "system-reset" and event.result.edge
    assert "root helper" in event.result.reason
    assert -30 in journal.unsafe_settings("sim0")
