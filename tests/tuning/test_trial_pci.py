"""A trial stops an engine that reports another card's PCI address than the one being tuned; the domain counts
(`0001:03:00.0` is another card than `0000:03:00.0`), and an address without one (`03:00.0`) means domain 0000."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.tuning.fake_engine import FakeEngine
from tuner.backends.simulated import SimulatedBackend
from tuner.tuning.trial import TrialParams, run_trial


@pytest.mark.parametrize(("target", "reported", "wrong"), [
    ("0000:03:00.0", "0001:03:00.0", True),
    ("03:00.0", "0001:03:00.0", True),
    ("0000:03:00.0", "0000:04:00.0", True),
    ("0000:03:00.0", "00000000:03:00.0", False),  # NVML's long domain
    ("03:00.0", "0000:03:00.0", False),
    ("0001:03:00.0", "0001:03:00.0", False),
])
def test_the_engine_must_run_on_the_card_being_tuned(target, reported, wrong):
    class Bus(SimulatedBackend):
        def stress_target(self, device_id):
            return replace(super().stress_target(device_id), pci_bus_id=target)

    outcome = run_trial(Bus(vmin_mv=-52), {"sim0": -10}, TrialParams(phase="coarse", duration_s=1.0),
                        engine_factory=FakeEngine(pci_bus_id=reported))
    res = outcome.results["sim0"]
    assert (res.kind == "wrong-device") is wrong, res
