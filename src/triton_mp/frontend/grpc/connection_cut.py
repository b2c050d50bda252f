"""The gRPC stop's last resort for connections grpc cannot close: a TCP connection whose client
stopped reading while the server wrote to it (a stopped or wedged client process).

Its socket's send buffer is full, so grpc's write on it never ends, and grpc closes a transport
(and ends its cancelled calls) only once the write in progress ends: the server's stop, even
its cancelling one, then waits forever, and the supervisor kills the frontend past the exit
budget (r25's Bug B, session 19). Once the budget is spent and the stop still waits, every TCP
connection this process has on the public port is shut down with shutdown(2): the stuck write
fails, grpc closes the transport, and the stop returns. Its unsent bytes were answers the
client never got, so a cut counts as cutting calls (``ipc.handshake.CALLS_CUT_EXIT``).

Native twin: ``frontend/native/connection_cut.h`` (the native server's stop, the same rule).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat

from triton_mp.common.process.fd_sockets import socket_over

CUT_AFTER_S = 0.5
"""How long after the budget the cut comes, seconds: grpc's own cancel at the budget closes
every connection whose writes can go on in well under this (the native one's kAfterDeadlineS)."""


def cut_connections(port: int) -> int:
    """Shut down (both directions) every connected TCP socket of this process whose local
    port is ``port``; returns how many. The listening socket (no peer) is left alone, and so
    is every other descriptor (read through a duplicate, closed again)."""
    cut = 0
    for name in os.listdir("/proc/self/fd"):
        if not name.isdigit():
            continue
        try:
            if not stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                continue
        except OSError:
            continue  # NOTE: closed meanwhile (listdir's own descriptor among them)
        sock = socket_over(int(name))
        if sock is None:
            continue
        with sock, contextlib.suppress(OSError):
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if sock.getsockname()[1] != port:
                continue
            sock.getpeername()  # NOTE: raises for the listener: not connected
            sock.shutdown(socket.SHUT_RDWR)  # NOTE: the socket's, through any descriptor
            cut += 1
    return cut
