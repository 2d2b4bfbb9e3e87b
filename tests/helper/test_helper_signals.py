"""The helper's stop signal is safe in a storm: its handler only sets a flag, which the accept loop turns into the
stop (setting the Event in the handler could wait for the Event's own lock, held by the same thread one signal
earlier, and the helper would hang with the cards not put back)."""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

from tuner.helper.server import HelperServer


class _Service:
    def __init__(self) -> None:
        self.shut_down = threading.Event()

    def shutdown(self) -> None:
        self.shut_down.set()

    def expire_leases(self) -> None:
        pass


def _server(tmp_path: Path) -> tuple[HelperServer, _Service]:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "helper.sock"))
    listener.listen()
    service = _Service()
    return HelperServer(service, listener, 0), service  # type: ignore[arg-type]  # the two calls serve makes


def test_a_stop_signal_inside_the_stops_own_lock_returns_and_the_helper_still_stops(tmp_path):
    server, service = _server(tmp_path)
    returned = threading.Event()

    def handler_while_this_thread_holds_the_events_lock() -> None:
        with server.stop._cond:  # where a first signal's Event.set was when the second one landed
            server.request_stop(signal.SIGTERM, None)
            returned.set()

    threading.Thread(target=handler_while_this_thread_holds_the_events_lock, daemon=True).start()
    assert returned.wait(5), "the signal handler waited for a lock its own thread holds"
    serving = threading.Thread(target=server.serve, daemon=True)
    serving.start()
    serving.join(10)
    assert not serving.is_alive() and server.stop.is_set() and service.shut_down.is_set()
    server.listener.close()
