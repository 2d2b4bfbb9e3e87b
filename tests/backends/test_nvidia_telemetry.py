"""NVIDIA dashboard figures through the fake NVML: fan %, VRAM, enforced power limit and clock event reasons, each
in NVML's units; a figure the board does not report (NotSupported, NoPermission, an nvidia-ml-py too old for the
call) is None (shown "n/a") while every other figure still reads."""

from __future__ import annotations

import pytest

from tuner.backends import nvidia

from .fakes.fake_pynvml import CODES, FakeGpu, make_fake_nvml

FIGURE_CALLS = {
    "nvmlDeviceGetFanSpeed": "fan_pct",
    "nvmlDeviceGetMemoryInfo": "vram_used_mib",
    "nvmlDeviceGetEnforcedPowerLimit": "power_limit_w",
    "nvmlDeviceGetPowerUsage": "power_w",
    "nvmlDeviceGetPerformanceState": "pstate",
}


def _open(gpu=None, **kw):
    m = make_fake_nvml([gpu or FakeGpu()], **kw)
    backend = nvidia.discover(m)
    return m, backend, backend.devices()[0].id


def test_fan_vram_and_limit_in_nvml_units():
    _m, backend, dev = _open()
    t = backend.telemetry(dev)
    assert t.fan_pct == 30
    assert (t.vram_used_mib, t.vram_total_mib) == (1536, 24564)  # bytes -> MiB (25,757,220,864 B)
    assert t.power_limit_w == 350.0  # milliwatts -> W


def test_passively_cooled_card_has_no_fan_figure():
    """H200-class boards have no fan: nvmlDeviceGetFanSpeed answers NotSupported, shown n/a, never 0 %."""
    _m, backend, dev = _open(FakeGpu(name="NVIDIA H200", fan_pct=None))
    t = backend.telemetry(dev)
    assert t.fan_pct is None
    assert t.vram_total_mib == 24564 and t.power_w == 287.5  # the rest still reads


def test_fan_stopped_at_idle_is_zero_not_none():
    _m, backend, dev = _open(FakeGpu(fan_pct=0))
    assert backend.telemetry(dev).fan_pct == 0


@pytest.mark.parametrize("code", ["NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION"])
@pytest.mark.parametrize("call", list(FIGURE_CALLS))
def test_one_refused_figure_never_breaks_the_others(call, code):
    m, backend, dev = _open()
    m.fail[call] = CODES[code]
    t = backend.telemetry(dev)
    assert getattr(t, FIGURE_CALLS[call]) is None
    others = {f: getattr(t, f) for c, f in FIGURE_CALLS.items() if c != call}
    assert None not in others.values(), others
    assert t.temp_edge_c == 64 and t.throttle_reasons == ("power cap",)


def test_refused_memory_info_leaves_both_vram_figures_none():
    m, backend, dev = _open()
    m.fail["nvmlDeviceGetMemoryInfo"] = CODES["NVML_ERROR_NOT_SUPPORTED"]
    t = backend.telemetry(dev)
    assert t.vram_used_mib is None and t.vram_total_mib is None


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0x0, ()),
        (0x1, ("idle",)),
        (0x2, ("applications clocks",)),
        (0x4, ("power cap",)),
        (0x20 | 0x40, ("thermal", "hw thermal")),
        (0x8 | 0x80, ("hw slowdown", "hw power brake")),
        (0x10 | 0x100, ("sync boost", "display clocks")),
    ],
)
def test_clock_event_reasons_are_decoded_to_readable_names(mask, names):
    _m, backend, dev = _open(FakeGpu(reasons=mask))
    assert backend.telemetry(dev).throttle_reasons == names


def test_reason_bits_this_nvidia_ml_py_has_no_name_for_are_shown_not_dropped():
    _m, backend, dev = _open(FakeGpu(reasons=0x4 | 0x200 | 0x800), version="13.580")
    assert backend.telemetry(dev).throttle_reasons == ("power cap", "reason 0x200", "reason 0x800")
    _m, backend, dev = _open(FakeGpu(reasons=0x4 | 0x200 | 0x400), version="13.615")
    assert backend.telemetry(dev).throttle_reasons == ("power cap", "board limit", "reliability")


def test_old_nvidia_ml_py_falls_back_to_the_throttle_reasons_call():
    m, backend, dev = _open(FakeGpu(reasons=0x40), version="12.530")
    assert not hasattr(m, "nvmlDeviceGetCurrentClocksEventReasons")
    assert backend.telemetry(dev).throttle_reasons == ("hw thermal",)
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in [name for name, _ in m.calls]


def test_driver_without_the_event_reasons_call_falls_back_too():
    m, backend, dev = _open(FakeGpu(reasons=0x4), missing={"nvmlDeviceGetCurrentClocksEventReasons"})
    assert backend.telemetry(dev).throttle_reasons == ("power cap",)
    called = [name for name, _ in m.calls]
    assert called.index("nvmlDeviceGetCurrentClocksEventReasons") < called.index(
        "nvmlDeviceGetCurrentClocksThrottleReasons"
    )


def test_reasons_refused_by_both_calls_are_unknown_and_nothing_else_breaks():
    m, backend, dev = _open()
    for call in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        m.fail[call] = CODES["NVML_ERROR_NOT_SUPPORTED"]
    t = backend.telemetry(dev)
    assert t.throttle_reasons is None and t.fan_pct == 30  # unknown (the UI: "limits: n/a"), not "none active"
