"""End to end: the response cache in a real Redis server (``--cache-config redis,...``).

Each test starts its own ``redis-server`` (Debian's package; ``.ci/run`` installs it) on a
free port, by PID, and skips where it is absent. triton-mp runs two frontends against it:
a repeated request is a hit on every connection and the entry is in Redis; when Redis stops,
requests are still answered (uncached, each one executed) and the failures are logged with
the redis cache's words; once Redis is back, caching resumes; and a server whose Redis cannot
be reached at start fails to start with Triton's message. (The real Triton's peers here ship
only the local cache library, so there is no Triton side to this file.)
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from tests.e2e.test_response_cache import CONFIG, SOURCE, _grpc_infer, _stats
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REDIS_SERVER = shutil.which("redis-server")


class RedisServer:
    """``redis-server`` on 127.0.0.1:``port``, no persistence; ``stop`` and ``start`` again."""

    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self._log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        cmd = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        cmd += ["--appendonly", "no"]
        with open(self._log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port)
        try:
            wait_for(lambda: _pings(client), 20, "redis-server to answer")
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    server = RedisServer(free_port(), tmp_path / "redis.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_python_model(repo, "cached_add", CONFIG + "response_cache { enable: true }\n", SOURCE)
    return repo


def _flags(port: int) -> tuple[str, ...]:
    return ("--cache-config=redis,host=127.0.0.1", f"--cache-config=redis,port={port}")


def test_entries_live_in_redis_and_survive_it_being_stopped(
    redis_server: RedisServer, start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start_server(_repo(tmp_path), *_flags(redis_server.port), "--frontend-processes=2")
    x = np.arange(64, dtype=np.float32)
    for _ in range(6):
        np.testing.assert_array_equal(_grpc_infer(server.url, "cached_add", x), x + 1)
    st = _stats(server.url, "cached_add")
    assert (st["exec"], st["miss"], st["hit"]) == (1, 1, 5)
    client = redis.Redis(port=redis_server.port)
    try:
        assert client.dbsize() == 1
    finally:
        client.close()

    redis_server.stop()
    for _ in range(3):
        np.testing.assert_array_equal(_grpc_infer(server.url, "cached_add", x), x + 1)
    down = _stats(server.url, "cached_add")
    assert down["exec"] == st["exec"] + 3, "with Redis down every request executes"
    assert down["hit"] == st["hit"]
    wait_for(lambda: "Failed to retrieve key: " in server.log(), 10, "the lookup error logged")

    redis_server.start()  # empty again: no persistence
    time.sleep(1.2)  # the store pauses 1 s after a failure (redis_cache.RETRY_AFTER_S)
    for _ in range(3):
        np.testing.assert_array_equal(_grpc_infer(server.url, "cached_add", x), x + 1)
    back = _stats(server.url, "cached_add")
    assert back["exec"] == down["exec"] + 1, "caching resumed: one miss, then hits"
    assert back["hit"] == down["hit"] + 2
    assert server.proc.poll() is None


def test_a_server_whose_redis_is_down_at_start_fails_with_triton_s_message(
    tmp_path: Path,
) -> None:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    server = ServerProcess(_repo(tmp_path), tmp_path / "server.log", *_flags(free_port()))
    try:
        code = server.proc.wait(timeout=120)
    finally:
        server.stop()
    assert code != 0
    assert "Failed to initialize RedisCache: " in server.log()
