"""The plan a bisect shows before it starts is the plan it runs: the same unsafe list, the machine's included."""

from __future__ import annotations

from tuner.actions.bisect import bisect_estimate
from tuner.backends.simulated import SimulatedBackend
from tuner.tuning.job import BisectParams, estimate_search


class MachineListBackend(SimulatedBackend):
    """A card whose root helper keeps an unsafe entry the user's own list does not have (another user's hang), in
    `unit` (MHz: another kind of card, once in this slot, hung there)."""

    def __init__(self, *args, unit: str = "mV", **kwargs):
        super().__init__(*args, **kwargs)
        self.unit = unit

    def unsafe_entries(self, device_id):
        return [{"setting": -40, "unit": self.unit, "kind": "hang", "edge": True, "reason": "froze the machine"}]


def test_the_estimate_counts_the_machines_unsafe_list_as_the_bisect_does(tmp_path):
    backend = MachineListBackend(state_path=tmp_path / "sim")
    params = BisectParams(floor=-100)
    knob = backend.knob("sim0")
    shown = bisect_estimate(backend, "sim0", params)
    run = estimate_search(knob, params, {-40: backend.unsafe_entries("sim0")[0]})  # what job.py plans with
    assert shown == run
    assert shown != estimate_search(knob, params, {})  # the machine's entry changes the plan


def test_the_estimate_ignores_an_unsafe_entry_in_another_unit_as_set_and_apply_do(tmp_path):
    backend = MachineListBackend(state_path=tmp_path / "sim", unit="MHz")
    params = BisectParams(floor=-100)
    assert bisect_estimate(backend, "sim0", params) == estimate_search(backend.knob("sim0"), params, {})
