"""Watch the kernel log during a trial, and read the previous boot's log after a crash.

Sources, in order of preference: `journalctl -k -f -n 0 -o short-monotonic` (only messages logged after it
started), then `/dev/kmsg` read from its end. When neither can be read (a container, no permission) the
watcher degrades: it says so once through `warn` and reports nothing, so the trial still runs.

Only lines after `start()` count. A line naming a PCI address that is not the watched card's is ignored.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass

# (kind, regex, edge): edge = the card or machine had to be reset, or fell off the bus
PATTERNS: tuple[tuple[str, str, bool], ...] = (
    ("xid", r"NVRM: Xid", False),
    ("fallen-off-bus", r"fallen off the bus", True),
    ("ring-timeout", r"ring \S+ timeout", False),
    ("job-timeout", r"amdgpu_job_timedout", False),
    ("vram-lost", r"VRAM is lost", True),
    ("gpu-reset", r"GPU reset|ring \S+ reset|device wedged|MODE1 reset|BACO reset", True),
    ("page-fault", r"page fault|Memory access fault", False),
    ("mes-failed", r"MES failed", False),
    ("evict-failed", r"Failed to evict queue|Failed to suspend process|Failed to remove queue", False),
    ("illegal-opcode", r"Illegal opcode in command stream", False),
)
_COMPILED = tuple((kind, re.compile(rx, re.IGNORECASE), edge) for kind, rx, edge in PATTERNS)
_PCI_RE = re.compile(r"\b[0-9a-f]{4,8}:([0-9a-f]{2}:[0-9a-f]{2})(?:\.[0-7])?\b", re.IGNORECASE)
_XID_RE = re.compile(r"Xid \(PCI:([0-9a-f:.]+)\):\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class KernelEvent:
    kind: str
    line: str
    edge: bool
    xid: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def bus_of(pci: str) -> str | None:
    """The bus and device ("03:00") of a PCI address, with or without its domain and function.

    >>> bus_of("0000:03:00.0"), bus_of("0000:2b:00"), bus_of("none")
    ('03:00', '2b:00', None)
    """
    m = _PCI_RE.search(pci)
    return m.group(1).lower() if m else None


def named_buses(line: str) -> set[str]:
    """Every card a kernel-log line names, as `bus_of` gives it (amdgpu's "0000:03:00.0", NVIDIA's Xid
    "PCI:0000:2b:00" without a function number); empty when it names none (a line about the machine)."""
    return {m.group(1).lower() for m in _PCI_RE.finditer(line)}


def classify_line(line: str, pci_bus_id: str | None = None) -> KernelEvent | None:
    """The failure this kernel-log line reports, or None (also None when it names another card).

    >>> classify_line("amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=7, emitted seq=9").kind
    'ring-timeout'
    >>> classify_line("NVRM: Xid (PCI:0000:2b:00): 79, pid=1, GPU has fallen off the bus.").edge
    True
    >>> classify_line("amdgpu 0000:04:00.0: amdgpu: GPU reset begin!", "0000:03:00.0") is None
    True
    """
    for kind, rx, edge in _COMPILED:  # noqa: B007 - the matching row's kind and edge are used after the loop
        if rx.search(line):
            break
    else:
        return None
    if pci_bus_id:
        want = bus_of(pci_bus_id)
        named = named_buses(line)
        if want and named and want not in named:
            return None
    xid = None
    m = _XID_RE.search(line)
    if m:
        xid = int(m.group(2))
        if xid == 79:
            kind, edge = "fallen-off-bus", True
    return KernelEvent(kind, line.strip(), edge, xid)


class KernelLogWatcher:
    """Counts kernel-log failures from `start()` until `stop()`. Thread-safe reads of `events`.

    `on_event(event)` is called from the reader thread for every failure line (set it before `start()`; a trial sets
    it to stop its engine). `source` returns the lines and how to stop reading them (tests feed their own).
    `__slots__`: a misspelt attribute (`watcher._on_event = ...`, which once left a UI stress run deaf to the kernel
    log) is an AttributeError, not a callback nobody calls.
    """

    __slots__ = ("_close", "_events", "_lock", "_source", "_stopping", "_thread", "_warn", "available", "lost",
                 "on_event", "pci_bus_id")

    def __init__(self, pci_bus_id: str | None = None, *, warn: Callable[[str], None] | None = None,
                 on_event: Callable[[KernelEvent], None] | None = None,
                 source: Callable[[], tuple[Iterable[str], Callable[[], None]] | None] | None = None):
        self.pci_bus_id = pci_bus_id
        self._warn = warn or (lambda msg: None)
        self.on_event = on_event  # set after construction by a trial that attributes lines itself
        self._source = source or open_live_source
        self._events: list[KernelEvent] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._close: Callable[[], None] | None = None
        self.available = False
        self.lost: str | None = None  # why the stream ended before stop() (nothing was watched from then on)
        self._stopping = False

    def start(self) -> KernelLogWatcher:
        opened = self._source()
        if opened is None:
            self._warn("cannot read the kernel log (no journalctl access, /dev/kmsg not readable): kernel-level "
                       "GPU errors (Xid, ring timeouts, resets) will not be seen during trials; run as root to "
                       "watch them")
            return self
        lines, self._close = opened
        self.available = True
        self._thread = threading.Thread(target=self._pump, args=(lines,), name="kernel-log", daemon=True)
        self._thread.start()
        return self

    def _pump(self, lines: Iterable[str]) -> None:
        why = "its stream ended"
        try:
            for line in lines:
                self.feed(line)
        except (OSError, ValueError) as e:
            why = f"reading it failed: {getattr(e, 'strerror', None) or e}"
        if not self._stopping:  # ended on its own (journalctl killed, the helper's stream closed): said, not hidden
            self.lost = why
            self._warn(f"the kernel log stopped being readable ({why}): kernel-level GPU errors are no longer seen")

    def feed(self, line: str) -> None:
        """Classify and count one line (for callers that read the log themselves, and tests)."""
        event = classify_line(line, self.pci_bus_id)
        if event is not None:
            with self._lock:
                self._events.append(event)
            if self.on_event:
                self.on_event(event)

    @property
    def events(self) -> list[KernelEvent]:
        with self._lock:
            return list(self._events)

    def stop(self) -> list[KernelEvent]:
        self._stopping = True  # the stream ends because we close it, not because it was lost
        if self._close is not None:
            self._close()
            self._close = None
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        return self.events


class NullWatcher(KernelLogWatcher):
    """For simulated cards: the host's kernel log says nothing about them."""

    __slots__ = ()

    def start(self) -> KernelLogWatcher:
        return self


