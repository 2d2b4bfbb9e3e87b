"""Fatal signals are recorded, never acted on mid-write; a revert always reaches a known state."""

import os
import signal

import pytest

from tuner.actions.keep_or_revert import PendingChange, signals_held
from tuner.backends.simulated import SimulatedBackend
from tuner.core import signals
from tuner.core.errors import NotApplied, OutOfRange


@pytest.mark.parametrize("sig", signals.FATAL)
def test_an_inbox_records_every_fatal_signal_and_raises_nothing(sig):
    with signals.Inbox() as inbox:
        os.kill(os.getpid(), sig)
        os.kill(os.getpid(), sig)  # a second one is recorded too, never raised
        assert inbox.wait(1.0)
    assert inbox.first == sig and len(inbox.received) == 2
    with pytest.raises(KeyboardInterrupt if sig == signal.SIGINT else signals.Terminated):
        inbox.raise_received()


def test_an_inbox_restores_the_handlers_it_replaced():
    before = {s: signal.getsignal(s) for s in signals.FATAL}
    with signals.Inbox():
        pass
    assert {s: signal.getsignal(s) for s in signals.FATAL} == before


def test_ctrl_z_is_recorded_only_when_asked_and_is_not_a_fatal_signal():
    with signals.Inbox(stop_signals=True) as inbox:
        os.kill(os.getpid(), signal.SIGTSTP)
        assert inbox.wait(1.0)
    assert inbox.stop_requested and inbox.first is None


def test_a_nested_inbox_leaves_the_decision_to_the_outer_owner():
    with signals.Inbox() as outer, signals_held():  # would raise on exit if it owned the signal
        os.kill(os.getpid(), signal.SIGTERM)
        outer.wait(1.0)
    assert outer.first == signal.SIGTERM


def test_signals_held_raises_the_recorded_signal_once_the_block_is_done():
    done = []
    with pytest.raises(signals.Terminated), signals_held():
        os.kill(os.getpid(), signal.SIGHUP)
        done.append("finished the block")
    assert done == ["finished the block"]


class _Refusing(SimulatedBackend):
    """The card refuses the old value (off this card's step), or refuses everything."""

    def __init__(self, *a, refuse_all=False, **kw):
        super().__init__(*a, **kw)
        self.refuse_all = refuse_all

    def apply(self, device_id, value, *, allow_overvolt=False):
        if self.refuse_all and value != 0:
            raise OutOfRange("refused")
        return super().apply(device_id, value, allow_overvolt=allow_overvolt)

    def reset(self, device_id):
        if self.refuse_all:
            raise NotApplied("the card is gone")
        return super().reset(device_id)


def _card_at(backend, value):
    backend._write_setting("sim0", value)  # another tool left an off-grid value: not a tuner write


@pytest.mark.parametrize("previous", [-7, -250])
def test_a_revert_never_fails_on_validation_it_falls_back_to_stock(tmp_path, monkeypatch, previous):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    backend = SimulatedBackend(seed=1)
    _card_at(backend, previous)
    change = PendingChange(backend, "sim0", -30)
    with change:
        assert backend.knob("sim0").current == -30
    assert change.reverted_to.current == 0 == backend.knob("sim0").current
    assert "reset to stock instead" in change.restore_note


def test_a_revert_that_cannot_reach_any_known_state_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    backend = _Refusing(seed=1)
    change = PendingChange(backend, "sim0", -30)
    change.apply()
    backend.refuse_all = True
    with pytest.raises(NotApplied, match="could not be restored") as err:
        change.revert()
    assert "reboot" in err.value.remedy
