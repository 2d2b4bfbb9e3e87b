"""The root helper's client (`tuner/backends/helper_client.py`) against fake helpers: a unix socket that answers
(or does not) as a test scripts it, so what the client does with a silent, terse or refusing helper is seen."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.polling import wait_until
from tuner.backends import helper_client
from tuner.core import exit_codes
from tuner.helper import schema as s

HELLO = {"version": s.PROTOCOL_VERSION, "helper_version": "0.0-fake", "backend": "simulated", "simulated": True,
         "sim": None, "group": "tuner", "uid": 1000, "allow_overvolt": False}
Answer = Callable[[dict], "bytes | None"]  # a request -> the reply line(s), or None: no answer at all


def ok(request: dict, result: object = None) -> bytes:
    return (json.dumps({"id": request["id"], "ok": True, "result": result}) + "\n").encode()


def greeting(request: dict) -> bytes | None:
    """A helper that answers hello, list (no cards) and heartbeats, and nothing else."""
    return {"hello": lambda: ok(request, HELLO), "list": lambda: ok(request, []),
            "heartbeat": lambda: ok(request, {"lost": []})}.get(request["op"], lambda: None)()


@contextlib.contextmanager
def fake_helper(tmp_path: Path, answer: Answer, ended: list[int] | None = None) -> Iterator[Path]:
    """A listening unix socket whose connections are each served by `answer`, one request line at a time; the
    number of each connection the client closed is appended to `ended`."""
    path = tmp_path / "h.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    accepted: list[socket.socket] = []

    def serve_one(conn: socket.socket, number: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in conn.makefile("rb"):
                try:  # held to the helper's own schema, as tuner/helper/server.py holds every request line
                    s.decode_request(line)
                except s.BadRequest as e:
                    conn.sendall(s.encode(s.Reply(id=0, ok=False, code=e.code, error=str(e))))
                    continue
                reply = answer(json.loads(line))
                if reply is not None:
                    conn.sendall(reply)
            if ended is not None:
                ended.append(number)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                accepted.append(conn)
                threading.Thread(target=serve_one, args=(conn, len(accepted)), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        for conn in accepted:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        thread.join(timeout=30)


@pytest.mark.timeout(30)  # the guard: the old client waited the whole reply timeout (made an hour here)
def test_a_helper_that_accepts_and_never_answers_hello_is_one_line_not_a_long_wait(tmp_path, monkeypatch):
    """The hello waited as long as any request (120 s, for a write the driver may hold), so `tuner doctor` and
    every command hung for two minutes on a socket that accepts and never answers. The helper answers hello without
    touching a card: its own short bound ends in the client's one line, exit 9."""
    monkeypatch.setattr(helper_client, "REPLY_TIMEOUT_S", 3600.0)
    monkeypatch.setattr(helper_client, "HELLO_TIMEOUT_S", 0.2, raising=False)
    with fake_helper(tmp_path, lambda request: None) as path, \
            pytest.raises(helper_client.HelperUnreachable) as refused:
        helper_client.connect(path)
    assert refused.value.exit_code == exit_codes.HELPER_UNREACHABLE
    assert str(path) in refused.value.message and "\n" not in refused.value.one_line()


def opened_connections(monkeypatch) -> list[helper_client.HelperConnection]:
    """Every connection the client opens, in order (to see which it closed)."""
    opened: list[helper_client.HelperConnection] = []
    real_open = helper_client.HelperConnection.open

    def spy(cls, path):
        opened.append(real_open(path))
        return opened[-1]

    monkeypatch.setattr(helper_client.HelperConnection, "open", classmethod(spy))
    return opened


def test_a_kernel_event_stream_the_helper_refuses_closes_its_connection(tmp_path, monkeypatch):
    """`kernel_log_source` returned None on a refusal (a helper that cannot read the kernel log) and left its own
    connection open: a socket leaked (a ResourceWarning when collected) and the helper kept a connection of this
    user's 16 until this tuner exited."""
    def refusing(request: dict) -> bytes | None:
        if request["op"] == "kernel_events":
            return (json.dumps({"id": request["id"], "ok": False, "code": "unsupported",
                                "error": "cannot read the kernel log /dev/kmsg: Permission denied"}) + "\n").encode()
        return greeting(request)

    opened = opened_connections(monkeypatch)
    with fake_helper(tmp_path, refusing) as path:
        backend = helper_client.HelperBackend.connect(path)
        try:
            assert backend.kernel_log_source(["sim0"]) is None
            assert len(opened) == 2
            assert opened[1].sock.fileno() == -1, "the refused stream's connection is still open"
        finally:
            backend.close()


