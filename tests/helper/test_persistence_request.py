"""The helper's `persistence` request (issue 23, NVIDIA at boot): anyone let in may read the mode; only root may
turn it on (the boot and resume units), for an NVIDIA card, never off; a refusal writes nothing. On the fake NVML
(tests/backends/fakes/fake_pynvml.py, whose persistence calls behave as pynvml.py's)."""

from __future__ import annotations

import pytest

from tests.backends.fakes.fake_pynvml import FakeGpu, make_fake_nvml
from tests.helper.test_service import ask, peer
from tuner.backends.nvidia import NvidiaBackend
from tuner.backends.simulated import SimulatedBackend
from tuner.core.card_lock import CardBusy
from tuner.core.errors import NotApplied, PermissionDenied, Unsupported
from tuner.helper import schema as s
from tuner.helper.service import Client, HelperService
from tuner.helper.state import MachineState


def _service(tmp_path, backend) -> HelperService:
    state = MachineState(tmp_path / "state")
    state.create()
    return HelperService(backend, state, group="tuner", log=lambda line: None)


def _nvidia(tmp_path, **gpu):
    m = make_fake_nvml([FakeGpu(persistence=0, **gpu)])
    m.nvmlInit()
    service = _service(tmp_path, NvidiaBackend(m))
    return m, service, service.backend.devices()[0].id


def _set_calls(m) -> int:
    return sum(name == "nvmlDeviceSetPersistenceMode" for name, _ in m.calls)


def test_a_member_reads_it_but_only_root_turns_it_on(tmp_path):
    m, service, card = _nvidia(tmp_path)
    alice, root = Client(1, peer(1000)), Client(2, peer(0))
    assert ask(service, alice, s.Persistence(card=card)).off is True
    with pytest.raises(PermissionDenied) as refused:
        ask(service, alice, s.Persistence(card=card, enable=True))
    assert "only root" in refused.value.message and "nvidia-persistenced" in refused.value.remedy
    assert m.gpus[0].persistence == 0 and _set_calls(m) == 0  # nothing written
    assert ask(service, root, s.Persistence(card=card, enable=True)).off is False
    assert m.gpus[0].persistence == 1 and _set_calls(m) == 1
    assert ask(service, root, s.Persistence(card=card, enable=True)).off is False
    assert _set_calls(m) == 1  # already on: not written again


def test_turning_it_on_is_a_write_another_clients_hold_refuses(tmp_path):
    m, service, card = _nvidia(tmp_path)
    alice, root = Client(1, peer(1000)), Client(2, peer(0))
    ask(service, alice, s.Claim(card=card, purpose="tuner bisect"))
    with pytest.raises(CardBusy):
        ask(service, root, s.Persistence(card=card, enable=True))
    assert _set_calls(m) == 0


@pytest.mark.parametrize(("gpu", "error"), [({"persistence_settable": False}, Unsupported),
                                            ({"persistence_readback": 0}, NotApplied)])
def test_a_driver_that_refuses_or_ignores_it_is_an_error_naming_the_daemon(tmp_path, gpu, error):
    _m, service, card = _nvidia(tmp_path, **gpu)
    with pytest.raises(error) as refused:
        ask(service, Client(2, peer(0)), s.Persistence(card=card, enable=True))
    assert "nvidia-persistenced" in refused.value.remedy


def test_a_card_without_the_mode_is_unsupported_even_for_root(tmp_path):
    service = _service(tmp_path, SimulatedBackend(kind="nvidia", state_path=tmp_path / "nv.json"))
    with pytest.raises(Unsupported):
        ask(service, Client(2, peer(0)), s.Persistence(card="sim0", enable=True))
