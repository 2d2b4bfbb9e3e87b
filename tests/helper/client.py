"""A raw client of the helper, run as a test user (setpriv): sends JSON lines, prints each reply line.

`python -m tests.helper.client SOCKET LINE...` where LINE is a JSON request (sent as is) or `@hold` (print
HOLDING, then wait forever: the test kills it). A socket this user may not open prints `REFUSED <errno name>`
and exits 3; a helper that closes the connection prints `CLOSED`.
"""

from __future__ import annotations

import errno
import socket
import sys
import time

if __name__ == "__main__":
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(sys.argv[1])
    except OSError as e:
        print(f"REFUSED {errno.errorcode.get(e.errno or 0, e)}", flush=True)
        sys.exit(3)
    reader = sock.makefile("rb")
    for line in sys.argv[2:]:
        if line == "@hold":
            print("HOLDING", flush=True)
            while True:
                time.sleep(60)
        try:
            sock.sendall(line.encode() + b"\n")
        except OSError:
            pass  # the helper already closed the connection: read what it said before
        try:
            reply = reader.readline()
        except OSError:
            reply = b""
        print(reply.decode().strip() if reply else "CLOSED", flush=True)
