"""JSON lines out: one event per line, flushed, thread-safe; the heartbeat thread; the log on stderr. No torch here.

The events are declared in `tuner.engine.events` (their fields, types and JSON form, and docs/engine.md's tables);
this module writes them: every event carries `"event"` and `"t"`, monotonic seconds since the engine started.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from tuner.engine.events import Event, HeartbeatEvent, to_record


def log_line(msg: str) -> None:
    """One line of the engine's log on stderr."""
    try:
        print(f"engine: {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr is a pipe to a reader that died: nobody to tell
        pass


class Emitter:
    """Writes events to a text stream (the protocol) and/or hands them to a callback (in-process use)."""

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        sink: Callable[[dict[str, Any]], None] | None = None,
        t0: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream, self._sink, self._clock = stream, sink, clock
        self.t0 = clock() if t0 is None else t0
        self._lock = threading.Lock()
        self.broken = False  # the reader went away (EPIPE); the engine should stop

    def now(self) -> float:
        return self._clock() - self.t0

    def emit(self, event: Event) -> dict[str, Any]:
        """Write `event` stamped with the time now; returns the record written (the sink gets the same)."""
        with self._lock:  # stamped inside the lock: `t` never goes backwards between threads
            record = to_record(event, round(self.now(), 4))
            if self._sink is not None:
                self._sink(record)
            if self._stream is not None and not self.broken:
                try:
                    self._stream.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
                    self._stream.flush()
                except (BrokenPipeError, ValueError, OSError):
                    self.broken = True
        return record


class Heartbeat:
    """A daemon thread that emits `heartbeat` at a fixed interval, also while the main thread is in a long step.

    `status()` is called from the thread and returns the fields of `HeartbeatEvent` (step, state, progress); it
    must only read plain Python values. `tick()`, when given, runs first on every beat (the engine's parent
    watch). `stop()` ends the thread (the hang injection uses it to go silent).
    """

    def __init__(self, emitter: Emitter, status: Callable[[], dict[str, Any]], interval_s: float = 0.5,
                 tick: Callable[[], None] | None = None) -> None:
        self._emitter, self._status, self._interval_s, self._tick = emitter, status, interval_s, tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                if self._tick is not None:
                    self._tick()
                self._emitter.emit(HeartbeatEvent(**self._status()))
            except Exception as e:  # noqa: BLE001 - a heartbeat must never kill the engine
                log_line(f"heartbeat failed: {e!r}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
