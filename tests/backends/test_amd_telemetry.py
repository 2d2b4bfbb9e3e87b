"""AMD dashboard figures from hwmon and the device directory: fan %, VRAM, power limit, each in the kernel's units,
None (shown "n/a") whenever the kernel has no such file or refuses the read, never a made-up 0."""

from __future__ import annotations

import errno

import pytest

from tuner.backends.amd_sysfs import amd_card_dirs

from .conftest import amd_on_fake_kernel
from .fakes.fake_kernel import FakeKernelIO
from .fakes.trees import make_tree


def _backend(tmp_path, *, fan="pwm"):
    from tuner.backends import amd

    make_tree(tmp_path, ["rdna4"], fan=fan)
    io = FakeKernelIO()
    backend = amd.discover(root=tmp_path, sysfs=io)
    return backend, io, backend.devices()[0].id


def _hwmon(tmp_path):
    """The hwmon directory as the backend reaches it (through the cardN/device link)."""
    return amd_card_dirs(tmp_path)[0] / "hwmon" / "hwmon4"


def test_fan_percent_is_pwm1_over_pwm1_max(tmp_path):
    backend, _io, dev = _backend(tmp_path)
    t = backend.telemetry(dev)
    assert t.fan_pct == pytest.approx(77 * 100 / 255, abs=0.05)
    assert t.fan_rpm == 1100


def test_missing_pwm1_max_means_the_abis_255(tmp_path):
    backend, _io, dev = _backend(tmp_path, fan="no-pwm1-max")
    assert backend.telemetry(dev).fan_pct == pytest.approx(30.2)


def test_unreadable_pwm1_falls_back_to_rpm_over_fan1_max(tmp_path):
    backend, io, dev = _backend(tmp_path, fan="rpm")
    io.read_errors[_hwmon(tmp_path) / "pwm1"] = errno.EACCES  # read bits cleared: the SMU cannot report PWM
    t = backend.telemetry(dev)
    assert t.fan_pct == pytest.approx(33.3)  # 1100 of 3300 RPM, not the file's unreadable "0"
    assert t.fan_rpm == 1100


def test_pwm1_refused_while_the_gpu_resets_is_not_zero(tmp_path):
    backend, io, dev = _backend(tmp_path, fan="pwm")
    hw = _hwmon(tmp_path)
    for name in ("pwm1", "fan1_input"):
        io.read_errors[hw / name] = errno.EPERM  # amdgpu_in_reset(): every fan read answers EPERM
    t = backend.telemetry(dev)
    assert t.fan_pct is None and t.fan_rpm is None
    assert t.vram_total_mib == 16384  # the other figures still read


def test_fan_stopped_at_idle_reads_zero_percent(tmp_path):
    backend, _io, dev = _backend(tmp_path, fan="zero-rpm")
    t = backend.telemetry(dev)
    assert t.fan_pct == 0.0 and t.fan_rpm == 0


def test_fanless_card_has_no_fan_figure_not_zero(tmp_path):
    backend, _io, dev = _backend(tmp_path, fan="none")
    t = backend.telemetry(dev)
    assert t.fan_pct is None and t.fan_rpm is None
    assert t.power_w == 55.0  # everything else is still there


def test_rpm_without_fan1_max_gives_no_percent(tmp_path):
    backend, io, dev = _backend(tmp_path, fan="rpm")
    hw = _hwmon(tmp_path)
    io.read_errors[hw / "pwm1"] = errno.EACCES
    (hw / "fan1_max").unlink()
    t = backend.telemetry(dev)
    assert t.fan_pct is None and t.fan_rpm == 1100


def test_vram_is_read_in_bytes_and_shown_in_mib(tmp_path):
    backend, _io, dev = _backend(tmp_path)
    t = backend.telemetry(dev)
    assert (t.vram_used_mib, t.vram_total_mib) == (1536, 16384)


def test_no_vram_files_is_none_not_zero(tmp_path):
    backend, _io, dev = _backend(tmp_path)
    for name in ("mem_info_vram_used", "mem_info_vram_total"):
        (next(tmp_path.rglob(name))).unlink()
    t = backend.telemetry(dev)
    assert t.vram_used_mib is None and t.vram_total_mib is None


@pytest.mark.parametrize("text", ["nan\n", "inf\n", "-infinity\n", "1" * 400 + "\n"])
def test_a_figure_that_is_not_a_finite_number_is_none(tmp_path, text):
    # amdgpu prints integers; float() also takes "nan", "inf" and overflows a long number to inf (a planted tree
    # under TUNER_SYSFS_ROOT). Such a figure is unreadable, None ("n/a"), never NaN: NaN compares false with
    # every limit, so a check on it (temperature, power) would silently never fire.
    backend, _io, dev = _backend(tmp_path)
    for name in ("in0_input", "power1_average", "temp1_input"):
        (_hwmon(tmp_path) / name).write_text(text)
    t = backend.telemetry(dev)
    assert (t.voltage_mv, t.power_w, t.temp_edge_c) == (None, None, None)


