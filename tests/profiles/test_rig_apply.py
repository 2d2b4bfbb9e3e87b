"""`tuner apply` on a rig profile, on simulated rigs: each part to its own card (serial first, then PCI slot),
every part checked before any write, a failure part-way puts back the cards already applied, and one
keep-or-revert covers the whole rig."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.cli_helpers import run_tuner
from tests.profiles.helpers import sim, tuner
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.core.errors import NotApplied
from tuner.profiles import RigPart, build_rig_profile, save_profile

VALUES = (-40, -55, -30)


def save_rig(name: str = "rig", *, gpus: int = 3, values=VALUES, devices=None, seed: int = 0):
    backend = sim(gpus=gpus, seed=seed)
    devices = devices or backend.devices()
    parts = [RigPart(d, backend.knob(d.id), v) for d, v in zip(devices, values, strict=False)]
    profile = build_rig_profile(name, parts, rig={"backend": "gloo", "attempts": 1}, kernel="6.14.0-test")
    save_profile(profile, overwrite=True)
    return profile


def settings(gpus: int = 3) -> list[int]:
    backend = sim(gpus=gpus)
    return [backend.knob(d.id).current for d in backend.devices()]


def apply(capsys, *args: str, gpus: int = 3):
    return tuner(capsys, "--simulate", "--sim-gpus", str(gpus), "apply", *args)


def test_each_part_goes_to_the_card_with_its_serial(capsys):
    save_rig()
    code, out, err = apply(capsys, "rig", "--yes", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["applied"] and [c["status"] for c in doc["cards"]] == ["applied"] * 3
    assert [(c["device"]["id"], c["found_by"], c["knob"]["current"]) for c in doc["cards"]] == [
        ("sim0", "serial", -40), ("sim1", "serial", -55), ("sim2", "serial", -30)]
    assert settings() == [-40, -55, -30]


def test_serial_wins_over_the_order_of_the_cards(capsys):
    """The cards were proven in another order (or moved): each part still finds its own serial."""
    backend = sim(gpus=3)
    save_rig(devices=list(reversed(backend.devices())))  # card[0] is sim2's part, card[2] is sim0's
    code, _out, err = apply(capsys, "rig", "--yes")
    assert code == 0, err
    assert settings() == [-30, -55, -40]


@pytest.fixture
def slotted(monkeypatch):
    """Simulated cards that sit in PCI slots and whose driver reports no serial (as some do)."""
    original = SimulatedBackend.devices

    def devices(self):
        return [replace(d, serial=None, pci_slot=f"0000:0{i + 3}:00.0") for i, d in enumerate(original(self))]

    monkeypatch.setattr(SimulatedBackend, "devices", devices)


def test_no_serial_falls_back_to_the_pci_slot(capsys, slotted):
    save_rig()
    code, out, err = apply(capsys, "rig", "--yes", "--json")
    assert code == 0, err
    assert [(c["device"]["id"], c["found_by"], c["match"]["match"]) for c in json.loads(out)["cards"]] == [
        ("sim0", "pci_slot", "same_card"), ("sim1", "pci_slot", "same_card"), ("sim2", "pci_slot", "same_card")]
    assert settings() == [-40, -55, -30]


def test_another_card_in_the_slot_is_refused_and_nothing_is_applied(capsys, monkeypatch):
    """card[1]'s serial is gone and another card (another serial) sits in its slot: refused before any write."""
    backend = sim(gpus=3)
    devs = [replace(d, pci_slot=f"0000:0{i + 3}:00.0") for i, d in enumerate(backend.devices())]
    devs[1] = replace(devs[1], serial="SOLD-AND-REPLACED")
    save_rig(devices=devs)
    original = SimulatedBackend.devices
    monkeypatch.setattr(SimulatedBackend, "devices", lambda self: [
        replace(d, pci_slot=f"0000:0{i + 3}:00.0") for i, d in enumerate(original(self))])
    code, _out, err = apply(capsys, "rig", "--yes")
    assert code == exit_codes.USAGE
    assert "refusing to apply 'rig' card[1] (serial SOLD-AND-REPLACED) to sim1" in err
    assert "nothing was applied" in err and "Traceback" not in err
    assert settings() == [0, 0, 0]
    code, _out, err = apply(capsys, "rig", "--yes", "--force")  # another card of the model, forced
    assert code == 0, err
    assert "another card" in err and "(--force)" in err
    assert settings() == [-40, -55, -30]


