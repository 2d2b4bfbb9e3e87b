"""The helper's socket: bind it safely (or take systemd's), accept, frame JSON lines, keep bad clients in check.

- The socket is `0660 root:<group>`; a path that exists as anything but a socket (a regular file, a symlink) is
  refused; a socket nobody answers on (a helper that died) is replaced atomically (bound under a temporary name,
  then renamed over it); one that answers means another helper runs: refused. A lock file beside it serialises
  two starting helpers. The directory must not be writable by others (they could swap the socket).
- Under systemd socket activation (`LISTEN_PID`/`LISTEN_FDS`, by hand) the inherited socket is used as is.
- Each connection: the kernel says who it is (`peer.py`); neither root nor in the group: one line, closed. Then
  `hello` within `HELLO_TIMEOUT_S`; nothing for `IDLE_TIMEOUT_S` (a client's heartbeats keep it alive): one line,
  closed. A request line over `schema.MAX_REQUEST_BYTES` is refused unread (up to its newline). A client that
  does not read its replies (a flood) is cut off when a reply cannot be sent within `SEND_TIMEOUT_S`. At most
  `MAX_CONNECTIONS` connections, `MAX_PER_UID` per user. Every bad request gets one line with a code; the
  connection and every other one go on.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from tuner.core import exit_codes
from tuner.core.errors import TunerError
from tuner.helper import kmsg
from tuner.helper import schema as s
from tuner.helper.leases import Busy
from tuner.helper.peer import Peer, peer_of, with_command
from tuner.helper.service import Client, HelperService, code_of

HELLO_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 30.0
SEND_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 64
MAX_PER_UID = 16
REAP_INTERVAL_S = 0.2
SD_LISTEN_FDS_START = 3


class SocketProblem(TunerError):
    """The socket path cannot be used; nothing was bound."""


class AnotherHelper(TunerError):
    exit_code = exit_codes.BUSY


# --- the listening socket -------------------------------------------------------------------------------------------
def inherited_listener() -> socket.socket | None:
    """The socket systemd passed (socket activation), or None when not activated."""
    fds = os.environ.get("LISTEN_FDS", "")
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or not fds.isdigit() or int(fds) < 1:
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not for anything we start
    try:
        sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as e:  # fd 3 closed, or a file: the variables were set by hand or leaked from a parent
        raise SocketProblem(f"LISTEN_PID and LISTEN_FDS say systemd passed a socket, but fd {SD_LISTEN_FDS_START} "
                            f"is not one ({e.strerror})", "start tuner-helper from its socket unit, or unset "
                            "LISTEN_PID and LISTEN_FDS") from None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise SocketProblem("the socket systemd passed is not a unix stream socket",
                            "use ListenStream=/run/tuner/helper.sock in the socket unit")
    return sock


def _check_directory(directory: Path) -> None:
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise SocketProblem(f"{directory} is not a directory", "give --socket a path in a root-owned directory")
    writable_by_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
    if (os.geteuid() == 0 and st.st_uid != 0) or writable_by_others:
        raise SocketProblem(f"{directory} can be changed by other users, who could replace the socket",
                            f"put the socket in a directory only root can write (e.g. /run/tuner), or "
                            f"`chown root {directory} && chmod go-w {directory}`")


def _refuse_existing(path: Path) -> None:
    """Refuse a path that exists as anything but a stale socket (one no helper answers on)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise SocketProblem(f"{path} is a symlink; refusing to replace it", "remove it if it is yours, or pick "
                            "another --socket path")
    if not stat.S_ISSOCK(st.st_mode):
        what = "a regular file" if stat.S_ISREG(st.st_mode) else "not a socket"
        raise SocketProblem(f"{path} exists and is {what}; refusing to replace it",
                            "remove it if it is yours, or pick another --socket path")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return  # stale: its helper died
        except OSError:
            pass  # answering but refusing us, or slow: someone is there
    raise AnotherHelper(f"another helper answers at {path}", "stop it first (systemctl stop tuner-helper.socket)")


