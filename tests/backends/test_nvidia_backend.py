"""NVIDIA backend on the fake NVML: call sequences, pointer arguments, each error, discovery."""

from __future__ import annotations

import pytest

from tuner.backends import nvidia, nvml_offsets
from tuner.core.errors import DeviceLost, OutOfRange, PermissionDenied, Unsupported, UsageError

from .fakes.fake_pynvml import CODES, FakeGpu, call_names, make_fake_nvml


@pytest.fixture
def nv():
    m = make_fake_nvml([FakeGpu()])
    warnings = []
    backend = nvidia.discover(m)
    backend._warn = warnings.append
    return m, backend, backend.devices()[0].id, warnings


def test_identity(nv):
    _m, backend, _dev, _ = nv
    info = backend.devices()[0]
    assert (info.id, info.pci_id, info.driver_version, info.serial) == (
        "0000:2b:00.0",
        "10de:2684",
        "560.35.03",
        "GPU-00000000-fake",
    )


def test_knob_is_a_clock_offset(nv):
    _m, backend, dev, _ = nv
    k = backend.knob(dev)
    assert (k.kind.value, k.unit, k.aggressive_direction, k.step, k.lock_clock_mhz) == (
        "clock_offset",
        "MHz",
        1,
        15,
        2520,
    )


def test_apply_and_reset_call_sequence(nv):
    m, backend, dev, _ = nv
    m.calls.clear()
    backend.apply(dev, 150)
    assert call_names(m, setters_only=True) == [
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceSetClockOffsets",
        "nvmlDeviceSetClockOffsets",
    ]
    assert ("nvmlDeviceSetGpuLockedClocks", (m.gpus[0], 210, 2520)) in m.calls
    assert ("nvmlDeviceSetClockOffsets", (m.gpus[0], (0, 0, 150))) in m.calls  # P0
    assert ("nvmlDeviceSetClockOffsets", (m.gpus[0], (0, 2, 150))) in m.calls  # P2, where CUDA often runs
    m.calls.clear()
    backend.reset(dev)
    assert call_names(m, setters_only=True) == [
        "nvmlDeviceSetClockOffsets",
        "nvmlDeviceSetClockOffsets",
        "nvmlDeviceResetGpuLockedClocks",
    ]
    assert m.gpus[0].locked is None and m.gpus[0].offset_mhz == 0
    assert not any(name.startswith("BUGGY") or "NOT-A-POINTER" in name for name in call_names(m))


def test_lock_mhz_is_validated_and_used(nv):
    m, backend, dev, _ = nv
    with pytest.raises(UsageError):
        backend.set_lock_clock(dev, 9000)
    backend.set_lock_clock(dev, 2400)
    backend.apply(dev, 90)
    assert m.gpus[0].locked == (210, 2400) and backend.knob(dev).lock_clock_mhz == 2400


def test_by_value_struct_is_refused_by_the_fake_like_a_bad_pointer():
    m = make_fake_nvml()
    m.nvmlInit()
    info = m.c_nvmlClockOffset_t()
    info.version = m.nvmlClockOffset_v1
    assert (
        m._nvmlGetFunctionPointer("nvmlDeviceSetClockOffsets")(m.gpus[0], info)
        == CODES["NVML_ERROR_INVALID_ARGUMENT"]
    )
    # pynvml's wrapper hides that failure; ours raises it
    assert m.nvmlDeviceSetClockOffsets(m.gpus[0], info) == 0
    m.fail["nvmlDeviceSetClockOffsets"] = CODES["NVML_ERROR_NO_PERMISSION"]
    with pytest.raises(m.NVMLError) as e:
        nvml_offsets.set_clock_offset(m, m.gpus[0], 0, 0, 30)
    assert e.value.value == CODES["NVML_ERROR_NO_PERMISSION"]


def test_old_driver_falls_back_to_gpc_vf_offset():
    m = make_fake_nvml(missing={"nvmlDeviceGetClockOffsets", "nvmlDeviceSetClockOffsets"})
    backend = nvidia.discover(m)
    dev = backend.devices()[0].id
    m.calls.clear()
    backend.apply(dev, 60)
    assert call_names(m, setters_only=True) == ["nvmlDeviceSetGpuLockedClocks", "nvmlDeviceSetGpcClkVfOffset"]


def test_too_old_driver_says_which_version():
    m = make_fake_nvml(
        missing={
            "nvmlDeviceGetClockOffsets",
            "nvmlDeviceSetClockOffsets",
            "nvmlDeviceGetGpcClkVfOffset",
            "nvmlDeviceSetGpcClkVfOffset",
        }
    )
    backend = nvidia.discover(m)
    with pytest.raises(Unsupported) as e:
        backend.knob(backend.devices()[0].id)
    assert "555" in e.value.remedy and "520" in e.value.remedy