def test_a_missing_card_refuses_the_whole_rig(capsys):
    save_rig()
    code, _out, err = apply(capsys, "rig", "--yes", gpus=2)
    assert code == exit_codes.USAGE
    assert "card[2] (serial SIM-0000-02): its card is not in this machine" in err
    assert "nothing was applied" in err
    assert settings(gpus=2) == [0, 0]


def test_force_applies_the_cards_that_are_there_and_says_which_it_skipped(capsys):
    save_rig()
    code, out, err = apply(capsys, "rig", "--yes", "--force", "--json", gpus=2)
    assert code == 0, err
    cards = json.loads(out)["cards"]
    assert [c["status"] for c in cards] == ["applied", "applied", "skipped"]
    assert cards[2]["device"] is None and cards[2]["found_by"] == "missing"
    assert "card[2] (serial SIM-0000-02): its card is not in this machine; skipped (--force)" in err
    assert settings(gpus=2) == [-40, -55]


def test_a_part_out_of_its_cards_range_refuses_every_card(capsys):
    save_rig(values=(-40, -55, -205))  # the simulated card's range is -200..0
    code, _out, err = apply(capsys, "rig", "--yes")
    assert code == exit_codes.USAGE
    assert "card[2] (serial SIM-0000-02) on sim2: " in err and "nothing was applied" in err
    assert settings() == [0, 0, 0]


def test_a_part_beyond_its_cards_unsafe_value_refuses_every_card(capsys):
    from tuner.tuning import journal

    save_rig()
    journal.add_unsafe("sim1", -50, unit="mV", kind="hang", reason="froze in a trial", edge=True)
    code, _out, err = apply(capsys, "rig", "--yes")
    assert code == exit_codes.USAGE and "card[1]" in err and "nothing was applied" in err
    assert settings() == [0, 0, 0]


def test_a_failure_on_card_2_puts_card_1_back(capsys, monkeypatch):
    """The second card does not take its value (read back differs): the first, already applied, is reverted to
    what it held before, and the third is never touched."""
    sim(gpus=3).apply("sim0", -10)  # what card 1 held before: the revert must restore it, not stock
    save_rig()
    original = SimulatedBackend.apply

    def apply_fails_on_sim1(self, device_id, value, *, allow_overvolt=False):
        if device_id == "sim1" and value == -55:
            raise NotApplied("sim1: wrote -55 mV, read back +0 mV", "the driver refused the value")
        return original(self, device_id, value, allow_overvolt=allow_overvolt)

    monkeypatch.setattr(SimulatedBackend, "apply", apply_fails_on_sim1)
    code, _out, err = apply(capsys, "rig", "--yes")
    assert code == exit_codes.HARDWARE
    assert "'rig' card[1] (serial SIM-0000-01) on sim1: sim1: wrote -55 mV" in err
    assert "sim0 put back as before" in err
    assert settings() == [-10, 0, 0]


def test_a_busy_card_refuses_the_rig_before_any_write(capsys):
    from tuner.core.card_lock import CardLock

    save_rig()
    with CardLock("sim2", "another tuner"):
        code, _out, err = apply(capsys, "rig", "--yes")
    assert code == exit_codes.BUSY and "sim2 is busy" in err
    assert settings() == [0, 0, 0]


def test_device_and_verify_are_for_single_card_profiles(capsys):
    save_rig()
    assert apply(capsys, "rig", "--device", "sim0", "--yes")[0] == exit_codes.USAGE
    code, _out, err = apply(capsys, "rig", "--verify", "5s")
    assert code == exit_codes.USAGE and "--verify tests a single-card profile" in err
    assert settings() == [0, 0, 0]


