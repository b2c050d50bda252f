"""A socket object over a descriptor this code does not own, for acting on the socket itself
(``shutdown(2)``, ``getsockname``) without closing the owner's descriptor."""

from __future__ import annotations

import os
import socket


def socket_over(fd: int) -> socket.socket | None:
    """A ``socket.socket`` over a duplicate of ``fd``; closing it (``with``) closes only the
    duplicate. None when ``fd`` is closed or is not a socket. ``shutdown`` through it acts on
    the socket itself, so on every descriptor of it."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None  # NOTE: closed meanwhile
    try:
        return socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
