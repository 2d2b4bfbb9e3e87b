"""The identity matrix: same card applies, same model needs --verify or --force, other model/vendor refused."""

from __future__ import annotations

import dataclasses

import pytest

from tests.profiles.helpers import AMD_KNOB, NV_KNOB, RTX4090, RX9070, save_and_apply, sim, sim_profile, tuner
from tuner.backends.base import Backend
from tuner.profiles import build_profile, save_profile
from tuner.profiles.identity import Match, fingerprint, match_device

RX9070_OTHER_CARD = dataclasses.replace(RX9070, serial="BBBB0002", id="0000:04:00.0", pci_slot="0000:04:00.0")
RX9070_NO_SERIAL_SAME_SLOT = dataclasses.replace(RX9070, serial=None)
RX9070_NO_SERIAL_OTHER_SLOT = dataclasses.replace(RX9070, serial=None, pci_slot="0000:04:00.0")
RX9070_MOVED = dataclasses.replace(RX9070, pci_slot="0000:07:00.0", id="0000:07:00.0")
RX9060 = dataclasses.replace(RX9070, name="AMD Radeon RX 9060 XT", pci_id="1002:7590", serial="CCCC")
RX9070_OTHER_BOARD = dataclasses.replace(RX9070, subsystem_id="1043:0601", serial="DDDD")
RX7900 = dataclasses.replace(RX9070, name="AMD Radeon RX 7900 XTX", pci_id="1002:744c", od_format="rdna3")


@pytest.mark.parametrize(("target", "knob", "expected"), [
    (RX9070, AMD_KNOB, Match.SAME_CARD),
    (RX9070_MOVED, AMD_KNOB, Match.SAME_CARD),
    (RX9070_NO_SERIAL_SAME_SLOT, AMD_KNOB, Match.SAME_CARD),
    (RX9070_OTHER_CARD, AMD_KNOB, Match.SAME_MODEL),
    (RX9070_NO_SERIAL_OTHER_SLOT, AMD_KNOB, Match.SAME_MODEL),
    (RX9060, AMD_KNOB, Match.OTHER_MODEL),
    (RX9070_OTHER_BOARD, AMD_KNOB, Match.OTHER_MODEL),
    (RX7900, AMD_KNOB, Match.OTHER_MODEL),
    (RTX4090, NV_KNOB, Match.INCOMPATIBLE),
    (RX9070, NV_KNOB, Match.INCOMPATIBLE),  # same card id, but the knob is a clock offset: never
])
def test_matrix_on_fake_real_devices(target, knob, expected):
    profile = build_profile("p", RX9070, AMD_KNOB, -45, kernel="6.14")
    assert match_device(profile, target, knob).match is expected


def test_nvidia_profile_on_an_amd_card_is_incompatible():
    profile = build_profile("nv", RTX4090, NV_KNOB, 150, kernel="6.14")
    result = match_device(profile, RX9070, AMD_KNOB)
    assert result.match is Match.INCOMPATIBLE and "nvidia" in result.reason


def test_driver_and_kernel_drift_are_warnings_on_the_same_card():
    profile = build_profile("p", RX9070, AMD_KNOB, -45, kernel="6.14")
    newer = dataclasses.replace(RX9070, driver_version="6.15.0", vbios="113-B")
    result = match_device(profile, newer, AMD_KNOB, kernel="6.15")
    assert result.match is Match.SAME_CARD
    assert len(result.warnings) == 3 and all("consider --verify" in w for w in result.warnings)


def test_fingerprint_names_the_card():
    assert fingerprint(RX9070) == "amd 1002:7550/1da2:e490 rdna4 @0000:03:00.0 #AAAA0001"


def test_matrix_on_the_simulated_gpus():
    backend = sim(gpus=2)
    profile = sim_profile("s")
    sim0, sim1 = backend.devices()
    assert match_device(profile, sim0, backend.knob("sim0")).match is Match.SAME_CARD
    result = match_device(profile, sim1, backend.knob("sim1"))
    assert result.match is Match.SAME_MODEL and "SIM-0000-01" in result.reason
    other_seed = sim(gpus=1, seed=7).devices()[0]  # same model, another serial
    assert match_device(profile, other_seed, backend.knob("sim0")).match is Match.SAME_MODEL


# --- through the CLI -------------------------------------------------------------------------------------------


def test_cli_same_card_applies(capsys):
    code, out, err = save_and_apply(capsys, sim_profile("mine", value=-45), "--yes")
    assert code == 0, err
    assert "applied 'mine' (-45 mV, read back)" in out and "[SIMULATED]" in out
    assert sim().knob("sim0").current == -45


def test_cli_other_card_needs_verify_or_force(capsys):
    code, _out, err = save_and_apply(capsys, sim_profile("mine", value=-45), "--device", "sim1", "--yes")
    assert code == 2 and "proven on another card" in err and "pass --verify 5m" in err
    assert err.count("\n") == 1 and sim().knob("sim1").current == 0
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "mine", "--device", "sim1", "--force",
                           "--yes")
    assert code == 0, err
    assert "silicon differs" in err and sim().knob("sim1").current == -45


def test_cli_picks_the_profiles_own_card_among_several(capsys):
    code, out, err = save_and_apply(capsys, sim_profile("second", device_index=1, value=-30), "--yes")
    assert code == 0, err
    assert out.startswith("sim1") and sim().knob("sim1").current == -30 and sim().knob("sim0").current == 0


