"""The Redis store's behaviour when Redis fails (``frontend.cache.redis_store``): a fake client,
a fake clock, no server."""

from __future__ import annotations

import logging

import pytest
import redis

from triton_mp.frontend.cache.redis_store import RETRY_AFTER_S, RedisStore, client_options


class FlakyClient:
    """hget/hset on a dict, raising ConnectionError while ``down``."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.down = False
        self.calls = 0

    def hget(self, key: str, field: str) -> bytes | None:
        self.calls += 1
        if self.down:
            raise redis.ConnectionError("Connection refused")
        return self.data.get(key + field)

    def hset(self, key: str, field: str, value: bytes) -> int:
        self.calls += 1
        if self.down:
            raise redis.ConnectionError("Connection refused")
        self.data[key + field] = value
        return 1


def test_a_failing_redis_is_a_miss_logged_then_left_alone_for_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    client = FlakyClient()
    store = RedisStore(client, clock_s=lambda: now[0])  # type: ignore[arg-type]
    key = bytes(range(16))
    assert store.insert(key, b"entry")
    assert store.lookup(key) == b"entry"
    client.down = True
    with caplog.at_level(logging.ERROR):
        assert store.lookup(key) is None
    assert f"Failed to retrieve key: {key.hex()}. Connection refused" in caplog.text
    calls = client.calls
    assert store.lookup(key) is None
    assert not store.insert(key, b"x")
    assert client.calls == calls, "paused: Redis is not asked again at once"
    client.down = False
    now[0] += RETRY_AFTER_S
    assert store.lookup(key) == b"entry"


def test_client_options_follow_the_redis_cache_s_keys() -> None:
    opts = client_options(
        {"host": "h", "port": "7000", "db": "2", "socket_timeout": "250", "pool_size": "4"}
    )
    assert (opts["host"], opts["port"], opts["db"], opts["max_connections"]) == ("h", 7000, 2, 4)
    assert opts["socket_timeout"] == 0.25
    assert opts["socket_connect_timeout"] == 1.0, "0/unset becomes the 1 s default"
    tls = client_options({"host": "h", "port": "1", "tls_enabled": "true", "cacert": "/ca"})
    assert tls["ssl"] is True
    assert tls["ssl_ca_certs"] == "/ca"