def bind_listener(path: Path, gid: int) -> tuple[socket.socket, int]:
    """A listening socket at `path`, mode 0660, owner root (this process), group `gid`; and the startup lock's fd
    (keep it open while serving)."""
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as e:  # a file where the directory (or one above it) should be
        reason = "it exists and is not a directory" if isinstance(e, FileExistsError) else e.strerror
        raise SocketProblem(f"cannot make the socket's directory {directory}: {reason}",
                            "give --socket a path in a root-owned directory (e.g. /run/tuner/helper.sock)") from None
    _check_directory(directory)
    lock_fd = os.open(directory / f".{path.name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        raise AnotherHelper(f"another helper is starting at {path}", "stop it first") from None
    try:
        _refuse_existing(path)
        tmp = directory / f".{path.name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # 0600 from the start: nobody gets in before the group is set
        try:
            sock.bind(str(tmp))
        except OSError as e:  # "AF_UNIX path too long": the temporary name is longer than the path itself
            sock.close()
            raise SocketProblem(f"cannot bind {path} (first as {tmp.name} beside it): {e.strerror or e}",
                                "a unix socket's path is at most 107 bytes; pick a shorter --socket path") from None
        finally:
            os.umask(old_umask)
        os.chown(tmp, os.geteuid(), gid)
        os.chmod(tmp, 0o660)
        os.rename(tmp, path)  # atomically replaces a stale socket
        sock.listen(64)
        return sock, lock_fd
    except BaseException:
        os.close(lock_fd)
        raise


# --- connections ----------------------------------------------------------------------------------------------------
class _Connection:
    def __init__(self, sock: socket.socket, conn_id: int, peer: Peer):
        self.sock, self.id, self.peer = sock, conn_id, peer
        self.buffer = b""
        self.send_lock = threading.Lock()
        self.hello_by: float | None = None  # monotonic: hello is due by then, whatever else comes; None: greeted

    def send(self, message: s.Reply) -> None:
        data = s.encode(message)
        with self.send_lock:
            self.sock.settimeout(SEND_TIMEOUT_S)
            self.sock.sendall(data)

    def error(self, request_id: int, code: str, message: str, remedy: str | None = None,
              holder: s.Holder | None = None) -> None:
        self.send(s.Reply(id=request_id, ok=False, code=code, error=message, remedy=remedy or "", holder=holder))

    def _timeout_s(self) -> float:
        """Until hello, what is left of the hello timeout (other lines do not extend it); then the idle timeout."""
        if self.hello_by is None:
            return IDLE_TIMEOUT_S
        left = self.hello_by - time.monotonic()
        if left <= 0:
            raise TimeoutError("no hello in time")
        return left

    def lines(self, hello_timeout_s: float) -> Iterator[bytes | None]:
        """Request lines as they come; None for a line over the size cap (its bytes are skipped). Ends on EOF;
        raises TimeoutError when nothing comes in time, or no hello within `hello_timeout_s` (clear `hello_by`
        once greeted)."""
        self.hello_by = time.monotonic() + hello_timeout_s
        skipping = False
        while True:
            self._timeout_s()  # a client sending anything but hello is still cut off in time
            while b"\n" not in self.buffer:
                if len(self.buffer) >= s.MAX_REQUEST_BYTES:
                    self.buffer, skipping = b"", True
                self.sock.settimeout(self._timeout_s())
                chunk = self.sock.recv(65536)
                if not chunk:
                    return
                self.buffer += chunk
            line, self.buffer = self.buffer.split(b"\n", 1)
            if skipping:
                skipping = False
                yield None
            elif len(line) + 1 > s.MAX_REQUEST_BYTES:
                yield None
            else:
                yield line


class HelperServer:
    def __init__(self, service: HelperService, listener: socket.socket, gid: int, *,
                 kmsg_path: Path = kmsg.DEFAULT_KMSG):
        self.service, self.listener, self.gid, self.kmsg_path = service, listener, gid, kmsg_path
        self.stop = threading.Event()
        self._stop_requested = False  # set by a signal handler (request_stop); `serve` turns it into `stop`
        self._ids = itertools.count(1)
        self._connections: dict[int, _Connection] = {}
        self._lock = threading.Lock()

    def serve(self) -> None:
        """Accept until `stop` is set; then put every unconfirmed change back and close every connection."""
        reaper = threading.Thread(target=self._reap, name="helper-leases", daemon=True)
        reaper.start()
        self.listener.settimeout(0.25)
        try:
            while not self.stop.is_set():
                if self._stop_requested:
                    self.stop.set()
                    break
                try:
                    sock, _ = self.listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    if self.stop.is_set():
                        break
                    raise
                self._admit(sock)
        finally:
            self.service.shutdown()
            with self._lock:
                for connection in list(self._connections.values()):
                    with contextlib.suppress(OSError):
                        connection.sock.shutdown(socket.SHUT_RDWR)

    def request_stop(self, _signum: int = 0, _frame: object = None) -> None:
        """Stop serving (a signal handler: SIGTERM from systemd, Ctrl-C). Only a flag, which the accept loop
        sees within its 0.25 s timeout: setting the Event here could wait for a lock that this very thread holds
        (a second signal landing inside the first one's `Event.set`), and the helper would never put the cards
        back."""
        self._stop_requested = True

    def _reap(self) -> None:
        while not self.stop.wait(REAP_INTERVAL_S):
            try:
                self.service.expire_leases()
            except Exception as e:  # noqa: BLE001 - the reaper must outlive one card's failure
                self.service._log(f"putting back an expired change failed: {e}")

    def _admit(self, sock: socket.socket) -> None:
        peer = peer_of(sock)
        connection = _Connection(sock, next(self._ids), peer)
        refusal = None
        with self._lock:
            if not peer.member_of(self.gid):
                group = self.service.group
                refusal = ("not-allowed", f"uid {peer.uid} is neither root nor in the helper's group {group}",
                           f"ask an admin: `sudo usermod -aG {group} <you>`, then log in again")
            elif len(self._connections) >= MAX_CONNECTIONS or \
                    sum(c.peer.uid == peer.uid for c in self._connections.values()) >= MAX_PER_UID:
                refusal = ("too-many", "too many connections to the helper", "close other tuner sessions first")
            else:
                self._connections[connection.id] = connection
        if refusal is not None:
            with contextlib.suppress(OSError):
                connection.error(0, *refusal)
            sock.close()
            return
        threading.Thread(target=self._serve_connection, args=(connection,), name=f"helper-conn-{connection.id}",
                         daemon=True).start()

    def _serve_connection(self, connection: _Connection) -> None:
        connection.peer = with_command(connection.peer)  # here, not in `_admit`: the read can block (peer.py)
        who = Client(connection.id, connection.peer)
        greeted = False
        try:
            for line in connection.lines(HELLO_TIMEOUT_S):
                if line is None:
                    connection.error(0, "line-too-long", s.CODES["line-too-long"], "send one request per line")
                    continue
                if not line.strip():
                    continue
                try:
                    request = s.decode_request(line)
                except s.BadRequest as e:
                    connection.error(0, e.code, str(e))
                    continue
                if not greeted and not isinstance(request, s.Hello):
                    connection.error(request.id, "hello-first", s.CODES["hello-first"],
                                     f"send {{\"op\":\"hello\",\"version\":{s.PROTOCOL_VERSION}}}")
                    continue
                if isinstance(request, s.KernelEvents):
                    self._stream_kernel(connection, request)
                    return
                self._answer(connection, who, request)
                greeted = greeted or (isinstance(request, s.Hello) and request.version == s.PROTOCOL_VERSION)
                if greeted:
                    connection.hello_by = None
        except TimeoutError:
            with contextlib.suppress(OSError):
                connection.error(0, "idle", "nothing was asked in time; closing",
                                 "send hello first and a heartbeat every few seconds")
        except OSError:
            pass  # the client went away, or did not read its replies: the same for its changes
        finally:
            with self._lock:
                self._connections.pop(connection.id, None)
            self.service.connection_closed(who)
            with contextlib.suppress(OSError):
                connection.sock.close()

    def _answer(self, connection: _Connection, who: Client, request: s.Request) -> None:
        try:
            result = self.service.handle(who, request)
        except Busy as e:
            hold = e.hold
            holder = s.Holder(hold.peer.uid, hold.peer.pid, hold.purpose or hold.peer.command, hold.since)
            connection.error(request.id, "busy", e.message, e.remedy, holder)
            return
        except TunerError as e:
            connection.error(request.id, code_of(e), e.message, e.remedy)
            return
        except Exception as e:  # noqa: BLE001 - one request's bug must not take the helper down
            self.service._log(f"internal error on {s.op_of(request)}: {type(e).__name__}: {e}")
            connection.error(request.id, "internal", f"the helper failed: {type(e).__name__}: {e}",
                             "report it; the request changed nothing the helper could not put back")
            return
        try:
            connection.send(s.Reply(id=request.id, ok=True, result=result))
        except (TypeError, msgspec.EncodeError) as e:
            connection.error(request.id, "internal", f"the helper could not encode its reply: {e}")

    def _stream_kernel(self, connection: _Connection, request: s.KernelEvents) -> None:
        pci = {d.id: d.pci_slot for d in self.service.devices.values()}
        unknown = [c for c in request.cards if c not in pci]
        if unknown:
            connection.error(request.id, "unknown-card", f"no card {unknown[0]!r}",
                             f"known cards: {', '.join(pci) or 'none'}")
            return

        def gone() -> bool:
            try:
                connection.sock.setblocking(False)
                return connection.sock.recv(1, socket.MSG_PEEK) == b""
            except BlockingIOError:
                return False
            finally:
                connection.sock.setblocking(True)

        def send(line: str, cards: list[str]) -> None:
            connection.send(s.Reply(id=request.id, ok=True, result=s.KernelLine(line, cards)))

        try:
            kmsg.stream(self.kmsg_path, request.cards, pci.get, send, gone, self.stop,
                        opened=lambda: connection.send(s.Reply(id=request.id, ok=True, result=None)))
        except OSError as e:
            with contextlib.suppress(OSError):
                connection.error(request.id, "unsupported", f"cannot read the kernel log {self.kmsg_path}: "
                                 f"{e.strerror}", "check the helper runs as root")


def wait_for_socket(path: Path, timeout_s: float = 10.0) -> bool:
    """True once something accepts connections at `path` (tests and the bench start a helper and wait)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
                return True
            except OSError:
                time.sleep(0.05)
    return False