class FakeBackend(Backend):
    """A fake 'real' backend: one card with the given identity and knob, recording applies. A Backend, so every
    hook the commands call (keep, the safety state's unsafe_entries, claim, ...) behaves as the base class does
    in-process; what these tests never reach fails loudly."""

    simulated = False
    name = "fake"

    def __init__(self, device, knob):
        self._device, self._knob, self.applied = device, knob, []

    def devices(self):
        return [self._device]

    def device(self, device_id):
        assert device_id == self._device.id
        return self._device

    def knob(self, device_id):
        return self._knob

    def apply(self, device_id, value, *, allow_overvolt=False):
        self._knob.validate(value, allow_overvolt=allow_overvolt)
        self.applied.append(value)
        self._knob = dataclasses.replace(self._knob, current=value)
        return self._knob

    def keep(self, device_id):
        """Backend.keep: `apply --yes` confirms the value it wrote (through the root helper it stays)."""
        assert device_id == self._device.id and self.applied

    def telemetry(self, device_id):
        raise AssertionError("not reached by these tests")

    def reset(self, device_id, *, force=False):
        raise AssertionError("not reached by these tests")

    def capabilities(self, device_id):
        raise AssertionError("not reached by these tests")

    def stress_target(self, device_id):
        raise AssertionError("not reached by these tests")


@pytest.mark.parametrize(("profile_args", "target", "knob", "code", "says"), [
    ((RX9070, AMD_KNOB, -45), RX9070, AMD_KNOB, 0, "applied"),
    ((RX9070, AMD_KNOB, -45), RX9060, AMD_KNOB, 2, "another model: the profile's PCI id is 1002:7550"),
    ((RTX4090, NV_KNOB, 150), RX9070, AMD_KNOB, 2, "--force does not override a vendor or knob mismatch"),
    ((RX9070, AMD_KNOB, -45), RTX4090, NV_KNOB, 2, "vendor mismatch: the profile is for amd, 0000:01:00.0 is nvidia"),
])
@pytest.mark.parametrize("force", [False, True])
def test_cli_on_fake_real_devices(capsys, monkeypatch, profile_args, target, knob, code, says, force):
    backend = FakeBackend(target, knob)
    monkeypatch.setattr("tuner.actions.context.open_backend", lambda **_: backend)
    save_profile(build_profile("p", *profile_args, kernel="6.14"), overwrite=True)
    got, out, err = tuner(capsys, "apply", "p", "--yes", *(["--force"] if force else []))
    if force and "another model" in says:  # --force overrides a model mismatch, never a vendor or knob one
        assert got == 0 and backend.applied == [-45], err
        return
    assert got == code, err
    assert says in (out + err)
    assert backend.applied == ([] if code else [profile_args[2]])


def test_cli_value_outside_the_targets_range_is_refused(capsys, monkeypatch):
    narrow = dataclasses.replace(AMD_KNOB, min=-30)
    backend = FakeBackend(RX9070, narrow)
    monkeypatch.setattr("tuner.actions.context.open_backend", lambda **_: backend)
    save_profile(build_profile("p", RX9070, AMD_KNOB, -45, kernel="6.14"))
    code, _out, err = tuner(capsys, "apply", "p", "--yes")
    assert code == 2 and "-45 mV is outside this card's range -30..+0 mV" in err and backend.applied == []


def test_cli_without_yes_uses_the_keep_or_revert_prompt():
    from tests.cli_helpers import run_tuner

    save_profile(sim_profile("mine", value=-45))
    proc = run_tuner("--simulate", "apply", "mine", input="")  # EOF: not confirmed, reverted
    assert proc.returncode == 8 and "not confirmed: reverted to +0 mV" in proc.stderr
    assert sim().knob("sim0").current == 0
    proc = run_tuner("--simulate", "apply", "mine", input="y\n")
    assert proc.returncode == 0, proc.stderr
    assert "applied 'mine' (-45 mV, read back)" in proc.stdout and sim().knob("sim0").current == -45


def test_cli_apply_says_why_a_revert_went_to_stock_as_set_does():
    """Another tool left the card at an off-grid -7 mV: the revert cannot write it back and resets to stock. `set`
    said why; `apply` said only "reverted to +0 mV", as if the card had been at stock before."""
    from tests.cli_helpers import run_tuner

    save_profile(sim_profile("mine", value=-45))
    sim()._write_setting("sim0", -7)  # not a tuner write: off the 5 mV grid
    proc = run_tuner("--simulate", "apply", "mine", input="")  # EOF: not confirmed, reverted
    assert proc.returncode == 8, proc.stderr
    assert "not confirmed: reverted to +0 mV (the previous value -7 mV could not be written back" in proc.stderr
    assert "reset to stock instead)" in proc.stderr and sim().knob("sim0").current == 0


def test_reasons_and_warnings_escape_a_hostile_files_text():
    """`tuner apply` prints these to the terminal: a VBIOS, driver, kernel or serial from a stranger's file may hold
    a bidi override (U+202E) or a C1 control (U+009B), escaped as a card's name is (printable)."""
    from dataclasses import replace as _replace

    from tests.profiles.helpers import sim
    from tuner.profiles import build_profile
    from tuner.profiles.identity import match_device as _match

    backend = sim()
    odd = "X\u202eY\x9b2J"
    card = backend.device("sim0")
    same = build_profile("p", _replace(card, vbios=odd, driver_version=odd), backend.knob("sim0"), -30, kernel=odd)
    other = build_profile("q", _replace(card, serial=odd), backend.knob("sim0"), -30)
    texts = [*_match(same, card, backend.knob("sim0"), kernel="6.1").warnings,
             _match(other, card, backend.knob("sim0")).reason]
    assert len(texts) == 4 and all(odd not in t and "X\\u202eY\\x9b2J" in t for t in texts), texts
