"""The one way a test waits: for the condition itself, checked by the clock, with a generous bound (issue 21
item 9). Never a fixed pause that is hoped to be long enough: on a loaded 2-core CI box it is not."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout_s: float = 30.0, what: str = "the condition",
               interval_s: float = 0.02) -> object:
    """Poll `condition()` until it is truthy and return its value; fail after `timeout_s` naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


async def until(pilot, condition: Callable[[], object], *, timeout_s: float = 20.0, what: str = "") -> None:
    """Let a Textual App (its test pilot) run until `condition()` is true (a repaint, a worker's message, a screen
    switch), or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never became true within {timeout_s:g} s: {what or condition}")
        await pilot.pause(0.02)
