"""Fixtures for the backend tests: fake sysfs trees with a fake kernel behind them, and a fake NVML."""

from __future__ import annotations

import pytest

from tuner.backends import amd
from tuner.backends.amd_sysfs import amd_card_dirs

from .fakes.fake_kernel import FakeKernelIO, FakeOdKernel
from .fakes.trees import OD_TEXT, make_tree


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def amd_on_fake_kernel(root, formats):
    """An AmdBackend over a fake tree whose `pp_od_clk_voltage` files are fake kernels."""
    make_tree(root, formats)
    dirs = amd_card_dirs(root)
    io = FakeKernelIO({d / "pp_od_clk_voltage": FakeOdKernel(OD_TEXT[f])
                       for d, f in zip(dirs, formats, strict=True) if f})
    return amd.discover(root=root, sysfs=io), io


@pytest.fixture
def amd_fake(tmp_path):
    return lambda *formats: amd_on_fake_kernel(tmp_path / "root", list(formats))
