"""``common.process.fd_sockets.socket_over``: a socket over a descriptor someone else owns."""

from __future__ import annotations

import os
import socket

from triton_mp.common.process.fd_sockets import socket_over


def test_closing_the_view_leaves_the_owners_descriptor_open() -> None:
    a, b = socket.socketpair()
    with a, b:
        view = socket_over(a.fileno())
        assert view is not None
        with view:
            assert view.fileno() != a.fileno()
        a.sendall(b"x")  # NOTE: the owner's descriptor still works
        assert b.recv(1) == b"x"


def test_shutdown_through_the_view_reaches_the_socket() -> None:
    a, b = socket.socketpair()
    with a, b:
        view = socket_over(a.fileno())
        assert view is not None
        with view:
            view.shutdown(socket.SHUT_RDWR)
        assert b.recv(1) == b""  # NOTE: the peer sees the end


def test_a_closed_descriptor_or_a_file_is_none() -> None:
    a, b = socket.socketpair()
    fd = a.fileno()
    a.close()
    b.close()
    assert socket_over(fd) is None
    r, w = os.pipe()
    try:
        assert socket_over(r) is None
        os.fstat(r)  # NOTE: the pipe itself is untouched
    finally:
        os.close(r)
        os.close(w)
