from __future__ import annotations

import pytest

from tests.tui.helpers import FakeClock, make_app, sim_backend


@pytest.fixture
def backend(tmp_path):
    return sim_backend(tmp_path)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def app(tmp_path, backend, clock):
    return make_app(tmp_path, backend=backend, clock=clock, samples=5)
