"""NVIDIA behaviours the first fake NVML was kinder than the real driver about (issue 13, items 6-10).

Each test runs against the strict fake (tests/backends/fakes/fake_pynvml.py cites LACT and nvidia-ml-py).
"""

from __future__ import annotations

import pytest

from tuner.backends import nvidia
from tuner.core.errors import DeviceLost, NotApplied, TunerError, Unsupported

from .fakes.fake_pynvml import CODES, FakeGpu, call_names, make_fake_nvml


def _nv(gpu: FakeGpu | None = None, **kw):
    m = make_fake_nvml([gpu or FakeGpu()], **kw)
    warnings: list[str] = []
    backend = nvidia.discover(m)
    backend._warn = warnings.append
    return m, backend, backend.devices()[0].id, warnings


# --- item 6: read-back can lie ------------------------------------------------------------------------------------


def test_read_back_of_zero_is_unverified_not_restored_and_reset_still_writes_zero():
    m, backend, dev, warnings = _nv(FakeGpu(readback_zero=True))
    knob = backend.apply(dev, 90)
    gpu = m.gpus[0]
    assert gpu.offsets[0] == 90 and gpu.locked is not None  # the offset stayed, and so did its lock
    assert knob.current == 90  # from the tuner's record, not the driver's 0
    assert any("unverified" in w for w in warnings)
    # a later run (new process) still knows: the record is durable
    again = nvidia.NvidiaBackend(m)
    again._warn = warnings.append
    m.calls.clear()
    again.reset(dev)
    assert call_names(m, setters_only=True).count("nvmlDeviceSetClockOffsets") == 2
    assert gpu.offsets[0] == 0 and gpu.offsets[2] == 0 and gpu.locked is None


@pytest.mark.parametrize("damaged", ["ninety", [90], {"0": 90}, 1e308 * 10])
def test_a_damaged_offset_in_the_record_is_ignored_not_a_traceback(damaged):
    # The record is a JSON file in the user's state directory: hand-edited or damaged, its offset may be any JSON
    # value. The lock beside it is type-checked (_recorded_lock); the offset must be too, since knob() falls back to
    # it when the driver reads 0. A value that is not a whole number is no record: the driver's 0 stands.
    import json

    from tuner.backends import card_records

    m, backend, dev, _ = _nv(FakeGpu(readback_zero=True))
    backend.apply(dev, 90)
    path = card_records._path(card_records.APPLIED, "GPU-00000000-fake")
    record = json.loads(path.read_text())
    record["offset_mhz"] = damaged
    path.write_text(json.dumps(record))
    again = nvidia.NvidiaBackend(m)
    assert again.knob(dev).current == 0
    again.reset(dev)  # and reset still writes 0 everywhere the card may hold an offset
    assert m.gpus[0].offsets[0] == 0 and m.gpus[0].locked is None


def test_a_lost_gpu_mid_apply_still_releases_the_lock():
    m, backend, dev, _ = _nv()
    m.fail["nvmlDeviceSetClockOffsets"] = CODES["NVML_ERROR_GPU_IS_LOST"]
    with pytest.raises(DeviceLost):
        backend.apply(dev, 90)
    assert call_names(m, setters_only=True)[-1] == "nvmlDeviceResetGpuLockedClocks"
    assert m.gpus[0].locked is None


def test_every_failure_path_releases_the_lock():
    m, backend, dev, _ = _nv(FakeGpu(snap_mhz=100))  # read-back differs: NotApplied, restore to stock
    with pytest.raises(NotApplied):
        backend.apply(dev, 150)
    assert m.gpus[0].locked is None and m.gpus[0].offsets[0] == 0


def test_read_back_snapped_to_the_hardware_step_is_accepted_and_reported():
    _, backend, dev, warnings = _nv(FakeGpu(snap_mhz=10, graphics_clocks=[]))  # step 1: 105 -> 100
    assert backend.apply(dev, 105).current == 100
    assert any("snapped" in w for w in warnings)


# --- item 7: offsets per performance state -------------------------------------------------------------------------


def test_offsets_go_to_every_pstate_that_takes_one_and_telemetry_reports_the_active_one():
    m, backend, dev, _ = _nv(FakeGpu(pstate=2))
    backend.apply(dev, 60)
    assert m.gpus[0].offsets == {0: 60, 2: 60, 8: 0}  # P8 takes only 0 (LACT PR #918)
    assert backend.applied_pstates(dev) == (0, 2)
    assert backend.telemetry(dev).pstate == 2
    backend.reset(dev)
    assert m.gpus[0].offsets == {0: 0, 2: 0, 8: 0}


def test_older_api_covers_the_whole_curve():
    m, backend, dev, _ = _nv(missing={"nvmlDeviceGetClockOffsets", "nvmlDeviceSetClockOffsets"})
    backend.apply(dev, 45)
    assert backend.applied_pstates(dev) is None and m.gpus[0].vf_offset_mhz == 45


# --- item 8: the lock clock ----------------------------------------------------------------------------------------


def test_no_customer_boost_clock_refuses_instead_of_locking_at_the_table_top():
    m, backend, dev, _ = _nv(FakeGpu(max_boost_mhz=None))
    assert backend.knob(dev).lock_clock_mhz is None
    with pytest.raises(Unsupported) as e:
        backend.apply(dev, 90)
    assert "baseline" in e.value.remedy
    assert m.gpus[0].offsets[0] == 0 and m.gpus[0].locked is None


def test_lock_at_the_clock_measured_under_the_stock_baseline():
    m, backend, dev, _ = _nv(FakeGpu(max_boost_mhz=None))
    assert backend.lock_at_measured_clock(dev, 2437.4) == 2430  # snapped down to a supported clock
    backend.apply(dev, 90)
    assert m.gpus[0].locked == (210, 2430) and backend.knob(dev).lock_clock_mhz == 2430


# --- item 9: nvidia-ml-py versions ---------------------------------------------------------------------------------


def test_nvidia_ml_py_without_the_12_555_symbols_falls_back_to_the_vf_offset():
    m, backend, dev, _ = _nv(version="12.535")
    assert not hasattr(m, "c_nvmlClockOffset_t")
    backend.apply(dev, 45)
    assert m.gpus[0].vf_offset_mhz == 45
    assert backend.reset(dev).current == 0


def test_no_attribute_error_escapes_the_backend():
    m, backend, dev, _ = _nv(version="12.535")
    del m.nvmlDeviceGetGpcClkVfOffset  # a pynvml without even the older call
    for call in (lambda: backend.knob(dev), lambda: backend.apply(dev, 30), lambda: backend.reset(dev)):
        with pytest.raises(TunerError):
            call()
    backend.telemetry(dev)
    backend.capabilities(dev)


# --- item 10: start from a known state -----------------------------------------------------------------------------


def test_an_offset_the_tuner_did_not_set_is_foreign():
    m, backend, dev, _ = _nv()
    assert backend.foreign_state(dev) is None
    backend.apply(dev, 30)
    assert backend.foreign_state(dev) is None  # the tuner's own, recorded
    backend.reset(dev)
    m.gpus[0].offsets[2] = 120  # set by another tool, at P2 only
    assert "+120 MHz" in backend.foreign_state(dev) and "P2" in backend.foreign_state(dev)
