"""The helper's `persistence` request (issue 23, NVIDIA at boot): anyone let in may read the mode; only root may
turn it on (the boot and resume units), for an NVIDIA card, never off; a refusal writes nothing. On the fake NVML
(tests/backends/fakes/fake_pynvml.py, whose persistence calls behave as pynvml.py's)."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import msgspec
import pytest

from tests.backends.fakes.fake_pynvml import FakeGpu, make_fake_nvml
from tests.helper.test_service import ask, peer
from tuner.actions.setting import SetRequest, prepare_setting
from tuner.backends.helper_client import HelperBackend
from tuner.backends.nvidia import NvidiaBackend
from tuner.backends.simulated import SimulatedBackend
from tuner.core.card_lock import CardBusy
from tuner.core.errors import NotApplied, PermissionDenied, Unsupported
from tuner.helper import schema as s
from tuner.helper.server import HelperServer, bind_listener
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


# --- putting a foreign per-pstate state back, through the helper ---------------------------------------------------
# Not persistence, but the same fake NVML through the same service: an unconfirmed change on a card carrying another
# tool's per-pstate offsets (LACT's `gpu_clock_offsets: {0: 105}`: P0 +105, P2 0, no lock) goes back as found.


def _foreign(tmp_path):
    m = make_fake_nvml([FakeGpu()])
    m.nvmlInit()
    service = _service(tmp_path, NvidiaBackend(m, warn=lambda line: None))
    gpu = service.backend.devices()[0].id
    m.gpus[0].offsets[0] = 105
    return m.gpus[0], service, gpu


def test_a_lease_that_runs_out_puts_a_foreign_per_pstate_state_back_as_found(tmp_path):
    gpu, service, card = _foreign(tmp_path)
    alice = Client(1, peer(1000))
    ask(service, alice, s.Set(card=card, value=150, lease_s=5))
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (150, 150, (210, 2520))
    service.connection_closed(alice)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (105, 0, None)


def test_a_clients_revert_through_the_helper_puts_a_foreign_per_pstate_state_back_as_found(tmp_path):
    """`tuner set` through the helper reverts by setting the previous value back on its own connection, marked as
    its revert (HelperBackend.revert)."""
    gpu, service, card = _foreign(tmp_path)
    alice = Client(1, peer(1000))
    ask(service, alice, s.Set(card=card, value=150, lease_s=5))
    ask(service, alice, s.Set(card=card, value=105, lease_s=5, allow_overvolt=True, revert=True))
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (105, 0, None)


def test_after_a_confirm_a_revert_puts_back_the_confirmed_state_not_the_one_found_before_it(tmp_path):
    """Confirmed, the change is the card's state: a later unconfirmed change goes back to it, lock and all."""
    gpu, service, card = _foreign(tmp_path)
    alice = Client(1, peer(1000))
    ask(service, alice, s.Set(card=card, value=120, lease_s=5))
    ask(service, alice, s.Confirm(card=card))
    gpu.offsets[2] = 105  # meanwhile another tool changes P2 alone: the card's knob (P0) still reads +120
    ask(service, alice, s.Set(card=card, value=150, lease_s=5))
    service.connection_closed(alice)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (120, 105, (210, 2520))


def test_an_unconfirmed_set_to_the_value_the_knob_already_reads_still_goes_back_as_found(tmp_path):
    """+105 over another tool's P0-only +105 reads the same on the knob but locks the card and writes P2: it is a
    change like any other, put back when its lease ends unconfirmed."""
    gpu, service, card = _foreign(tmp_path)
    alice = Client(1, peer(1000))
    ask(service, alice, s.Set(card=card, value=105, lease_s=5))
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (105, 105, (210, 2520))
    service.connection_closed(alice)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (105, 0, None)


def test_a_new_set_at_the_value_the_change_found_is_a_new_setting_not_a_revert(tmp_path):
    """Only a `set` marked `revert` puts back what the change found (docs/helper.md, the `set` row): a plain one at
    that value, sent while a change is pending, is a new setting (every pstate, locked), kept by its confirm. It was
    taken as a revert: the card went back as found, the change closed and the confirm was refused."""
    gpu, service, card = _foreign(tmp_path)
    alice = Client(1, peer(1000))
    ask(service, alice, s.Set(card=card, value=150, lease_s=5))
    ask(service, alice, s.Set(card=card, value=105, lease_s=5))
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (105, 105, (210, 2520))
    ask(service, alice, s.Confirm(card=card))
    service.connection_closed(alice)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (105, 105, (210, 2520))


