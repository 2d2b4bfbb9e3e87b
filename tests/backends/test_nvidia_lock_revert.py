"""`tuner set --lock-mhz N` on NVIDIA: whatever undoes the setting (not confirmed, a signal, a failed apply, a
reset) must undo the locked graphics clock too, not only the offset.

Through the fake NVML (tests/backends/fakes/fake_pynvml.py), which records the lock `nvmlDeviceSetGpuLockedClocks`
set and `nvmlDeviceResetGpuLockedClocks` cleared. NVML cannot read locked clocks back, so the tuner's own record
(per boot, in the state directory) is the only memory of the lock that came with an offset it applied.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tuner.actions.reset import reset_device
from tuner.actions.setting import SetRequest, prepare_setting
from tuner.backends import nvidia
from tuner.core import signals
from tuner.core.errors import NotApplied, UsageError
from tuner.core.signals import Terminated

from .fakes.fake_pynvml import FakeGpu, make_fake_nvml

FLOOR_MHZ = 210  # the fake's lowest supported graphics clock: the lock's minimum
BOOST_MHZ = 2520  # the fake's max customer boost clock: the default lock


def _process(m):
    """A fresh tuner process on the same card (a new backend over the same NVML state)."""
    backend = nvidia.discover(m)
    backend._warn = lambda msg: None
    return backend, backend.devices()[0].id


@pytest.fixture
def card():
    m = make_fake_nvml([FakeGpu()])
    return m, m.gpus[0]


def _kept_earlier(m, offset_mhz=30):
    """An earlier `tuner set --offset +30 --yes`: locked at the default boost clock, recorded."""
    backend, dev = _process(m)
    backend.apply(dev, offset_mhz)
    backend.close()


def test_revert_puts_back_the_lock_that_came_with_the_previous_offset(card):
    m, gpu = card
    _kept_earlier(m)
    assert (gpu.offset_mhz, gpu.locked) == (30, (FLOOR_MHZ, BOOST_MHZ))
    backend, dev = _process(m)
    with prepare_setting(backend, SetRequest(dev, 60, lock_clock_mhz=1500)):
        assert (gpu.offset_mhz, gpu.locked) == (60, (FLOOR_MHZ, 1500))
    # not confirmed: the card is back where it was, lock included
    assert (gpu.offset_mhz, gpu.locked) == (30, (FLOOR_MHZ, BOOST_MHZ))
    assert backend.knob(dev).lock_clock_mhz == BOOST_MHZ


def test_a_new_lock_at_the_same_offset_is_reverted_too(card):
    m, gpu = card
    _kept_earlier(m)
    backend, dev = _process(m)
    with prepare_setting(backend, SetRequest(dev, 30, lock_clock_mhz=1800)):
        assert gpu.locked == (FLOOR_MHZ, 1800)
    assert (gpu.offset_mhz, gpu.locked) == (30, (FLOOR_MHZ, BOOST_MHZ))


def test_revert_to_stock_unlocks_and_forgets_the_unconfirmed_lock(card):
    m, gpu = card
    backend, dev = _process(m)
    with prepare_setting(backend, SetRequest(dev, 60, lock_clock_mhz=1500)):
        assert gpu.locked == (FLOOR_MHZ, 1500)
    assert (gpu.offset_mhz, gpu.locked) == (0, None)
    # the next apply without --lock-mhz (a TUI in the same process) must not lock at the rejected clock
    assert backend.knob(dev).lock_clock_mhz == BOOST_MHZ
    backend.apply(dev, 45)
    assert gpu.locked == (FLOOR_MHZ, BOOST_MHZ)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_waiting_for_confirmation_reverts_the_lock(card, sig):
    m, gpu = card
    _kept_earlier(m)
    backend, dev = _process(m)
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signals.install()
    try:
        with pytest.raises((Terminated, KeyboardInterrupt)), prepare_setting(
            backend, SetRequest(dev, 60, lock_clock_mhz=1500)
        ):
            os.kill(os.getpid(), sig)
            time.sleep(5)  # interrupted by the signal
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert (gpu.offset_mhz, gpu.locked) == (30, (FLOOR_MHZ, BOOST_MHZ))


def test_a_failed_apply_restores_the_previous_lock_with_the_previous_offset(card):
    m, gpu = card
    _kept_earlier(m)
    backend, dev = _process(m)
    backend.set_lock_clock(dev, 1500)
    gpu.ignore_offsets = True  # the driver takes the call but the offset does not stick: read-back stays +30
    with pytest.raises(NotApplied):
        backend.apply(dev, 60)
    assert (gpu.offset_mhz, gpu.locked) == (30, (FLOOR_MHZ, BOOST_MHZ))


def test_a_failed_set_with_lock_mhz_leaves_no_lock_choice_for_the_next_apply(card):
    """`set --lock-mhz` (prepare_setting chooses the lock) whose offset does not take: the same process (the TUI)
    must not lock its next apply at the clock of the change that failed."""
    m, gpu = card
    _kept_earlier(m)
    backend, dev = _process(m)
    gpu.ignore_offsets = True  # the driver takes the call but the offset does not stick
    with pytest.raises(NotApplied), prepare_setting(backend, SetRequest(dev, 60, lock_clock_mhz=1500)):
        pass
    assert backend.knob(dev).lock_clock_mhz == BOOST_MHZ
    gpu.ignore_offsets = False
    backend.apply(dev, 45)
    assert gpu.locked == (FLOOR_MHZ, BOOST_MHZ)


def test_a_failed_apply_over_a_foreign_offset_releases_the_lock(card):
    """An offset the tuner did not set came with no lock the tuner knows of: restoring it must not leave the new,
    unconfirmed lock behind."""
    m, gpu = card
    gpu.offsets[0] = gpu.offsets[2] = 45  # another tool's offset, no record
    backend, dev = _process(m)
    backend.set_lock_clock(dev, 1500)
    gpu.ignore_offsets = True
    with pytest.raises(NotApplied):
        backend.apply(dev, 60)
    assert (gpu.offset_mhz, gpu.locked) == (45, None)


def test_a_revert_over_an_offset_with_no_known_lock_does_not_leave_the_new_lock(card):
    """A card whose driver reports no max boost clock, at another tool's offset (no lock the tuner knows of):
    `set --lock-mhz 1500` not confirmed must not leave the card locked at the 1500 MHz nobody confirmed (restoring
    the offset re-locks at the lock in force)."""
    m = make_fake_nvml([FakeGpu(max_boost_mhz=None)])
    gpu = m.gpus[0]
    gpu.offsets[0] = gpu.offsets[2] = 45  # another tool's offset, no record
    backend, dev = _process(m)
    change = prepare_setting(backend, SetRequest(dev, 60, lock_clock_mhz=1500))
    with change:
        assert gpu.locked == (FLOOR_MHZ, 1500)
    assert gpu.locked is None and gpu.offset_mhz == 0  # stock: the one known state without that lock
    assert "lock" in (change.restore_note or "")


def test_reset_releases_the_lock_and_the_record_of_it(card):
    m, gpu = card
    _kept_earlier(m)
    backend, dev = _process(m)
    assert backend.knob(dev).lock_clock_mhz == BOOST_MHZ
    reset_device(backend, dev)
    assert (gpu.offset_mhz, gpu.locked) == (0, None)
    later, dev = _process(m)
    assert later.knob(dev).lock_clock_mhz == BOOST_MHZ


def test_a_fresh_process_reports_the_lock_in_force_not_the_default(card):
    """The lock recorded with the offset the tuner applied is the one on the card (NVML cannot read it back)."""
    m, gpu = card
    backend, dev = _process(m)
    backend.set_lock_clock(dev, 1800)
    backend.apply(dev, 30)
    backend.close()
    later, dev = _process(m)
    assert later.knob(dev).lock_clock_mhz == 1800
    later.apply(dev, 45)  # a new offset without --lock-mhz leaves the lock where it is
    assert gpu.locked == (FLOOR_MHZ, 1800)


def test_a_previous_lock_that_cannot_be_set_back_reverts_to_stock_not_to_the_new_lock(card, monkeypatch):
    m, gpu = card
    _kept_earlier(m)
    backend, dev = _process(m)
    change = prepare_setting(backend, SetRequest(dev, 60, lock_clock_mhz=1500))
    with change:
        def refuse(device_id, mhz):
            raise UsageError(f"--lock-mhz {mhz} is outside this card's clocks", "pick another")

        monkeypatch.setattr(backend, "set_lock_clock", refuse)
    assert (gpu.offset_mhz, gpu.locked) == (0, None)  # stock: no offset left at an unconfirmed lock
    assert "lock clock" in (change.restore_note or "")


def _refusing(gpu, mhz):
    """The driver takes the call but `mhz` does not stick (read-back stays put); every other value does."""
    store = gpu.store

    def refuse(pstate, value):
        if value != mhz:
            store(pstate, value)

    gpu.store = refuse


def test_a_revert_puts_back_a_foreign_per_pstate_state_as_found(card):
    """Another tool's per-pstate state (LACT's `gpu_clock_offsets: {0: 105}`: P0 +105, P2 0, no lock). An unconfirmed
    `tuner set --offset 150` must leave the card as it was found: not P2 at +105 too (where CUDA runs on GeForce),
    nor a lock at a clock the card never had. NVML's offsets are per pstate (nvmlDeviceSetClockOffsets takes one;
    nvmlDeviceGetClockOffsets reads one), and nvmlDeviceResetGpuLockedClocks is the only way to say "no lock"."""
    m, gpu = card
    gpu.offsets[0] = 105
    backend, dev = _process(m)
    with prepare_setting(backend, SetRequest(dev, 150)):
        assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (150, 150, (FLOOR_MHZ, BOOST_MHZ))
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (105, 0, None)


def test_a_revert_of_a_set_to_stock_puts_back_a_foreign_per_pstate_state_as_found(card):
    m, gpu = card
    gpu.offsets[0] = 105
    backend, dev = _process(m)
    with prepare_setting(backend, SetRequest(dev, 0)):
        assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 0, None)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (105, 0, None)


def test_a_failed_apply_puts_back_a_foreign_per_pstate_state_as_found(card):
    m, gpu = card
    gpu.offsets[0] = 105
    backend, dev = _process(m)
    _refusing(gpu, 150)
    with pytest.raises(NotApplied):
        backend.apply(dev, 150)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (105, 0, None)


def test_a_revert_on_a_driver_that_reads_offsets_as_zero_puts_back_the_recorded_offset():
    """Issue 13: some drivers read 0 for an applied offset; the tuner's record is then the only memory of it."""
    m = make_fake_nvml([FakeGpu(readback_zero=True)])
    gpu = m.gpus[0]
    _kept_earlier(m)
    backend, dev = _process(m)
    with prepare_setting(backend, SetRequest(dev, 60, lock_clock_mhz=1500)):
        assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (60, 60, (FLOOR_MHZ, 1500))
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (30, 30, (FLOOR_MHZ, BOOST_MHZ))


def test_a_revert_puts_back_a_foreign_offset_at_p2_when_p0_reads_stock(card):
    """The knob reads P0 alone: another tool's P2-only +105 reads as stock, and a revert through `reset` (stock)
    wiped it. A revert leaves the card as it was found."""
    m, gpu = card
    gpu.offsets[2] = 105
    backend, dev = _process(m)
    with prepare_setting(backend, SetRequest(dev, 150)):
        assert (gpu.offsets[0], gpu.offsets[2]) == (150, 150)
    assert (gpu.offsets[0], gpu.offsets[2], gpu.locked) == (0, 105, None)
