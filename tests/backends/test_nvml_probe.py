"""bench/nvml_probe.py on the fake NVML: read-only, and it reports what the backend relies on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .fakes.fake_pynvml import FakeGpu, call_names, make_fake_nvml

_SPEC = importlib.util.spec_from_file_location(
    "nvml_probe", Path(__file__).resolve().parents[2] / "bench" / "nvml_probe.py"
)
nvml_probe = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(nvml_probe)


def test_probe_is_read_only_and_reports_offsets_per_pstate_and_boost_support():
    m = make_fake_nvml([FakeGpu(pstate=2, max_boost_mhz=None)])
    m.nvmlInit()
    m.gpus[0].offsets[2] = 45
    out = nvml_probe.probe(m)
    assert call_names(m, setters_only=True) == []  # no Set*/Reset* call, ever
    gpu = out["gpus"][0]
    assert gpu["pstate_now"] == 2 and gpu["max_customer_boost_supported"] is False
    assert gpu["graphics_offset_per_pstate"]["P2"]["current_mhz"] == 45
    assert gpu["graphics_offset_per_pstate"]["P8"]["max_mhz"] == 0
    assert set(gpu["graphics_offset_per_pstate"]) == {"P0", "P2", "P8"}
    assert out["has_clock_offset_struct"] is True


def test_probe_with_an_old_nvidia_ml_py_says_so_instead_of_crashing():
    m = make_fake_nvml(version="12.535")
    m.nvmlInit()
    out = nvml_probe.probe(m)
    assert out["has_clock_offset_struct"] is False
    assert out["gpus"][0]["graphics_offset_per_pstate"]["P0"]["error"].startswith("nvidia-ml-py lacks")
