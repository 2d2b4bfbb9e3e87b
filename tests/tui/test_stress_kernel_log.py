"""A kernel-log fault stops a stress run started from the UI (issue 21 item 4): the App's stress job gives the
kernel-log watcher its callback through the watcher's public API, so a GPU reset in the log ends the run at once
(runs last up to an hour) and the summary names the kernel-log line."""

from __future__ import annotations

import queue

import pytest

from tests.tui.helpers import make_app, sim_backend, until
from tuner.tuning.kernel_log import KernelLogWatcher

pytestmark = pytest.mark.timeout(300)

RESET_LINE = "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!"


class FakeKernelLog:
    """A live kernel-log source whose lines the test writes (KernelLogWatcher's `source` seam: the lines, and how
    to stop reading them, as tuner.tuning.kernel_log.open_live_source returns them). Like /dev/kmsg and
    `journalctl -f`, every open is a reader of its own: a line written reaches each reader open at that moment,
    and closing one reader ends only that one."""

    def __init__(self) -> None:
        self._readers: list[queue.Queue[str | None]] = []
        self.opened = 0

    def __call__(self):
        self.opened += 1
        reader: queue.Queue[str | None] = queue.Queue()
        self._readers.append(reader)

        def lines():
            while (line := reader.get()) is not None:
                yield line

        def close() -> None:
            self._readers.remove(reader)
            reader.put(None)

        return lines(), close

    def write(self, line: str) -> None:
        for reader in list(self._readers):
            reader.put(line)

    def watcher(self) -> KernelLogWatcher:
        return KernelLogWatcher(source=self)


async def _wait(pilot, predicate, timeout_s: float = 120.0) -> None:
    """Engine runs on a loaded 2-core box: a generous bound, checked by the clock (tests.tui.helpers.until)."""
    await until(pilot, predicate, timeout_s=timeout_s)


async def test_a_kernel_log_fault_stops_a_stress_run_started_from_the_tune_screen(tmp_path):
    log = FakeKernelLog()
    backend = sim_backend(tmp_path)
    app = make_app(tmp_path, backend=backend, samples=1,
                   stress_options={"reference_record_s": 1.0, "kernel_watcher_factory": log.watcher})
    async with app.run_test(size=(80, 24)) as pilot:
        try:
            await pilot.press("2", "s")
            # the run proper (after the stock reference was recorded), a few steps in: the card resets. Its start
            # resets the steps, so three steps after it are the run proper's (the recording's last steps, still
            # shown until then, once let the line land in the recording's watcher as that one closed)
            await _wait(pilot, lambda: "engine: the stress run" in app.stress.log and len(app.stress.steps) >= 3
                        and app.stress.detector("reference") == "ok" and app.stress.detector("kernel log") == "ok")
            assert log.opened == 2  # the recording's reader and the run proper's
            log.write(RESET_LINE)
            await _wait(pilot, lambda: not app.stress.running, 60.0)  # an hour-long run: only the fault ends it
        finally:
            if app.stress.running:  # the fault did not stop it: stop it, so the test ends
                app.stop_stress()
                await _wait(pilot, lambda: not app.stress.running)
        assert app.stress.verdict.startswith("FAIL (kernel log"), app.stress.verdict
        assert RESET_LINE in app.stress.verdict
        assert app.stress.detector("kernel log") == "FAULT"
        assert not backend._loaded("sim0") and backend.knob("sim0").current == 0
