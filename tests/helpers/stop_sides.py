"""One side of a stop test, started by name with an exit budget: triton-mp (native gRPC),
its Python gRPC server, its native server relaying every call, or the real Triton 2.51
(``.peers/``; the test is skipped where it is not installed). Used by the stop tests'
``start`` fixtures (tests/e2e/test_r19_stop_unread.py, test_s19_stop_stopped_client.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, peers_env

Server = ServerProcess | RealTriton

RELAYED = "--grpc-restricted-protocol=model-repository:k=v"
"""With a restricted protocol the native server relays every call to the Python one
(ProxyCall), ModelInfer too: a cut relayed call's last ops come after its public side is done
(native ``stop_cut.h``; they aborted the frontend when they found the queue shut)."""

OURS = {
    "triton-mp": (),
    "triton-mp-python": ("--grpc-frontend=python",),
    "triton-mp-relayed": (RELAYED,),
    "triton-mp-spare": ("--frontend-processes", "2", "--frontend-spare=true"),
}
"""triton-mp's sides by name: the flags each adds."""


@contextlib.contextmanager
def side_starter(
    repo: Path, log_dir: Path, exit_timeout_s: float
) -> Iterator[Callable[[str], Server]]:
    """``start(name)`` (``OURS`` or ``triton``) on ``repo`` with ``--exit-timeout-secs``,
    live; every server it started is stopped (by PID) when the block ends."""
    started: list[Server] = []

    def one(name: str) -> Server:
        flag = f"--exit-timeout-secs={exit_timeout_s:g}"
        server: Server
        if name == "triton":
            env = peers_env()
            if env is None:
                pytest.skip("the real Triton 2.51 is not installed (.peers/)")
            server = RealTriton(env, log_dir / "triton.log", f"--model-repository={repo}", flag)
        else:
            server = ServerProcess(repo, log_dir / "ours.log", flag, *OURS[name])
        started.append(server)
        server.wait_live()
        return server

    try:
        yield one
    finally:
        for server in started:
            server.stop()
