"""One suite, every backend: AMD on the fake kernel (each format with a voltage knob), NVIDIA on the fake NVML
(new and old offset APIs), and the simulated GPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tuner.backends import nvidia
from tuner.backends.simulated import SimulatedBackend
from tuner.core.errors import NotApplied, OutOfRange

from .conftest import amd_on_fake_kernel
from .fakes.fake_pynvml import FakeGpu, call_names, make_fake_nvml


@dataclass
class Rig:
    backend: Any
    device_id: str
    writes: Callable[[], list]  # everything written to hardware so far
    break_apply: Callable[[], None] | None  # make the next apply not stick (read-back differs)


def _amd(fmt):
    def build(tmp_path):
        backend, io = amd_on_fake_kernel(tmp_path / "root", [fmt])
        dev = backend.devices()[0]
        kernel = next(iter(io.kernels.values()))

        def breaker():
            if fmt in ("rdna4", "rdna3", "rdna2"):
                kernel.clamp_vo_mv = -5  # firmware clamps: read-back differs
            else:
                kernel.reject_commits = 1

        return Rig(backend, dev.id, lambda: list(io.log), breaker)

    return build


def _nvidia(missing=()):
    def build(tmp_path):
        m = make_fake_nvml([FakeGpu()], missing=set(missing))
        backend = nvidia.discover(m)
        backend._warn = lambda msg: None
        gpu = m.gpus[0]
        return Rig(
            backend,
            backend.devices()[0].id,
            lambda: call_names(m, setters_only=True),
            # a read-back of 0 is "unverified" (issue 13, item 6), so break it with a non-zero mismatch: the
            # driver snapping to a coarser increment than the tuner's step (LACT issue #1202)
            lambda: setattr(gpu, "snap_mhz", 100),
        )

    return build


def _simulated(tmp_path):
    backend = SimulatedBackend(state_path=tmp_path / "sim.json")
    return Rig(
        backend,
        "sim0",
        lambda: [backend.knob("sim0").current] if tmp_path.joinpath("sim.json").exists() else [],
        None,
    )


RIGS = {
    "amd-rdna4": _amd("rdna4"),
    "amd-rdna3": _amd("rdna3"),
    "amd-rdna2": _amd("rdna2"),
    "amd-rdna3-early": _amd("rdna3-early"),
    "amd-navi1x": _amd("vega20-navi1x"),
    "amd-gcn": _amd("gcn"),
    "nvidia": _nvidia(),
    "nvidia-r520": _nvidia(missing={"nvmlDeviceGetClockOffsets", "nvmlDeviceSetClockOffsets"}),
    "simulated": _simulated,
}


@pytest.fixture(params=list(RIGS))
def rig(request, tmp_path) -> Rig:
    return RIGS[request.param](tmp_path)


def _undervolt(knob, steps=3):
    return knob.shifted(knob.stock, steps)


def test_knob_is_sane(rig):
    knob = rig.backend.knob(rig.device_id)
    assert knob.min <= knob.stock <= knob.max and knob.step >= 1
    assert knob.current == knob.stock
    assert knob.aggressive_direction in (-1, 1)


def test_apply_validates_writes_and_reads_back(rig):
    knob = rig.backend.knob(rig.device_id)
    value = _undervolt(knob)
    after = rig.backend.apply(rig.device_id, value)
    assert after.current == value == rig.backend.knob(rig.device_id).current
    assert rig.writes()


def test_reset_returns_stock(rig):
    knob = rig.backend.knob(rig.device_id)
    rig.backend.apply(rig.device_id, _undervolt(knob))
    assert rig.backend.reset(rig.device_id).current == knob.stock
    assert rig.backend.knob(rig.device_id).current == knob.stock


@pytest.mark.parametrize("bad", ["below_min", "above_max", "off_step", "overvolt", "not_int"])
def test_bad_values_raise_out_of_range_and_write_nothing(rig, bad):
    knob = rig.backend.knob(rig.device_id)
    value = {
        "below_min": knob.min - knob.step,
        "above_max": knob.max + knob.step,
        "off_step": knob.stock + knob.aggressive_direction * (knob.step + 1) if knob.step > 1 else None,
        "overvolt": knob.shifted(knob.stock, -1)
        if knob.is_overvolt(knob.shifted(knob.stock, -1))
        and knob.min <= knob.shifted(knob.stock, -1) <= knob.max
        else None,
        "not_int": 1.5,
    }[bad]
    if value is None:
        pytest.skip(f"{bad} cannot occur on this knob (step {knob.step}, range {knob.min}..{knob.max})")
    with pytest.raises(OutOfRange):
        rig.backend.apply(rig.device_id, value)
    assert rig.writes() == []
    assert rig.backend.knob(rig.device_id).current == knob.stock


def test_failed_apply_restores_previous(rig):
    if rig.break_apply is None:
        pytest.skip("the simulated GPU always takes a valid value")
    knob = rig.backend.knob(rig.device_id)
    first = _undervolt(knob, 2)
    rig.backend.apply(rig.device_id, first)
    rig.break_apply()
    with pytest.raises(NotApplied):
        rig.backend.apply(rig.device_id, _undervolt(knob, 8))
    assert rig.backend.knob(rig.device_id).current == first


def test_failed_apply_from_stock_restores_stock(rig):
    if rig.break_apply is None:
        pytest.skip("the simulated GPU always takes a valid value")
    knob = rig.backend.knob(rig.device_id)
    rig.break_apply()
    with pytest.raises(NotApplied):
        rig.backend.apply(rig.device_id, _undervolt(knob, 8))
    assert rig.backend.knob(rig.device_id).current == knob.stock
