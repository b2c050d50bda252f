"""Shared fixtures: tmp repositories, a running server, and leak checks.

Every test is checked for leaked shared-memory objects (``/dev/shm/triton_mp_*`` and
``sem.triton_mp_*``) that it created; every server a test starts is stopped by PID and
process group in the fixture's teardown.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.server import PROJECT_REPOSITORY, ServerProcess, group_alive
from triton_mp.ipc.shm import list_objects


@pytest.fixture(autouse=True)
def _no_leaked_shared_memory() -> Iterator[None]:
    before = set(list_objects())
    yield
    leaked = sorted(set(list_objects()) - before)
    for name in leaked:
        from triton_mp.ipc.shm import unlink_quietly

        unlink_quietly("/" + name.removeprefix("sem."))
    assert not leaked, f"test leaked shared-memory objects: {leaked}"


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Factory: ``start_server(repository, *flags)`` -> a live ``ServerProcess``.

    Every server started is stopped at teardown, and its process group must be gone.
    """
    servers: list[ServerProcess] = []

    def start(repository: Path, *flags: str, wait: bool = True) -> ServerProcess:
        server = ServerProcess(repository, tmp_path / f"server{len(servers)}.log", *flags)
        servers.append(server)
        if wait:
            server.wait_live()
        return server

    yield start
    for server in servers:
        server.stop()
        assert not group_alive(server.pid), f"server {server.pid} left processes behind"


def copy_models(dest: Path, *names: str) -> Path:
    """Copy models of the project's repository into ``dest`` (a new repository)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        src = PROJECT_REPOSITORY / name
        if not (src / "1" / "model.onnx").exists():
            pytest.skip(f"{name} model file is not materialised (pip install --no-deps rapidocr-onnxruntime)")
        shutil.copytree(src, dest / name)
    return dest
