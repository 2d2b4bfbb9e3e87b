"""A kernel-log fault stops a stress run started from the UI (issue 21 item 4): the App's stress job gives the
kernel-log watcher its callback through the watcher's public API, so a GPU reset in the log ends the run at once
(runs last up to an hour) and the summary names the kernel-log line."""

from __future__ import annotations

import queue

import pytest

from tests.tui.helpers import make_app, sim_backend
from tuner.tuning.kernel_log import KernelLogWatcher

pytestmark = pytest.mark.timeout(180)

RESET_LINE = "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!"


class FakeKernelLog:
    """A live kernel-log source whose lines the test writes (KernelLogWatcher's `source` seam: the lines, and how
    to stop reading them, as tuner.tuning.kernel_log.open_live_source returns them)."""

    def __init__(self) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.opened = 0

    def __call__(self):
        self.opened += 1

        def lines():
            while (line := self.lines.get()) is not None:
                yield line

        return lines(), lambda: self.lines.put(None)

    def watcher(self) -> KernelLogWatcher:
        return KernelLogWatcher(source=self)


async def _wait(pilot, predicate, timeout_s: float = 90.0) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if predicate():
            return
        await pilot.pause(0.1)
    raise AssertionError("condition never became true")


async def test_a_kernel_log_fault_stops_a_stress_run_started_from_the_tune_screen(tmp_path):
    log = FakeKernelLog()
    backend = sim_backend(tmp_path)
    app = make_app(tmp_path, backend=backend, samples=1,
                   stress_options={"reference_record_s": 3.0, "kernel_watcher_factory": log.watcher})
    async with app.run_test(size=(80, 24)) as pilot:
        try:
            await pilot.press("2", "s")
            # the run proper (after the stock reference was recorded), a few steps in: the card resets
            await _wait(pilot, lambda: app.stress.detector("reference") == "ok" and len(app.stress.steps) >= 3
                        and app.stress.detector("kernel log") == "ok")
            log.lines.put(RESET_LINE)
            await _wait(pilot, lambda: not app.stress.running, 60.0)  # an hour-long run: only the fault ends it
        finally:
            if app.stress.running:  # the fault did not stop it: stop it, so the test ends
                app.stop_stress()
                await _wait(pilot, lambda: not app.stress.running)
        assert app.stress.verdict.startswith("FAIL (kernel log"), app.stress.verdict
        assert RESET_LINE in app.stress.verdict
        assert app.stress.detector("kernel log") == "FAULT"
        assert not backend._loaded("sim0") and backend.knob("sim0").current == 0
