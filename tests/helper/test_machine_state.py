"""One safety state per machine: users with different homes share the unsafe list; a helper killed during a trial
leaves its journal saying so, and the next start puts back what it had set (issue 22)."""

from __future__ import annotations

import json
import os
import signal

from tests.helper.conftest import HELLO, as_user, client, needs_root, open_connection
from tuner.backends.simulated import SimulatedBackend

pytestmark = needs_root


def sim_card(helper) -> SimulatedBackend:
    """The helper's simulated card, read from its state file (what survives the helper)."""
    return SimulatedBackend(state_path=helper.state_dir / "simulated" / "seed-0.json")


def replies(lines: list[str]) -> list[dict]:
    return [json.loads(line) for line in lines]


def test_a_value_that_froze_a_trial_for_one_user_is_refused_for_another(accounts, helpers):
    group = accounts.group()
    alice, bob = accounts.user(group), accounts.user(group)
    assert alice.home != bob.home
    helper = helpers(group, fake_amd=False)
    begin = {"op": "trial_begin", "card": "sim0", "setting": -60, "phase": "coarse", "session": "s1"}
    trial = as_user(alice, "tests.helper.client", str(helper.socket), json.dumps(HELLO), json.dumps(begin),
                    json.dumps({"op": "set", "card": "sim0", "value": -60}), "@hold")
    assert trial.stdout is not None
    assert [trial.stdout.readline().strip() for _ in range(4)][-1] == "HOLDING"
    assert sim_card(helper).knob("sim0").current == -60
    # the machine froze mid-trial: the helper dies with it, and the machine comes back with a new boot id
    helper.stop(signal.SIGKILL)
    trial.kill()
    trial.communicate()
    assert json.loads((helper.state_dir / "trials.json").read_text())  # the journal says a trial was open
    helper.boot("boot-b")
    helper.start()
    refused = replies(client(bob, helper.socket, HELLO, {"op": "set", "card": "sim0", "value": -60},
                             {"op": "set", "card": "sim0", "value": -65},
                             {"op": "set", "card": "sim0", "value": -55}))
    assert [r.get("code") for r in refused[1:]] == ["unsafe", "unsafe", None]
    assert "-60 mV" in refused[1]["error"] and "system-reset" in refused[1]["error"]
    [entries] = [r["result"] for r in helper.ask({"op": "unsafe_list", "card": "sim0"})]
    assert [(e["setting"], e["kind"], e["uid"]) for e in entries] == [(-60, "system-reset", alice.uid)]
    [trials] = [r["result"] for r in helper.ask({"op": "read_trials", "card": "sim0"})]
    assert trials["open"] is None and trials["recovered"][-1]["verdict"] == "fail"


def test_a_users_own_unsafe_list_is_imported_and_holds_for_everyone(accounts, helpers):
    group = accounts.group()
    alice, bob = accounts.user(group), accounts.user(group)
    unsafe = alice.home / ".local/state/tuner/unsafe/sim0.jsonl"
    unsafe.parent.mkdir(parents=True)
    entry = {"device": "sim0", "serial": "SIM-0000-00", "setting": -40, "unit": "mV", "kind": "hang",
             "reason": "the engine stopped answering", "edge": True, "session": "old", "boot_id": "boot-0",
             "recorded_at": 1700000000.0, "kernel_log": []}
    unsafe.write_text(json.dumps(entry) + "\n" + "{torn\n")
    journal = alice.home / ".local/state/tuner/journal/sim0.json"
    journal.parent.mkdir(parents=True)
    journal.write_text(json.dumps({"device": "sim0", "open_trial": {"setting": -35, "phase": "confirm",
                                                                    "boot_id": "boot-0", "session": "old"}}))
    for path in (unsafe.parent.parent, unsafe.parent, unsafe, journal.parent, journal):
        os.chown(path, alice.uid, alice.gid)
    helper = helpers(group, fake_amd=False)
    assert [r["ok"] for r in replies(client(alice, helper.socket, HELLO))] == [True]  # her hello imports her state
    assert [r["ok"] for r in replies(client(alice, helper.socket, HELLO))] == [True]  # twice: merged, not doubled
    out = replies(client(bob, helper.socket, HELLO, {"op": "set", "card": "sim0", "value": -40},
                         {"op": "set", "card": "sim0", "value": -35}, {"op": "set", "card": "sim0", "value": -30}))
    assert [r.get("code") for r in out[1:]] == ["unsafe", "unsafe", None]
    [entries] = [r["result"] for r in helper.ask({"op": "unsafe_list", "card": "sim0"})]
    assert sorted((e["setting"], e["kind"]) for e in entries) == [(-40, "hang"), (-35, "system-reset")]
    assert "line 2" in helper.log.read_text()  # the torn line is reported, not imported, not fatal
    assert unsafe.read_text().count("\n") == 2  # her own file is left as it was


