"""Who is on the other end of a unix socket: the kernel's answer (SO_PEERCRED, SO_PEERGROUPS), never the client's.

The socket's mode (0660, root and the helper's group) already keeps others from connecting; this is the second
check, for a socket handed over with other permissions (systemd activation) or a path someone loosened.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, replace
from pathlib import Path

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13; Python names it from 3.x on some builds
_UCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups at connect time
    command: str  # its command line (from /proc, printable, shortened): named in `busy` replies and the log

    def member_of(self, gid: int) -> bool:
        return self.uid == 0 or self.gid == gid or gid in self.groups


def peer_of(sock: socket.socket) -> Peer:
    """The kernel's credentials of the peer, at once; its command is "?" until `with_command` reads it (that read
    can block, see there)."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * 256)
        groups = struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])
    except OSError:  # ERANGE: more than 256 groups; or an old kernel: fall back to the primary group only
        groups = ()
    return Peer(pid, uid, gid, tuple(groups), "?")


def with_command(peer: Peer) -> Peer:
    """`peer` with its command line. Call it on the connection's own thread, never the accept loop: reading
    /proc/<pid>/cmdline copies it out of that process's memory under its mmap lock (fs/proc/base.c get_mm_cmdline
    -> access_remote_vm), which can wait as long as the process keeps the lock (stuck on a hung FUSE or NFS
    mapping, or arranged by a hostile client)."""
    return replace(peer, command=command_of(peer.pid))


def command_of(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    parts = [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]
    if parts:
        parts[0] = parts[0].rsplit("/", 1)[-1]
    text = " ".join(parts)
    return "".join(ch if ch.isprintable() else "?" for ch in text)[:120] or "?"
