"""The root helper's client: a Backend that asks `tuner-helper` over its socket instead of writing sysfs or NVML.

Every command and screen works unchanged through it: each Backend call is one request of the helper's closed
list (`tuner/helper/schema.py`), each refusal comes back as the TunerError (and exit code) the in-process tuner
raises. The helper puts back any change that is not confirmed (`keep`) when its lease runs out or this
connection closes, so a heartbeat thread renews the leases while the connection is open: a `kill -9` of the
tuner puts the previous value back at once, a tuner that stops answering (stopped, hung) loses its changes after
the lease, and its next write or reset says so (`LeaseLost`) instead of measuring a setting that is gone.

`ReadOnlyBackend` is what a user gets when no helper lets them in: the in-process backend for reading (sysfs,
NVML queries work as any user), and every write refused with exit code 9 and how to get in.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from tuner.backends.base import Backend, ForwardingBackend, KernelLogSource
from tuner.core import exit_codes
from tuner.core.errors import NotApplied, OutOfRange, TunerError, Unsupported, UsageError
from tuner.core.models import Capabilities, DeviceInfo, Knob, StressTarget, Telemetry
from tuner.helper import schema as s

DEFAULT_LEASE_S = 10.0  # a tuner that stops answering loses its unconfirmed changes after this long
HEARTBEAT_S = 2.0
CONNECT_TIMEOUT_S = 5.0
REPLY_TIMEOUT_S = 120.0  # a write may wait on the driver (NVML), never on another client
HELLO_TIMEOUT_S = 10.0  # a hello touches no card (it reads the caller's few state files): silence is no helper
INSTALL_REMEDY = ("install the root helper (docs/helper.md: `tuner-helper` behind /run/tuner/helper.sock) and join "
                  "its group, or run as root")


class HelperUnreachable(TunerError):
    """A write needs the root helper and none answers, or it does not let this user in; nothing was changed."""

    exit_code = exit_codes.HELPER_UNREACHABLE


class HelperRefused(HelperUnreachable):
    """The helper is there but this user may not ask it (not root, not in its group)."""


class LeaseLost(NotApplied):
    """The helper put a card back while this tuner was not answering: what ran meanwhile ran at another value."""


_ERRORS: dict[str, type[TunerError]] = {
    **s.ERRORS, "overvolt-not-allowed": OutOfRange, "not-allowed": HelperRefused, "version": HelperUnreachable,
    "too-many": HelperUnreachable, "idle": HelperUnreachable, "internal": HelperUnreachable,
}


class HelperConnection:
    """One socket to the helper: a request, then its reply, one at a time (any thread)."""

    def __init__(self, sock: socket.socket, path: Path):
        self.sock, self.path = sock, path
        self._reader = sock.makefile("rb")
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.lost: str | None = None  # why the connection is gone

    @classmethod
    def open(cls, path: Path) -> HelperConnection:
        """Raises OSError (ENOENT, ECONNREFUSED: no helper; EACCES: not in its group)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(str(path))
        except OSError:
            sock.close()
            raise
        sock.settimeout(REPLY_TIMEOUT_S)
        return cls(sock, path)

    def ask(self, request: s.Request, result_type: Any = Any) -> Any:
        with self._lock:
            if self.lost is not None:
                raise HelperUnreachable(f"the helper at {self.path} is gone ({self.lost}); any unconfirmed change "
                                        "was put back", "run the command again")
            request.id = next(self._ids)
            try:
                self.sock.sendall(s.encode(request))
                while True:
                    reply = msgspec.json.decode(self.read_line(), type=s.RawReply)
                    if reply.id in (request.id, 0):
                        break
                # a result not of the request's type is a broken reply too (another program or protocol on the
                # socket), not a traceback
                result = msgspec.json.decode(reply.result, type=result_type) if reply.ok else None
            except (OSError, msgspec.DecodeError) as e:
                self.lost = str(e) or type(e).__name__
                with contextlib.suppress(OSError):  # the helper sees it closed and puts back now, not at the lease
                    self.sock.shutdown(socket.SHUT_RDWR)
                raise HelperUnreachable(f"lost the helper at {self.path} ({self.lost}); any unconfirmed change "
                                        "was put back", "check `systemctl status tuner-helper`, then run the command "
                                        "again") from None
        if not reply.ok:
            # the in-process tuner's class for this refusal, so the same exit code; a refusal without words (another
            # version, another program on the socket) still says what was refused and where the helper says why
            code = f" ({reply.code})" if reply.code else ""
            raise _ERRORS.get(reply.code, UsageError)(
                reply.error or f"the helper refused {s.op_of(request)} without a reason{code}",
                reply.remedy or (None if reply.error else "see its log: `journalctl -u tuner-helper`"))
        return result

    def read_line(self) -> bytes:
        """The next reply line; OSError when the connection closed, msgspec.DecodeError when the line is longer than
        any the helper sends (read no further: a program on the socket could send without end)."""
        line = self._reader.readline(s.MAX_REPLY_BYTES + 1)
        if not line:
            raise ConnectionResetError("the helper closed the connection")
        if len(line) > s.MAX_REPLY_BYTES:
            raise msgspec.DecodeError(f"a reply line longer than {s.MAX_REPLY_BYTES} bytes")
        return line

    def close(self) -> None:
        self.lost = self.lost or "closed"
        with contextlib.suppress(OSError):
            self._reader.close()
            self.sock.close()


