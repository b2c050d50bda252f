"""``frontend.grpc.connection_cut.cut_connections``: the gRPC stop's last resort shuts down
exactly this process's connected TCP sockets on the given local port (the server side of
each connection), never the listener, a client socket whose peer is that port, or a socket
on another port."""

from __future__ import annotations

import socket

from triton_mp.frontend.grpc.connection_cut import cut_connections


def test_cuts_the_connections_accepted_on_the_port_only() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_server(("127.0.0.1", 0)) as other,
    ):
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        accepted, _ = listener.accept()
        other_client = socket.create_connection(("127.0.0.1", other.getsockname()[1]), timeout=5)
        other_accepted, _ = other.accept()
        with client, accepted, other_client, other_accepted:
            assert cut_connections(port) == 1
            assert client.recv(1) == b""  # NOTE: the server side was shut down: EOF
            other_accepted.sendall(b"x")  # NOTE: the other port's connection still works
            assert other_client.recv(1) == b"x"
            accepted_copy = socket.create_connection(("127.0.0.1", port), timeout=5)
            with accepted_copy:
                late, _ = listener.accept()  # NOTE: the listener was left alone
                late.close()
