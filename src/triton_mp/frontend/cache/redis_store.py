"""The Redis response cache store (``--cache-config redis,host=H,port=P``).

Imported by the frontend only (``frontend.main`` opens it; ``frontend.cache.response`` uses
it). Each frontend keeps its own connection pool to one Redis server, so every frontend
(and every triton-mp or Triton server pointed at the same Redis) shares the entries. The
settings are the redis cache's (``triton-inference-server/redis_cache``): ``host``,
``port``, ``user``, ``password``, ``db``, ``connect_timeout`` and ``socket_timeout``
(milliseconds), ``pool_size``, ``wait_timeout`` (milliseconds), ``tls_enabled``, ``cert``,
``key``, ``cacert``, ``cacert_dir``, ``sni``; ``TRITONCACHE_REDIS_USERNAME`` and
``TRITONCACHE_REDIS_PASSWORD`` stand in for ``user`` and ``password``.

The server must reach Redis at start (``connect`` pings it, as ``RedisCache::Create`` does).
Afterwards a failing Redis never fails a request: a lookup or insert error is logged with
the redis cache's words (``Failed to retrieve key: <key>. <cause>``) and the request is
served uncached. The frontend's event loop calls Redis synchronously, so the timeouts
bound how long one call can hold it: an unset or 0 ``connect_timeout``/``socket_timeout``
(Redis's "wait forever") becomes ``DEFAULT_TIMEOUT_MS``, and after a failure the store is
not asked again for ``RETRY_AFTER_S`` (requests meanwhile go uncached, silently).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import redis

from triton_mp.common.errors import StartupError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS = 1000
"""A connect or socket timeout of 0 (unset) becomes this (see the module docstring)."""
RETRY_AFTER_S = 1.0
"""How long the store stays unasked after an error."""
ENTRY_FIELD = "entry"
"""The hash field an entry's blob is stored in (the key is a Redis hash, as Triton's
redis cache stores one)."""


def _ms(settings: dict[str, str], key: str) -> float:
    value = int(settings.get(key, "0") or 0)
    return (value or DEFAULT_TIMEOUT_MS) / 1000


def client_options(settings: dict[str, str]) -> dict[str, Any]:
    """``redis.Redis`` keyword arguments from the cache's settings."""
    opts: dict[str, Any] = {
        "host": settings["host"],
        "port": int(settings["port"]),
        "db": int(settings.get("db", "0")),
        "socket_connect_timeout": _ms(settings, "connect_timeout"),
        "socket_timeout": _ms(settings, "socket_timeout"),
        "max_connections": int(settings.get("pool_size", "1")),
    }
    user = settings.get("user") or os.environ.get("TRITONCACHE_REDIS_USERNAME")
    password = settings.get("password") or os.environ.get("TRITONCACHE_REDIS_PASSWORD")
    if user:
        opts["username"] = user
    if password:
        opts["password"] = password
    if settings.get("tls_enabled") == "true":
        opts["ssl"] = True
        for ours, theirs in (
            ("cert", "ssl_certfile"),
            ("key", "ssl_keyfile"),
            ("cacert", "ssl_ca_certs"),
            ("cacert_dir", "ssl_ca_path"),
        ):
            if ours in settings:
                opts[theirs] = settings[ours]
    return opts


class RedisStore:
    """Entries in Redis, one hash per key (``frontend.cache.response.Store``).

    Args:
        client: a connected ``redis.Redis``.
        clock_s: the monotonic clock of the retry pause.
    """

    def __init__(self, client: redis.Redis, clock_s: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock_s = clock_s
        self._paused_until = 0.0

    @classmethod
    def connect(cls, settings: dict[str, str]) -> RedisStore:
        """Connect and ping, as the server's start requires.

        Raises:
            StartupError: "Failed to initialize RedisCache: <cause>".
        """
        client = redis.Redis(**client_options(settings))
        message = "Triton RedisCache client connected"
        try:
            if client.ping() is not True or client.echo(message) != message.encode():
                raise redis.RedisError("Failed to ping Redis server.")
        except redis.RedisError as e:
            client.close()
            raise StartupError(f"Failed to initialize RedisCache: {e}") from None
        log.info("response cache: connected to Redis at %s:%s", settings["host"], settings["port"])
        return cls(client)

    def _available(self) -> bool:
        return self._clock_s() >= self._paused_until

    def _failed(self, what: str, key: bytes, e: Exception) -> None:
        cause = "Timeout" if isinstance(e, redis.TimeoutError) else "Failed"
        log.error("%s %s key: %s. %s", cause, what, key.hex(), e)
        self._paused_until = self._clock_s() + RETRY_AFTER_S

    def lookup(self, key: bytes) -> bytes | None:
        """The entry under ``key``; None on a miss or while Redis fails."""
        if not self._available():
            return None
        try:
            value = self._client.hget(key.hex(), ENTRY_FIELD)
        except redis.RedisError as e:
            self._failed(
                "retrieving" if isinstance(e, redis.TimeoutError) else "to retrieve", key, e
            )
            return None
        return value if isinstance(value, bytes) else None

    def insert(self, key: bytes, data: bytes) -> bool:
        """Store an entry; False (logged) while Redis fails."""
        if not self._available():
            return False
        try:
            self._client.hset(key.hex(), ENTRY_FIELD, data)
        except redis.RedisError as e:
            timeout = isinstance(e, redis.TimeoutError)
            self._failed("inserting" if timeout else "to insert", key, e)
            return False
        return True

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()