def test_power_cap_that_the_driver_cannot_read_is_none(tmp_path):
    backend, _io, dev = _backend(tmp_path)
    hw = _hwmon(tmp_path)
    (hw / "power1_cap").write_text("\n")  # amdgpu_hwmon_show_power_cap_generic prints "\n" when the SMU fails
    assert backend.telemetry(dev).power_limit_w is None
    (hw / "power1_cap").write_text("304000000\n")  # µW (RX 9070 XT capture in control.md)
    assert backend.telemetry(dev).power_limit_w == 304.0


def test_amd_reports_no_throttle_reasons_it_cannot_read(tmp_path):
    """Without amdsmi nothing reads the binary gpu_metrics table: None (unknown), never () (which would claim none
    are active)."""
    backend, _io, dev = _backend(tmp_path)
    assert backend.telemetry(dev).throttle_reasons is None


def _with_amdsmi(tmp_path, metrics):
    """The RDNA4 card with amdsmi beside it; `metrics` is what amdsmi_get_gpu_metrics_info answers (an exception
    instance is raised, as amdsmi raises AmdSmiLibraryException when the driver has no gpu_metrics)."""
    import types

    from tuner.backends import amd

    make_tree(tmp_path, ["rdna4"])

    def metrics_info(handle):
        if isinstance(metrics, Exception):
            raise metrics
        return metrics

    smi = types.SimpleNamespace(
        AmdSmiInitFlags=types.SimpleNamespace(INIT_AMD_GPUS=1), amdsmi_init=lambda flags: None,
        amdsmi_get_processor_handles=lambda: ["h0"], amdsmi_get_gpu_device_bdf=lambda h: "0000:10:00.0",
        amdsmi_get_gpu_metrics_info=metrics_info, amdsmi_shut_down=lambda: None)
    backend = amd.AmdBackend(amd_card_dirs(tmp_path), root=tmp_path, sysfs=FakeKernelIO(), amdsmi=smi)
    return backend.telemetry(backend.devices()[0].id)


@pytest.mark.parametrize(("status", "reasons"), [
    ((1 << 0) | (1 << 36), ("power cap (PPT0)", "thermal (hotspot)")),  # SMU_THROTTLER_PPT0_BIT, ..._HOTSPOT_BIT
    (0, ()),  # a reading: no limit active ("none")
    ("N/A", None),  # the field is not in this card's table (amdsmi's Python gives "N/A")
    ((1 << 64) - 1, None),  # the library's "not filled" marker, if it ever reaches Python as a number
    (RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED"), None),  # no gpu_metrics at all
])
def test_amd_throttle_reasons_come_from_amdsmi_gpu_metrics(tmp_path, status, reasons):
    metrics = status if isinstance(status, Exception) else {"indep_throttle_status": status, "throttle_status": 5}
    assert _with_amdsmi(tmp_path, metrics).throttle_reasons == reasons


def test_amd_thermal_reasons_read_as_thermal_to_the_load_check():
    from tuner.backends.amd_throttle import INDEP_THROTTLERS
    from tuner.tuning.load_check import light_load_warning

    hot = tuple(INDEP_THROTTLERS[bit] for bit in range(32, 48))
    assert all("thermal" in name for name in hot)
    warning = light_load_warning(100.0, 300.0, preset="nanochat", throttle_reasons=("thermal (hotspot)",))
    assert warning is not None and "thermally limited (thermal (hotspot))" in warning


def test_telemetry_reads_through_the_fake_kernels_seam(tmp_path):
    backend, fio = amd_on_fake_kernel(tmp_path, ["rdna4"])
    dev = backend.devices()[0].id
    fio.read_errors[_hwmon(tmp_path) / "in0_input"] = errno.EOPNOTSUPP
    assert backend.telemetry(dev).voltage_mv is None
    assert fio.log == []  # reading telemetry never writes


@pytest.mark.parametrize(
    ("pwm", "pwm_max", "rpm", "rpm_max", "pct"),
    [(255, 255, None, None, 100.0), (128, None, None, None, 50.2), (None, None, 3300, 3300, 100.0),
     (None, None, 3500, 3300, 106.1), (None, None, 0, 0, None), (0, 0, None, None, 0.0)],
)
def test_fan_percent_edges(pwm, pwm_max, rpm, rpm_max, pct):
    from tuner.backends.amd_sysfs import fan_percent

    assert fan_percent(pwm, pwm_max, rpm, rpm_max) == pct


def test_amd_sysfs_doctests_hold():
    import doctest

    from tuner.backends import amd_sysfs

    result = doctest.testmod(amd_sysfs)
    assert result.attempted >= 2 and result.failed == 0