def test_a_lease_that_runs_out_puts_back_a_foreign_offset_at_p2_when_p0_reads_stock(tmp_path):
    gpu, service, card = _foreign(tmp_path)
    gpu.offsets[0], gpu.offsets[2] = 0, 105  # the knob (P0) reads stock
    alice = Client(1, peer(1000))
    ask(service, alice, s.Set(card=card, value=150, lease_s=5))
    service.connection_closed(alice)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)


@contextlib.contextmanager
def _served(service, tmp_path):
    """`service` behind a real helper server (in a thread of this process, on the same fake NVML); yields a
    connected HelperBackend, the client `tuner set` uses through the helper."""
    sock_path = tmp_path / "run/helper.sock"
    listener, lock_fd = bind_listener(sock_path, os.getgid())
    server = HelperServer(service, listener, os.getgid())
    thread = threading.Thread(target=server.serve, name="test-helper", daemon=True)
    thread.start()
    backend = HelperBackend.connect(sock_path, client="tuner set")
    try:
        yield backend
    finally:
        backend.close()
        server.stop.set()
        thread.join(timeout=30)
        listener.close()
        os.close(lock_fd)


def test_a_clients_revert_through_the_helper_puts_back_a_foreign_offset_at_p2_when_p0_reads_stock(tmp_path):
    """The knob (P0) reads stock, so the client's revert is of a stock value: it still goes back as found (P2's
    +105), as in-process, not as a reset that writes 0 to every pstate."""
    gpu, service, card = _foreign(tmp_path)
    gpu.offsets[0], gpu.offsets[2] = 0, 105
    with _served(service, tmp_path) as backend:
        with prepare_setting(backend, SetRequest(card, 150)):
            assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (150, 150, (210, 2520))
        assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)
        assert service.book.pending == {}  # put back: nothing left for the lease to undo


def test_a_helper_killed_mid_change_puts_a_foreign_per_pstate_state_back_as_found_when_it_starts_again(tmp_path):
    """The helper dies (kill -9) with the change unconfirmed: the next one, a new process with a new backend, has
    only the writes journal to go by, and puts back the state the change found, not P0's +105 spread to P2 and
    locked."""
    gpu, service, card = _foreign(tmp_path)
    ask(service, Client(1, peer(1000)), s.Set(card=card, value=150, lease_s=5))
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (150, 150, (210, 2520))
    # killed: nothing put back; tuner-helper starts again on the same card and state directory
    again = HelperService(NvidiaBackend(service.backend.nvml, warn=lambda line: None), service.state,
                          group="tuner", log=lambda line: None)
    again.recover_at_start()
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (105, 0, None)
    assert again.state.writes() == {}


def test_a_writes_journal_of_an_older_helper_still_puts_the_previous_value_back(tmp_path):
    """A record an older helper wrote (no found state in it) still loads and is put back as before."""
    gpu, service, card = _foreign(tmp_path)
    ask(service, Client(1, peer(1000)), s.Set(card=card, value=150, lease_s=5))
    record = service.state.writes_path.read_bytes()
    assert b'"found"' in record
    older = msgspec.json.decode(record)
    for write in older.values():
        del write["found"]
    service.state.writes_path.write_bytes(msgspec.json.encode(older))
    again = HelperService(NvidiaBackend(service.backend.nvml, warn=lambda line: None), service.state,
                          group="tuner", log=lambda line: None)
    again.recover_at_start()
    assert gpu.offsets[0] == 105  # the previous value, as an older helper put it back
    assert again.state.writes() == {}


def test_a_found_state_outside_the_cards_range_is_never_written_back(tmp_path):
    """writes.json is read back as any input is: an offset beyond the pstate's real range is not put on the card;
    the previous value goes back instead."""
    gpu, service, card = _foreign(tmp_path)
    ask(service, Client(1, peer(1000)), s.Set(card=card, value=150, lease_s=5))
    table = msgspec.json.decode(service.state.writes_path.read_bytes())
    for write in table.values():
        write["found"]["offsets_mhz"] = [[0, 105], [2, 99_999]]
    service.state.writes_path.write_bytes(msgspec.json.encode(table))
    again = HelperService(NvidiaBackend(service.backend.nvml, warn=lambda line: None), service.state,
                          group="tuner", log=lambda line: None)
    again.recover_at_start()
    assert gpu.offsets[0] == 105 and gpu.offsets[2] != 99_999
    assert again.state.writes() == {}