def test_the_single_card_planner_refuses_a_rig_profile():
    from tuner.actions.profile_apply import plan_profile_apply
    from tuner.core.errors import UsageError

    profile = save_rig()
    with pytest.raises(UsageError, match="is a rig profile"):
        plan_profile_apply(sim(gpus=3), profile, None)


def test_not_confirmed_reverts_every_card():
    save_rig()
    proc = run_tuner("--simulate", "--sim-gpus", "3", "apply", "rig", input="n\n")
    assert proc.returncode == exit_codes.NOT_CONFIRMED == 8, proc.stderr
    assert proc.stdout.count("from 'rig' card[") == 3  # every card announced, then one prompt
    assert proc.stderr.count("keep? [y/N]") == 1
    assert "not confirmed: reverted every card (sim0 to +0 mV, sim1 to +0 mV, sim2 to +0 mV)" in proc.stderr
    assert settings() == [0, 0, 0]


def test_confirmed_keeps_every_card():
    save_rig()
    proc = run_tuner("--simulate", "--sim-gpus", "3", "apply", "rig", "--json", input="y\n")
    assert proc.returncode == 0, proc.stderr
    assert [c["knob"]["current"] for c in json.loads(proc.stdout)["cards"]] == [-40, -55, -30]
    assert settings() == [-40, -55, -30]


def test_a_signal_at_the_prompt_reverts_every_card():
    import os
    import signal
    import subprocess
    import sys

    from tests.cli_helpers import REPO

    save_rig()
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "--simulate", "--sim-gpus", "3", "apply", "rig"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        for line in proc.stderr:  # wait until every card is applied and the one prompt is up
            if line.startswith("keep? [y/N]"):
                break
        assert settings() == [-40, -55, -30]
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == exit_codes.INTERRUPTED, err
    assert "interrupted: reverted every card" in err
    assert settings() == [0, 0, 0]


def test_the_action_api_applies_all_or_none(monkeypatch):
    """What the UI and the CLI call: plan_rig_apply, then prepare_rig_apply (keep-or-revert), kept or not."""
    from tuner.actions.profile_apply import RigApplyFailed, plan_rig_apply, prepare_rig_apply

    profile = save_rig()
    backend = sim(gpus=3)
    plan = plan_rig_apply(backend, profile)
    assert [(p.device.id, p.found_by, p.value) for p in plan.parts] == [
        ("sim0", "serial", -40), ("sim1", "serial", -55), ("sim2", "serial", -30)]
    change = prepare_rig_apply(backend, plan, timeout_s=5)
    with change:
        assert settings() == [-40, -55, -30] and change.pending and not change.expired()
    assert settings() == [0, 0, 0] and {k.current for k in change.reverted_to.values()} == {0}
    change = prepare_rig_apply(backend, plan)
    knobs = change.apply()
    change.keep()
    assert {dev: k.current for dev, k in knobs.items()} == {"sim0": -40, "sim1": -55, "sim2": -30}

    for device_id in ("sim0", "sim1", "sim2"):
        backend.reset(device_id)
    original = SimulatedBackend.apply
    def apply_fails_on_sim2(self, device_id, value, *, allow_overvolt=False):
        if device_id == "sim2" and value == -30:
            raise NotApplied(f"{device_id}: refused")
        return original(self, device_id, value, allow_overvolt=allow_overvolt)

    monkeypatch.setattr(SimulatedBackend, "apply", apply_fails_on_sim2)
    with pytest.raises(RigApplyFailed, match=r"card\[2\].*sim2: refused; sim0, sim1 put back as before") as info:
        prepare_rig_apply(backend, plan).apply()
    assert info.value.exit_code == exit_codes.HARDWARE
    assert settings() == [0, 0, 0]


