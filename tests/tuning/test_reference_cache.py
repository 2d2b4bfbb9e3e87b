"""The manual stress reference cache key (tuner.tuning.reference_cache): the card's identity and every engine
setting that changes the trajectory, so a changed setting never compares with a stale reference."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from tuner.core.models import DeviceInfo
from tuner.engine.options import EngineOptions, Injection
from tuner.tuning.reference_cache import NOT_TRAJECTORY, card_identity, manual_reference

CARD = DeviceInfo(id="sim1", vendor="simulated", name="Simulated GPU", pci_slot="0000:03:00.0",
                  serial="SIM-0000-01", simulated=True)
BASE = EngineOptions(preset="tiny", mode="train", duration_s=60.0)


def _path(device=CARD, options=BASE):
    return manual_reference(device, options).path


def test_the_key_names_the_card_by_serial_else_pci_address_never_by_its_index():
    assert card_identity(CARD) == "serial-SIM-0000-01"
    assert card_identity(replace(CARD, serial=None)) == "pci-0000:03:00.0"
    assert "sim1" not in str(_path()) and "SIM-0000-01" in str(_path())
    # the same card under another index (--sim-gpus 3 vs 2, another slot order): the same reference
    assert _path(replace(CARD, id="sim0")) == _path()
    # another card with the same index: not the same reference
    assert _path(replace(CARD, serial="SIM-0000-02")) != _path()


def test_a_card_with_no_serial_and_no_pci_address_gets_no_cached_reference():
    cached = manual_reference(replace(CARD, serial=None, pci_slot=None), BASE)
    assert cached.path is None and "neither a serial nor a PCI address" in (cached.why_none or "")


def test_the_gemm_burn_has_no_reference():
    assert manual_reference(CARD, replace(BASE, mode="gemm")).path is None


@pytest.mark.parametrize("change", [
    {"preset": "small"}, {"mode": "mixed"}, {"dtype": "fp32"}, {"seed": 1}, {"compile": True},
    {"compile": False}, {"batch_size": 4}, {"warmup_steps": 3}, {"threads": 2}, {"data": "/tmp/corpus"},
    {"sim_nondeterministic": True}, {"mixed_full_s": 60.0},
], ids=lambda c: next(iter(c)))
def test_every_setting_that_changes_the_trajectory_changes_the_key(change):
    assert _path(options=replace(BASE, **change)) != _path()


@pytest.mark.parametrize("change", [
    {"duration_s": 3600.0}, {"fault_rate": 0.01}, {"fault_seed": 7}, {"injections": [Injection("nan", 5)]},
    {"reference": "/x.ref", "reference_loop": True}, {"record": "/y.ref"}, {"device": "cuda:1"},
    {"expect_pci_bus_id": "0000:03:00.0"}, {"canary_every": 5},
], ids=lambda c: next(iter(c)))
def test_what_a_compare_run_adds_does_not_change_the_key(change):
    """The run that compares (at an undervolt: faults drawn, looped over the reference) finds the reference the
    run at stock recorded."""
    assert _path(options=replace(BASE, **change)) == _path()


def test_every_option_not_keyed_is_a_real_engine_option():
    names = {f.name for f in dataclasses.fields(EngineOptions)}
    assert names >= NOT_TRAJECTORY
