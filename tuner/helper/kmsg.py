"""The kernel-event stream: the helper reads the kernel log (root-only where `dmesg_restrict=1`) for its clients.

A client asks for its cards; it gets the lines that name one of them (by PCI address, as
`tuner.tuning.kernel_log.named_buses` reads it) and GPU failure lines that name no card at all (a machine-wide
reset), nothing else: the rest of the kernel log stays as private as `dmesg_restrict` makes it. Only records
logged after the request count (the log is read from its end, with `tuner.tuning.kernel_log.kmsg_lines`).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from tuner.tuning.kernel_log import bus_of, classify_line, kmsg_lines, named_buses

DEFAULT_KMSG = Path("/dev/kmsg")


def select_line(text: str, buses: dict[str, str]) -> list[str] | None:
    """The cards (ids) a line is for, [] for a GPU failure naming no card, None when it is not for this client.

    >>> buses = {"03:00": "0000:03:00.0"}
    >>> select_line("amdgpu 0000:03:00.0: amdgpu: GPU reset begin!", buses)
    ['0000:03:00.0']
    >>> select_line("amdgpu 0000:04:00.0: amdgpu: GPU reset begin!", buses) is None
    True
    >>> select_line("usb 1-1: new high-speed USB device", buses) is None
    True
    """
    named = named_buses(text)
    if named:
        cards = sorted(buses[b] for b in named if b in buses)
        return cards or None
    return [] if classify_line(text) is not None else None


def stream(path: Path, cards: list[str], pci_of: Callable[[str], str | None], send: Callable[[str, list[str]], None],
           client_gone: Callable[[], bool], stop: threading.Event, opened: Callable[[], None]) -> None:
    """Send the lines for `cards` until the client goes, `send` fails (OSError) or `stop` is set. OSError when
    the log cannot be opened; `opened()` once it is (the stream's acknowledgement: a client told of a stream the
    helper cannot read would not read the log itself)."""
    buses = {bus: card for card in cards if (pci := pci_of(card)) and (bus := bus_of(pci))}
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        opened()
        if stat.S_ISCHR(os.fstat(fd).st_mode):
            os.lseek(fd, 0, os.SEEK_END)  # only records from now on
        for text in kmsg_lines(fd, stop, client_gone):
            chosen = select_line(text, buses)
            if chosen is not None:
                send(text, chosen)
    finally:
        os.close(fd)