def test_a_clients_revert_of_a_set_with_a_lock_clock_stays_as_found_when_the_client_then_exits(tmp_path):
    """`tuner set --offset 150 --lock-mhz 1500` through the helper, not confirmed: the client sets the lock choice
    back, then the value it found (a revert), then exits. The card stays as found (P2's +105): closing the
    connection must not put it back a second time through a reset."""
    gpu, service, card = _foreign(tmp_path)
    gpu.offsets[0], gpu.offsets[2] = 0, 105  # the knob (P0) reads stock
    alice = Client(1, peer(1000))
    ask(service, alice, s.LockClock(card=card, mhz=1500))
    ask(service, alice, s.Set(card=card, value=150, lease_s=5))
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (150, 150, (210, 1500))
    ask(service, alice, s.LockClock(card=card, mhz=2520))  # keep_or_revert: the previous lock choice first
    ask(service, alice, s.Set(card=card, value=0, lease_s=5, allow_overvolt=True, revert=True))  # then the value
    # it found, as HelperBackend.revert sends it
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)
    service.connection_closed(alice)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)


@pytest.mark.parametrize("request_of", [lambda card: s.Set(card=card, value=150, lease_s=5),
                                        lambda card: s.LockClock(card=card, mhz=1500)], ids=["set", "lock_clock"])
def test_a_write_the_helper_could_not_journal_leaves_the_card_as_found_when_the_client_exits(tmp_path, monkeypatch,
                                                                                             request_of):
    """A full disk refuses the write before the card is touched (DiskFull, nothing changed): there is no change to
    put back, and closing the connection must not put one back (NVIDIA: a reset wiping P2's +105)."""
    from tuner.core.errors import DiskFull

    gpu, service, card = _foreign(tmp_path)
    gpu.offsets[0], gpu.offsets[2] = 0, 105  # the knob (P0) reads stock
    alice = Client(1, peer(1000))

    def full(path, data, *, append=False):
        raise DiskFull(f"{path}: no space left on device", "free some space")

    monkeypatch.setattr(service.state, "_store", full)
    with pytest.raises(DiskFull):
        ask(service, alice, request_of(card))
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)
    service.connection_closed(alice)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)


def test_a_lock_clock_choice_alone_goes_back_without_touching_the_card(tmp_path):
    """A lock clock chosen and no value written (the client's set was refused, or it went away before): the choice
    is the helper's memory, not the card's state, and putting it back must leave the card as found."""
    gpu, service, card = _foreign(tmp_path)
    gpu.offsets[0], gpu.offsets[2] = 0, 105  # the knob (P0) reads stock
    alice = Client(1, peer(1000))
    ask(service, alice, s.LockClock(card=card, mhz=1500))
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)
    service.connection_closed(alice)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)
    assert service.backend.knob(card).lock_clock_mhz == 2520  # the choice is back


def test_a_clients_revert_after_its_lease_ran_out_leaves_the_card_as_the_helper_put_it_back(tmp_path):
    """The tuner stopped answering (no heartbeat) and the helper put its change back as found; its own revert,
    when it runs again, finds nothing of its own on the card and must not write over it (a Set of the stock value
    P0 read is a reset, which wiped P2's +105)."""
    gpu, service, card = _foreign(tmp_path)
    gpu.offsets[0], gpu.offsets[2] = 0, 105  # the knob (P0) reads stock
    with _served(service, tmp_path) as backend:
        change = prepare_setting(backend, SetRequest(card, 150))
        change.apply()
        assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (150, 150, (210, 2520))
        backend._stop.set()  # stopped (SIGSTOP, a hung terminal): no heartbeat
        later = time.monotonic() + 3600
        service.clock = lambda: later
        service.expire_leases()
        assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)
        change.revert()  # it runs again: nobody confirmed
        assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)


def test_an_offset_the_driver_snapped_is_recorded_and_audited_as_read_back(tmp_path):
    """The driver snaps +105 MHz to +100 (LACT issue #1202; the fake's `snap_mhz`): the card holds +100, so the
    writes journal, the audit line and a lost change name +100, not the +105 requested."""
    lines: list[str] = []
    _, service, card = _nvidia(tmp_path, snap_mhz=10, graphics_clocks=[])  # step 1: 105 validates
    service._log = lines.append
    alice = Client(1, peer(1000))
    assert ask(service, alice, s.Set(card=card, value=105, lease_s=5)).current == 100
    assert service.state.writes()[service.keys[card]].value == 100
    [audit] = [msgspec.json.decode(line) for line in service.state.log_path.read_text().splitlines()
               if msgspec.json.decode(line)["event"] == "set"]
    assert audit["value"] == 100, audit
    [said] = [line for line in lines if line.startswith("set ")]
    assert said.split()[2] == "value=100", said
    service.connection_closed(alice)
    [revert] = [msgspec.json.decode(line) for line in service.state.log_path.read_text().splitlines()
                if msgspec.json.decode(line)["event"] == "revert"]
    assert revert["value"] == 100, revert