@pytest.mark.parametrize("refusal", [{}, {"code": "", "error": "", "remedy": ""}, {"code": "internal"}])
def test_a_refusal_without_words_says_the_helper_gave_no_reason_and_where_its_log_is(tmp_path, refusal):
    """An error reply without text (another helper version, a foreign program on the socket) became an empty error
    line (or a bare code): the user saw `error: ` and nothing to act on."""
    def terse(request: dict) -> bytes | None:
        return (json.dumps({"id": request["id"], "ok": False, **refusal}) + "\n").encode()

    with fake_helper(tmp_path, terse) as path, pytest.raises(helper_client.TunerError) as refused:
        helper_client.connect(path)
    line = refused.value.one_line()
    assert "hello" in refused.value.message and "without a reason" in refused.value.message, line
    assert "journalctl -u tuner-helper" in (refused.value.remedy or ""), line


def test_a_kernel_event_stream_waits_for_the_next_line_without_the_reply_timeout(tmp_path, monkeypatch):
    """The stream's connection kept the reply timeout (120 s): a kernel that logged nothing about the card for two
    minutes, the usual case, timed the read out, the stream ended and the watcher said the kernel log stopped being
    readable (a stress run's kernel-log check OFF from then on). A quiet stream is waited on until `close`."""
    def streaming(request: dict) -> bytes | None:
        return ok(request) if request["op"] == "kernel_events" else greeting(request)

    opened = opened_connections(monkeypatch)
    with fake_helper(tmp_path, streaming) as path:
        backend = helper_client.HelperBackend.connect(path)
        try:
            source = backend.kernel_log_source(["sim0"])
            assert source is not None
            assert opened[1].sock.gettimeout() is None, f"a stream that times out after {opened[1].sock.gettimeout()} s"
            source[1]()
        finally:
            backend.close()


def test_a_command_line_with_a_non_utf8_file_name_still_greets_the_helper(tmp_path):
    """The hello names the client by its command line (`tuner apply café.toml`), and a file name with a byte that
    is not UTF-8 is a lone surrogate in Python's argv: encoding the hello raised UnicodeEncodeError, and every
    command given such a name (a valid path) ended in a traceback wherever a helper is installed."""
    said: list[str] = []

    def listening(request: dict) -> bytes | None:
        if request["op"] == "hello":
            said.append(request["client"])
        return greeting(request)

    with fake_helper(tmp_path, listening) as path:
        connection, hello = helper_client.connect(path, client="tuner apply caf\udce9.toml")
        connection.close()
        connection, _ = helper_client.connect(path, client="tuner apply " + "\udce9" * 194)  # argv's 200, escaped
        connection.close()
    assert hello.simulated and said[0] == "tuner apply caf\\udce9.toml", said
    assert said[1].startswith("tuner apply \\udce9") and len(said[1]) <= 500, said


def test_a_connection_the_client_declares_lost_is_closed_so_the_helper_puts_back_at_once(tmp_path):
    """A reply the client cannot read (garbled, another program) or none in time: the error says "any unconfirmed
    change was put back", but the socket stayed open, so the helper kept the change until the lease ran out (or the
    tuner exited), and the tuner went on beside it meanwhile. Closed at once, the helper puts it back as it does for
    a `kill -9` (docs/helper.md, Leases)."""
    def garbling(request: dict) -> bytes | None:
        return b"\x00not a reply\n" if request["op"] == "set" else greeting(request)

    ended: list[int] = []
    with fake_helper(tmp_path, garbling, ended) as path:
        backend = helper_client.HelperBackend.connect(path)
        try:
            with pytest.raises(helper_client.HelperUnreachable) as lost:
                backend.apply("sim0", -50)
            assert "put back" in lost.value.message
            wait_until(lambda: ended, 10, "the helper to see the lost connection closed")
        finally:
            backend.close()


@pytest.mark.timeout(60)
def test_a_reply_line_longer_than_any_the_wire_sends_is_a_lost_helper_not_unbounded_memory(tmp_path, monkeypatch):
    """`readline()` had no bound: a program listening where TUNER_HELPER_SOCKET points (or a broken helper) that
    sends bytes without a newline had the client read them all into memory, as long as it kept sending. A line
    longer than the wire's largest reply (`schema.MAX_REPLY_BYTES`, made 1 MiB here) is the client's one line:
    the helper is lost."""
    monkeypatch.setattr(s, "MAX_REPLY_BYTES", 1 << 20)
    monkeypatch.setattr(helper_client, "HELLO_TIMEOUT_S", 2.0)  # bounds the old client's wait, once it read it all

    def flooding(request: dict) -> bytes | None:
        return b"x" * (16 << 20)  # no newline: 16 times the limit

    with fake_helper(tmp_path, flooding) as path, pytest.raises(helper_client.HelperUnreachable) as lost:
        helper_client.connect(path)
    assert "1048576 bytes" in lost.value.message, lost.value.one_line()
    assert "\n" not in lost.value.one_line()