def connect(path: Path, *, client: str = "tuner") -> tuple[HelperConnection, s.HelloResult]:
    """A greeted connection; HelperRefused (not let in) or HelperUnreachable (nobody answers) otherwise."""
    try:
        connection = HelperConnection.open(path)
    except PermissionError:
        raise HelperRefused(f"the helper at {path} does not let this user in (not in its group)",
                            "ask an admin: `sudo usermod -aG tuner $USER`, then log in again") from None
    except OSError as e:
        raise HelperUnreachable(f"no helper answers at {path} ({e.strerror or e})", INSTALL_REMEDY) from None
    # the command line names the client, and a file name's non-UTF-8 byte is a lone surrogate in argv, which no JSON
    # line carries: written as its escape, within the wire's Text
    client = client.encode("utf-8", "backslashreplace").decode()[:s.MAX_TEXT_CHARS]
    try:
        connection.sock.settimeout(HELLO_TIMEOUT_S)
        hello: s.HelloResult = connection.ask(s.Hello(version=s.PROTOCOL_VERSION, client=client), s.HelloResult)
        connection.sock.settimeout(REPLY_TIMEOUT_S)
    except BaseException:
        connection.close()
        raise
    return connection, hello


_ID_BYTES = 16  # `ask` numbers the request after it is fitted: room for the digits of its id (at most 2**53)