def test_a_reverted_rig_puts_every_nvidia_card_back_at_its_lock_clock_too(tmp_path):
    """NVIDIA: a rig part proven at a locked max clock locks the card there before its offset (as `set --lock-mhz`).
    A revert must put back the lock each card had as well, as the single-card change does (PendingChange's
    previous_lock_clock_mhz): else a card goes back to its old offset, locked at a clock nobody confirmed."""
    from tuner.actions.profile_apply import plan_rig_apply, prepare_rig_apply

    backend = SimulatedBackend(gpus=2, kind="nvidia", state_path=tmp_path / "nv.json")
    parts = [RigPart(d, replace(backend.knob(d.id), lock_clock_mhz=2400), v)
             for d, v in zip(backend.devices(), (90, 60), strict=True)]
    profile = build_rig_profile("nvrig", parts, rig={"backend": "gloo", "attempts": 1}, kernel="6.14.0-test")
    backend.set_lock_clock("sim1", 2280)  # sim1 was locked lower before: that is what it goes back to
    before = {d: (backend.knob(d).current, backend.knob(d).lock_clock_mhz) for d in ("sim0", "sim1")}
    assert before["sim0"][1] == 2505 and before["sim1"][1] == 2280
    change = prepare_rig_apply(backend, plan_rig_apply(backend, profile), timeout_s=5)
    with change:
        assert {d: (k.current, k.lock_clock_mhz) for d, k in change.applied.items()} == {
            "sim0": (90, 2400), "sim1": (60, 2400)}
    assert {d: (backend.knob(d).current, backend.knob(d).lock_clock_mhz) for d in ("sim0", "sim1")} == before


def test_a_part_that_fails_leaves_every_nvidia_card_at_its_own_lock_clock(tmp_path, monkeypatch):
    from tuner.actions.profile_apply import RigApplyFailed, plan_rig_apply, prepare_rig_apply

    backend = SimulatedBackend(gpus=2, kind="nvidia", state_path=tmp_path / "nv.json")
    parts = [RigPart(d, replace(backend.knob(d.id), lock_clock_mhz=2400), v)
             for d, v in zip(backend.devices(), (90, 60), strict=True)]
    profile = build_rig_profile("nvrig", parts, rig={"backend": "gloo", "attempts": 1}, kernel="6.14.0-test")
    original = SimulatedBackend.apply

    def sim1_refuses(self, device_id, value, *, allow_overvolt=False):
        if device_id == "sim1" and value == 60:
            raise NotApplied(f"{device_id}: refused")
        return original(self, device_id, value, allow_overvolt=allow_overvolt)

    monkeypatch.setattr(SimulatedBackend, "apply", sim1_refuses)
    with pytest.raises(RigApplyFailed, match="sim0 put back as before"):
        prepare_rig_apply(backend, plan_rig_apply(backend, profile), timeout_s=5).apply()
    assert {d: (backend.knob(d).current, backend.knob(d).lock_clock_mhz) for d in ("sim0", "sim1")} == {
        "sim0": (0, 2505), "sim1": (0, 2505)}


def test_a_serial_written_without_its_leading_zeros_still_finds_its_card(capsys, monkeypatch):
    """tuner.core.models.same_serial: amdsmi prints a card's unique_id without the kernel's leading zeros, so the
    identity rules compare hex serials as numbers. Finding each part's card compared the text: a rig proven while
    the serials read `0a...` and applied where they read `a...` (the cards in other slots too) went by slot to
    the wrong cards and was refused as 'another card' (or, with --force, put each part on a stranger)."""
    backend = sim(gpus=2)
    serials = ("0a0b3c4d6e7f8091", "0b0b3c4d6e7f8092")
    devs = [replace(d, serial=s, pci_slot=f"0000:0{i + 3}:00.0")
            for i, (d, s) in enumerate(zip(backend.devices(), serials, strict=True))]
    save_rig(gpus=2, devices=devs)
    original = SimulatedBackend.devices
    monkeypatch.setattr(SimulatedBackend, "devices", lambda self: [  # the zeros dropped, the slots swapped
        replace(d, serial=s.lstrip("0"), pci_slot=f"0000:0{4 - i}:00.0")
        for i, (d, s) in enumerate(zip(original(self), serials, strict=True))])
    code, out, err = apply(capsys, "rig", "--yes", "--json", gpus=2)
    assert code == 0, err
    assert [(c["device"]["id"], c["found_by"], c["match"]["match"]) for c in json.loads(out)["cards"]] == [
        ("sim0", "serial", "same_card"), ("sim1", "serial", "same_card")]
    assert settings(gpus=2) == [-40, -55]