def test_a_helper_killed_during_a_trial_leaves_it_journaled_and_puts_the_card_back_at_the_next_start(
        accounts, helpers):
    group = accounts.group()
    alice = accounts.user(group)
    helper = helpers(group, fake_amd=False)
    helper.ask({"op": "set", "card": "sim0", "value": -15}, {"op": "confirm", "card": "sim0"})
    out = replies(client(alice, helper.socket, HELLO, {"op": "trial_begin", "card": "sim0", "setting": -50,
                                                       "phase": "coarse"}))
    assert out[-1]["ok"]
    # the client connection closed with the trial open: that is a tuner death (inconclusive), recorded at once
    [trials] = [r["result"] for r in helper.ask({"op": "read_trials", "card": "sim0"})]
    assert trials["open"] is None and trials["recovered"][-1]["verdict"] == "inconclusive"
    # now the helper itself dies with a trial open and a value set
    sock = open_connection(helper.socket, HELLO, {"op": "trial_begin", "card": "sim0", "setting": -50,
                                                  "phase": "refine"},
                           {"op": "set", "card": "sim0", "value": -50, "lease_s": 600})
    helper.stop(signal.SIGKILL)
    sock.close()
    assert sim_card(helper).knob("sim0").current == -50  # nobody put it back: the helper is dead
    writes = json.loads((helper.state_dir / "writes.json").read_text())
    assert [(w["previous"], w["value"]) for w in writes.values()] == [(-15, -50)]
    helper.start()  # same boot
    assert sim_card(helper).knob("sim0").current == -15
    [trials] = [r["result"] for r in helper.ask({"op": "read_trials", "card": "sim0"})]
    last = trials["recovered"][-1]
    assert (last["verdict"], last["trial"]["phase"]) == ("inconclusive", "refine") and "helper" in last["reason"]
    assert not (helper.state_dir / "writes.json").exists()
    [entries] = [r["result"] for r in helper.ask({"op": "unsafe_list", "card": "sim0"})]
    assert entries == []  # a tool death in this boot says nothing about the voltage


def test_an_unconfirmed_change_left_by_a_dead_helper_goes_to_stock_when_the_boot_id_cannot_be_read(
        accounts, helpers):
    """With the boot id unreadable at the next start, a reboot can be neither ruled out nor confirmed: the record
    was dropped and the card kept the unconfirmed -50 for good. Stock is safe either way (after a reboot the card
    is there already)."""
    group = accounts.group()
    helper = helpers(group, fake_amd=False)
    helper.ask({"op": "set", "card": "sim0", "value": -15}, {"op": "confirm", "card": "sim0"})
    sock = open_connection(helper.socket, HELLO, {"op": "set", "card": "sim0", "value": -50, "lease_s": 600})
    helper.stop(signal.SIGKILL)
    sock.close()
    assert sim_card(helper).knob("sim0").current == -50
    (helper.sysroot / "proc/sys/kernel/random/boot_id").unlink()
    helper.start()
    assert sim_card(helper).knob("sim0").current == 0
    assert not (helper.state_dir / "writes.json").exists()
