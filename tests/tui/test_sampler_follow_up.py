"""The App's telemetry sampler never loses the read that follows a change. A change (an apply, a revert, a phase)
asks for a sample; while one is in flight, another is queued to follow it. The queued read must start even when
the first worker's thread has posted its sample but not yet ended (preempted on a loaded box) when the App
handles that sample: the tests run without the 1 Hz sampler, so nothing else would read the card again."""

from __future__ import annotations

import threading
import time

from tests.tui.helpers import make_app, sim_backend, until
from tuner.screens import messages as msg


async def test_a_change_during_a_sample_is_always_read_back_even_when_the_worker_ends_late(tmp_path):
    backend = sim_backend(tmp_path)
    first_read_may_end = threading.Event()
    reads: list[int] = []
    telemetry = backend.telemetry

    def slow_first_telemetry(device_id):
        reads.append(backend.knob(device_id).current)
        if len(reads) == 1:
            first_read_may_end.wait(10.0)
        return telemetry(device_id)

    backend.telemetry = slow_first_telemetry
    app = make_app(tmp_path, backend=backend)
    post = app.post_message

    def post_then_linger(message):
        posted = post(message)
        if isinstance(message, msg.TelemetrySampled) and threading.current_thread() is not threading.main_thread():
            time.sleep(0.5)  # the worker's thread is preempted after posting, before Textual marks it finished
        return posted

    app.post_message = post_then_linger
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(reads) == 1, what="the first sample is in flight")
        backend.apply("sim0", -20)
        app.sample_now()  # the change: its read must follow the one in flight
        first_read_may_end.set()
        await until(pilot, lambda: -20 in reads, timeout_s=10.0, what="a read made after the change")
        await until(pilot, lambda: app.histories["sim0"].knob.current == -20, what="the screen's knob")
