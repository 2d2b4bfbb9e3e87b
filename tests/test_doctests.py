"""The examples in docstrings are tests too."""

import doctest
import importlib

import pytest

MODULES = ["tuner.core.durations", "tuner.core.numbers", "tuner.backends.simulated", "tuner.backends.amd_od_table",
           "tuner.backends.nvidia", "tuner.backends.amd", "tuner.tuning.sampler",
           "tuner.tuning.kernel_log", "tuner.engine.distributed", "tuner.backends.amd_throttle",
           "tuner.profiles.reference_bundle", "tuner.actions.screen.attribution", "tuner.actions.screen.tolerance",
           "tuner.engine.reference", "tuner.core.models"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
