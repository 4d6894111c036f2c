"""A connection flood against one address, run as its own process by test_flood.py.

``python flood_main.py HOST PORT COUNT HOLD_SECONDS`` opens COUNT connections
without blocking, in four kinds (by index mod 4), holds them HOLD_SECONDS
after the last one is open, prints a summary line and exits (closing them):

* silent: connect and send nothing;
* partial: send the start of a message (a length prefix announcing 100 bytes
  and 10 of them), then nothing;
* half-closed: send the same start, then shut down the writing side;
* slow: announce a 4,000-byte message and dribble it, one byte per 0.5 s.

Only the standard library: it must not share the test process's descriptors
or its GIL, and it raises its own open-files limit to hold them all.
"""

from __future__ import annotations

import errno
import resource
import selectors
import socket
import struct
import sys
import time

host, port, count, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = count + 256
if soft != resource.RLIM_INFINITY and soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))

START = struct.pack(">I", 100) + b"\x00" * 10
SLOW = struct.pack(">I", 4000)
selector = selectors.DefaultSelector()
socks: list[socket.socket] = []
slow: list[socket.socket] = []
for i in range(count):
    s = socket.socket()
    s.setblocking(False)
    code = s.connect_ex((host, port))
    if code not in (0, errno.EINPROGRESS):
        s.close()
        continue
    socks.append(s)
    selector.register(s, selectors.EVENT_WRITE, i % 4)
opened = time.monotonic()
connected = refused = 0
next_drip = opened
deadline = opened + hold
while time.monotonic() < deadline:
    for key, _ in selector.select(timeout=0.05):
        s, kind = key.fileobj, key.data
        selector.unregister(s)
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            refused += 1
            continue
        connected += 1
        try:
            if kind in (1, 2):
                s.send(START)
            if kind == 2:
                s.shutdown(socket.SHUT_WR)
            if kind == 3:
                s.send(SLOW)
                slow.append(s)
        except OSError:  # already closed by the other side
            pass
    if time.monotonic() >= next_drip:
        next_drip += 0.5
        for s in slow:
            try:
                s.send(b"\x00")
            except OSError:
                pass
print(f"opened {len(socks)} connected {connected} refused {refused}", flush=True)
for s in socks:
    s.close()