# --- live sources ---------------------------------------------------------------------------------------------------
LiveSource = tuple[Iterable[str], Callable[[], None]]  # the lines, and how to stop reading them


def _open_journalctl() -> LiveSource | None:
    exe = shutil.which("journalctl")
    if not exe:
        return None
    try:
        proc = subprocess.Popen([exe, "-k", "-f", "-n", "0", "-o", "short-monotonic", "--no-pager", "-q"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, errors="replace")
    except OSError:
        return None
    # journalctl exits at once when it cannot read the journal (no permission, no journald)
    time.sleep(0.2)
    if proc.poll() is not None:
        return None

    def close() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    assert proc.stdout is not None  # stdout=PIPE
    return (line.rstrip("\n") for line in proc.stdout), close


def _open_kmsg() -> LiveSource | None:
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        os.lseek(fd, 0, os.SEEK_END)  # only records from now on
        os.read(fd, 8192)  # probe readability (EAGAIN when nothing new: fine)
    except BlockingIOError:
        pass
    except OSError:
        os.close(fd)
        return None
    closed = threading.Event()

    def close() -> None:
        closed.set()
        try:
            os.close(fd)
        except OSError:
            pass

    return kmsg_lines(fd, closed), close


_KMSG_HEADER = re.compile(rb"^\d+,\d+,\d+,[^;]*;")


def kmsg_lines(fd: int, stop: threading.Event, gone: Callable[[], bool] = lambda: False) -> Iterator[str]:
    """The kernel log's lines read from `fd` until `stop` is set or `gone()`. `/dev/kmsg` returns one record per
    read (`pri,seq,usec,flags;text`, then indented key=value lines, which are skipped); a FIFO standing in for it
    in a test may return several lines at once, so reads are split on newlines. Records overwritten before they
    were read (EPIPE) are passed over; any other OSError is raised."""
    pending = b""
    while not stop.is_set() and not gone():
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 8192)
        except BlockingIOError:
            continue
        except OSError as e:
            if e.errno == 32:  # EPIPE: records were overwritten before we read them; go on
                continue
            raise
        if not chunk:  # a FIFO whose writer closed: wait for the next one
            stop.wait(0.1)
            continue
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            if raw and raw[:1] not in (b" ", b"\t"):
                yield _KMSG_HEADER.sub(b"", raw).decode("utf-8", "replace")


def open_live_source() -> LiveSource | None:
    """(lines, close) from journalctl or /dev/kmsg, or None when the kernel log cannot be read."""
    return _open_journalctl() or _open_kmsg()


# --- after a crash ----------------------------------------------------------------------------------------------------
def previous_boot_events(pci_bus_id: str | None = None, *,
                         run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> list[str] | None:
    """The last 20 GPU failure lines from the previous boot's kernel log (`journalctl -k -b -1`), or None when
    unavailable (no persistent journal, no permission)."""
    exe = shutil.which("journalctl")
    if not exe:
        return None
    try:
        proc = run([exe, "-k", "-b", "-1", "-o", "short-monotonic", "--no-pager", "-q"],
                   capture_output=True, text=True, errors="replace", timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    lines = [ev.line for ev in (classify_line(ln, pci_bus_id) for ln in proc.stdout.splitlines()) if ev]
    return lines[-20:]


def summarize(events: Iterable[KernelEvent]) -> str:
    events = list(events)
    if not events:
        return ""
    kinds = ", ".join(dict.fromkeys(e.kind for e in events))
    return f"kernel log: {kinds}: {events[0].line[:160]}"