@pytest.mark.parametrize(
    "code,error,exit_code",
    [
        ("NVML_ERROR_NO_PERMISSION", PermissionDenied, 3),
        ("NVML_ERROR_NOT_SUPPORTED", Unsupported, 4),
        ("NVML_ERROR_FUNCTION_NOT_FOUND", Unsupported, 4),
        ("NVML_ERROR_GPU_IS_LOST", DeviceLost, 5),
    ],
)
def test_each_error_is_typed(nv, code, error, exit_code):
    m, backend, dev, _ = nv
    m.fail["nvmlDeviceSetGpuLockedClocks"] = CODES[code]
    with pytest.raises(error) as e:
        backend.apply(dev, 30)
    assert e.value.exit_code == exit_code
    if code != "NVML_ERROR_GPU_IS_LOST":
        assert m.gpus[0].offset_mhz == 0 and m.gpus[0].locked is None


def test_without_root_set_is_needs_root_with_nothing_written():
    # Not root: NVML refuses every setter, the lock's reset included. The lock, the first write, was refused, so
    # nothing needs restoring: exit 3 "run with sudo", not exit 5 "restoring also failed, run `sudo tuner reset`".
    m = make_fake_nvml([FakeGpu()], root=False)
    backend = nvidia.discover(m)
    with pytest.raises(PermissionDenied) as e:
        backend.apply(backend.devices()[0].id, 30)
    assert e.value.exit_code == 3 and "sudo" in e.value.remedy and "restoring" not in e.value.message
    assert m.gpus[0].offset_mhz == 0 and m.gpus[0].locked is None


def test_a_card_without_locked_clocks_is_unsupported_with_nothing_written():
    # Before Volta NVML refuses Set- and ResetGpuLockedClocks alike (NotSupported). The lock, the first write, was
    # refused: exit 4 "not supported", not exit 5 "restoring also failed, run `sudo tuner reset`".
    m = make_fake_nvml([FakeGpu(locks_supported=False)])
    backend = nvidia.discover(m)
    with pytest.raises(Unsupported) as e:
        backend.apply(backend.devices()[0].id, 30)
    assert e.value.exit_code == 4 and "restoring" not in e.value.message
    assert m.gpus[0].offset_mhz == 0 and m.gpus[0].locked is None


def test_reset_of_a_card_without_locked_clocks_puts_the_offset_back_and_succeeds():
    # nvmlDeviceSetClockOffsets is "For Maxwell or newer", locked clocks "For Volta or newer" (NVML reference): a
    # Pascal card takes offsets (another tool's, here) but has no lock to release. Its reset writes 0 and is done.
    m = make_fake_nvml([FakeGpu(locks_supported=False)])
    m.gpus[0].offsets[0] = 60
    backend = nvidia.discover(m)
    assert backend.reset(backend.devices()[0].id).current == 0
    assert m.gpus[0].offsets[0] == 0


def test_lost_gpu_in_telemetry_is_device_lost(nv):
    m, backend, dev, _ = nv
    assert backend.telemetry(dev).voltage_mv is None
    m.gpus[0].lost = True
    with pytest.raises(DeviceLost):
        backend.telemetry(dev)


def test_out_of_range_writes_nothing(nv):
    m, backend, dev, _ = nv
    m.calls.clear()
    with pytest.raises(OutOfRange):
        backend.apply(dev, 20)  # off the 15 MHz step
    assert call_names(m, setters_only=True) == []


def test_persistence_off_warns(nv):
    m, backend, dev, warnings = nv
    m.gpus[0].persistence = 0
    backend.apply(dev, 45)
    assert any("persistence" in w for w in warnings)


def test_discover_returns_none_without_library_driver_or_cards(monkeypatch):
    assert nvidia.discover(make_fake_nvml(library=False)) is None
    assert nvidia.discover(make_fake_nvml(gpus=[])) is None
    monkeypatch.setattr(nvidia, "import_nvml", lambda: None)
    assert nvidia.discover() is None


def test_a_gpu_that_fell_off_the_bus_does_not_hide_the_others(capsys):
    # After one card of a rig is lost (Xid 79: NVML answers GpuIsLost for it), the others still carry their
    # offsets and locks: a new `tuner reset --all` must still see and reset them.
    healthy = FakeGpu(bus_id=b"00000000:2B:00.0")
    lost = FakeGpu(bus_id=b"00000000:2C:00.0", lost=True)
    m = make_fake_nvml([lost, healthy])
    healthy.offsets[0], healthy.locked = 60, (210, 2520)
    backend = nvidia.discover(m)
    assert backend is not None and [d.id for d in backend.devices()] == ["0000:2b:00.0"]
    backend.reset("0000:2b:00.0")
    assert healthy.offsets[0] == 0 and healthy.locked is None
    assert "fallen off the bus" in capsys.readouterr().err
    assert nvidia.discover(make_fake_nvml([FakeGpu(lost=True)])) is None  # none usable: no backend


def test_telemetry_reports_the_enforced_power_limit(nv):
    m, backend, dev, _ = nv
    assert backend.telemetry(dev).power_limit_w == 350.0  # NVML answers in milliwatts
    m.fail["nvmlDeviceGetEnforcedPowerLimit"] = CODES["NVML_ERROR_NOT_SUPPORTED"]
    assert backend.telemetry(dev).power_limit_w is None
