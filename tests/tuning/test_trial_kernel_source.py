"""A trial's kernel-log watcher reads where the backend says (issue 22 item 5): through the root helper, the
helper's stream of the trial's cards (a user cannot read /dev/kmsg where dmesg_restrict=1); in-process (the base
class answers None), the tuner's own reading."""

from __future__ import annotations

from dataclasses import replace

from tests.polling import wait_until
from tuner.backends.simulated import SimulatedBackend
from tuner.core.models import DeviceInfo
from tuner.tuning import kernel_log, trial


class RealLookingBackend(SimulatedBackend):
    """The simulated card shown as a real one (a simulated card's trial never watches the host's kernel log),
    with a kernel-log source like HelperBackend.kernel_log_source: (lines, close) for the cards asked about."""

    def __init__(self, lines: list[str] | None):
        super().__init__()
        self.lines, self.asked, self.closed = lines, [], False

    def devices(self) -> list[DeviceInfo]:
        return [replace(d, simulated=False) for d in super().devices()]

    def kernel_log_source(self, device_ids):
        self.asked.append(list(device_ids))
        if self.lines is None:
            return None

        def close() -> None:
            self.closed = True

        return iter(self.lines), close


def test_the_trial_watches_the_backends_kernel_log_stream():
    backend = RealLookingBackend(["amdgpu 0000:10:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=7"])
    watcher = trial._watcher(backend, ["sim0"], "trial", None, lambda message: None)
    watcher.start()
    wait_until(lambda: len(watcher.events) == 1, 10, "the helper's line")
    assert backend.asked == [["sim0"]] and watcher.available
    watcher.stop()
    assert backend.closed


def test_without_a_stream_the_trial_reads_the_kernel_log_itself(monkeypatch):
    own = []
    monkeypatch.setattr(kernel_log, "open_live_source", lambda: own.append(1) or None)
    warned: list[str] = []
    watcher = trial._watcher(RealLookingBackend(None), ["sim0"], "trial", None, warned.append)
    watcher.start()
    assert own == [1] and not watcher.available and "cannot read the kernel log" in warned[0]


def test_a_stress_run_watches_the_same_stream_as_a_trial():
    """The stress action (CLI and UI) asks the backend as a trial does: through the root helper a user's stress run
    still sees the card's kernel-log lines."""
    from tuner.actions.stress import StressRequest, StressSession
    from tuner.core.models import StressTarget

    backend = RealLookingBackend(["amdgpu 0000:10:00.0: amdgpu: GPU reset begin!"])
    session = StressSession(backend, StressRequest("sim0"))
    watcher = session._watcher(StressTarget("cpu", "0000:10:00.0"))
    watcher.start()
    wait_until(lambda: len(watcher.events) == 1, 10, "the helper's line")
    assert backend.asked == [["sim0"]] and watcher.available
    watcher.stop()
    assert backend.closed