def _fitted(request: s.TrialEnd) -> s.TrialEnd:
    """`request` within the helper's line limit, which refuses a longer line unread: a mark's own limits (a reason
    and 20 kernel lines of 500 characters each) add up to more. The oldest kernel lines go first, then the end of
    the reason; the setting, the kind and the newest lines always reach the machine's list (this user's own list
    keeps everything)."""
    while request.unsafe is not None and len(s.encode(request)) + _ID_BYTES > s.MAX_REQUEST_BYTES:
        mark = request.unsafe
        if mark.kernel_log:
            mark = msgspec.structs.replace(mark, kernel_log=mark.kernel_log[1:])
        else:
            mark = msgspec.structs.replace(mark, reason=mark.reason[: len(mark.reason) // 2])
        request = msgspec.structs.replace(request, unsafe=mark)
    return request


class HelperBackend(Backend):
    """Every Backend call as a request to the helper. Also the helper-only calls the tuner's journal wiring
    needs: claim/release, trial_begin/trial_end, recovered_trials, unsafe_entries/unsafe_clear, kernel_log_source."""

    def __init__(self, connection: HelperConnection, hello: s.HelloResult, *, lease_s: float = DEFAULT_LEASE_S,
                 warn: Callable[[str], None] | None = None):
        self.connection, self.hello, self.lease_s = connection, hello, lease_s
        self.name, self.simulated = hello.backend, hello.simulated
        self._warn = warn or (lambda message: None)
        self._cards = {e.info.id: e for e in connection.ask(s.ListCards(), list[s.CardEntry])}
        self._lost: dict[str, s.LostChange] = {}
        self._open_trials: set[str] = set()  # cards with a trial this connection began and has not ended
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="helper-heartbeat", daemon=True)
        self._heartbeat.start()

    @classmethod
    def connect(cls, path: Path, *, client: str = "tuner", lease_s: float = DEFAULT_LEASE_S,
                warn: Callable[[str], None] | None = None) -> HelperBackend:
        connection, hello = connect(path, client=client)
        try:
            return cls(connection, hello, lease_s=lease_s, warn=warn)
        except BaseException:
            connection.close()
            raise

    def _ask(self, request: s.Request, result_type: Any = Any) -> Any:
        return self.connection.ask(request, result_type)

    def _beat(self) -> None:
        while not self._stop.wait(min(HEARTBEAT_S, self.lease_s / 4)):
            try:
                lost = self._ask(s.Heartbeat(), s.HeartbeatResult).lost
            except TunerError:
                return  # the next call says the helper is gone
            for change in lost:
                self._lost[change.card] = change
                self._warn(f"the helper put {change.card} back: {change.reason}")

    def _check_lost(self, device_id: str) -> None:
        change = self._lost.pop(device_id, None)
        if change is not None:
            raise LeaseLost(f"the helper put {device_id} back while this tuner was not answering ({change.reason}); "
                            "what ran meanwhile ran at another value", "run it again")

    # --- Backend ------------------------------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return [e.info for e in self._cards.values()]

    def knob(self, device_id: str) -> Knob:
        return self._ask(s.ReadKnob(card=device_id), Knob)

    def telemetry(self, device_id: str) -> Telemetry:
        return self._ask(s.ReadTelemetry(card=device_id), Telemetry)

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        self._check_lost(device_id)
        return self._ask(s.Set(card=device_id, value=value, lease_s=self.lease_s, allow_overvolt=allow_overvolt),
                         Knob)

    def revert(self, device_id: str, value: int) -> Knob:
        """The helper puts back what this connection's change found (HelperService._op_set), a stock value too: a
        Reset would write stock over the state found (NVIDIA: another tool's P2-only offset, which the knob, P0's,
        reads as stock). A change the helper put back already (its lease) is not written again, and its loss is
        this revert's own outcome, not news for a later write."""
        self._lost.pop(device_id, None)
        return self._ask(s.Set(card=device_id, value=value, lease_s=self.lease_s, allow_overvolt=True, revert=True),
                         Knob)

    def reset(self, device_id: str, *, force: bool = False) -> Knob:
        knob = self._ask(s.Reset(card=device_id, force=force), Knob)
        self._check_lost(device_id)
        return knob

    def keep(self, device_id: str) -> None:
        self._check_lost(device_id)
        self._ask(s.Confirm(card=device_id))

    def capabilities(self, device_id: str) -> Capabilities:
        entry = self._cards[self.device(device_id).id]  # UnknownDevice with the known ids
        if entry.capabilities is None:
            raise Unsupported(entry.error or f"{device_id} cannot be driven")
        return entry.capabilities

    def stress_target(self, device_id: str) -> StressTarget:
        return self._ask(s.ReadTarget(card=device_id), StressTarget)

    def note_load(self, device_id: str, active: bool) -> None:
        self._ask(s.NoteLoad(card=device_id, active=active))

    def foreign_state(self, device_id: str) -> str | None:
        return self._ask(s.ReadState(card=device_id), s.CardState).foreign_state

    def applied_pstates(self, device_id: str) -> tuple[int, ...] | None:
        return self._ask(s.ReadState(card=device_id), s.CardState).applied_pstates

    def set_lock_clock(self, device_id: str, mhz: int) -> None:
        self._ask(s.LockClock(card=device_id, mhz=mhz), s.LockResult)

    def lock_at_measured_clock(self, device_id: str, clock_mhz: float) -> int | None:
        if self.knob(device_id).lock_clock_mhz is None:
            return None
        return self._ask(s.LockClock(card=device_id, measured_mhz=clock_mhz), s.LockResult).mhz

    def persistence_off(self, device_id: str) -> bool:
        return self._ask(s.Persistence(card=device_id), s.PersistenceResult).off

    def enable_persistence(self, device_id: str) -> None:
        self._ask(s.Persistence(card=device_id, enable=True), s.PersistenceResult)

    def close(self) -> None:
        self._stop.set()
        self.connection.close()  # the helper puts back whatever is still unconfirmed

    # --- the safety state: the helper's machine-wide one (Backend's docstring; docs/helper.md) --------------------
    def claim(self, device_id: str, purpose: str = "") -> None:
        """The helper's hold, machine-wide (another user's writes are refused as busy between a bisect's trials),
        inside this tuner's own lock (Backend.claim: two jobs of one tuner share this connection, which the helper
        cannot tell apart)."""
        super().claim(device_id, purpose)
        try:
            self._ask(s.Claim(card=device_id, purpose=purpose[:s.MAX_TEXT_CHARS]))
        except BaseException:
            super().release(device_id)
            raise

    def release(self, device_id: str) -> None:
        try:
            self._ask(s.Release(card=device_id))
        finally:
            super().release(device_id)

    def trial_begin(self, device_id: str, setting: int, phase: str, session: str | None = None) -> None:
        self._ask(s.TrialBegin(card=device_id, setting=setting, phase=phase, session=session), s.OpenTrial)
        self._open_trials.add(device_id)

    def trial_end(self, device_id: str, unsafe: Any = None) -> None:
        """Ends this connection's open trial on the card; a second end of the same trial (the journal closes it
        after a hard failure already ended it with its mark) does nothing."""
        if device_id not in self._open_trials:
            return
        self._ask(_fitted(s.TrialEnd(card=device_id, unsafe=unsafe)))
        self._open_trials.discard(device_id)

    def recovered_trials(self, device_id: str) -> list[Any]:
        return list(self._ask(s.ReadTrials(card=device_id), s.TrialsResult).recovered)

    def unsafe_entries(self, device_id: str) -> list[dict[str, Any]]:
        return [msgspec.structs.asdict(e) for e in self._ask(s.UnsafeList(card=device_id), list[s.UnsafeEntry])]

    def unsafe_clear(self, device_id: str, setting: int | None = None) -> list[dict[str, Any]]:
        removed = self._ask(s.UnsafeClear(card=device_id, setting=setting), list[s.UnsafeEntry])
        return [msgspec.structs.asdict(e) for e in removed]

    def kernel_log_source(self, device_ids: list[str]) -> KernelLogSource | None:
        """A `tuner.tuning.kernel_log.KernelLogWatcher` source: the helper's kernel-event stream for these cards
        (on its own connection), or None when the helper cannot read the kernel log."""
        try:
            connection, _ = connect(self.connection.path, client="tuner kernel-events")
        except TunerError:
            return None
        try:
            connection.ask(s.KernelEvents(cards=list(device_ids)))
        except BaseException as e:
            connection.close()  # a refused stream's socket: not left to the collector, nor held as one of the user's 16
            if isinstance(e, TunerError):
                return None
            raise
        # a kernel that logs nothing about the card for minutes is the usual case, not a lost helper: the stream
        # waits for its next line until `close` (the reply timeout would end it, and the watcher say it is lost)
        connection.sock.settimeout(None)

        def lines() -> Iterator[str]:
            with contextlib.suppress(OSError, ValueError):
                while True:
                    reply = msgspec.json.decode(connection.read_line(), type=s.RawReply)
                    if reply.ok:
                        yield msgspec.json.decode(reply.result, type=s.KernelLine).line

        def close() -> None:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
            connection.close()

        return lines(), close


class ReadOnlyBackend(ForwardingBackend):
    """The in-process backend for reading, every write refused (exit 9) with why and how to get in."""

    def __init__(self, inner: Backend, reason: str, remedy: str = INSTALL_REMEDY):
        self.inner, self.reason, self.remedy = inner, reason, remedy
        self.name, self.simulated = inner.name, inner.simulated

    def _to(self, device_id: str) -> Backend:
        return self.inner

    def _refuse(self) -> HelperUnreachable:
        return HelperUnreachable(f"writes go through the root helper and {self.reason}; nothing was changed",
                                 self.remedy)

    def devices(self) -> list[DeviceInfo]:
        return self.inner.devices()

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        raise self._refuse()

    def reset(self, device_id: str, *, force: bool = False) -> Knob:
        raise self._refuse()

    def revert(self, device_id: str, value: int) -> Knob:
        raise self._refuse()

    def set_lock_clock(self, device_id: str, mhz: int) -> None:
        raise self._refuse()

    def lock_at_measured_clock(self, device_id: str, clock_mhz: float) -> int | None:
        raise self._refuse()

    def enable_persistence(self, device_id: str) -> None:
        raise self._refuse()

    def close(self) -> None:
        self.inner.close()
