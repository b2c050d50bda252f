"""The response cache and rate limiter flags of ``triton-mp start`` (tritonserver's names).

Imported by ``cli.main`` only: ``cli.flag_table`` declares the flags and
``cache_and_rate_limit`` turns their values into ``ServerConfig`` fields, with tritonserver's
parse errors (server ``command_line_parser.cc``) and the cache libraries' own start-up
errors (local_cache, redis_cache ``Create``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from triton_mp.common.errors import TritonMPError

CACHE_KINDS = ("local", "redis")
"""The caches triton-mp implements (``libtritoncache_local.so`` and ``_redis.so``)."""

REDIS_KEYS = frozenset(
    (
        "host",
        "port",
        "user",
        "password",
        "db",
        "connect_timeout",
        "socket_timeout",
        "pool_size",
        "wait_timeout",
        "tls_enabled",
        "cert",
        "key",
        "cacert",
        "cacert_dir",
        "sni",
    )
)
"""The redis cache's configuration keys (redis_cache README)."""


def parse_cache_setting(arg: str) -> tuple[str, str, str]:
    """``<cache>,<setting>=<value>`` as (cache, setting, value), with Triton's messages.

    Raises:
        TritonMPError: no cache name, or no setting or value.
    """
    name, comma, rest = arg.partition(",")
    if not comma or not name:
        raise TritonMPError(
            "No cache specified. --cache-config option format is "
            f"<cache name>,<setting>=<value>. Got {arg}"
        )
    setting, eq, value = rest.partition("=")
    if not eq or not setting or not value:
        raise TritonMPError(
            f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {arg}"
        )
    return name, setting, value


def parse_rate_limit_resource(arg: str) -> dict[str, Any]:
    """``<name>:<count>[:<device>]`` as ``RateLimitResource`` fields.

    Raises:
        TritonMPError: Triton's format message, or a count or device that is no integer.
    """
    message = (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        f"'<resource_name>:<count>'. Got {arg}"
    )
    parts = arg.split(":")
    if len(parts) not in (2, 3):
        raise TritonMPError(message)
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else -1
    except ValueError:
        raise TritonMPError(message) from None
    return {"name": parts[0], "count": count, "device": device}


def _cache(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.response_cache_byte_size is not None and args.cache_config:
        raise TritonMPError(
            "Error: Incompatible flags --response-cache-byte-size and --cache-config both "
            "provided. Please provide one or the other."
        )
    if args.response_cache_byte_size is not None:
        size = str(args.response_cache_byte_size)
        print(
            "Warning: '--response-cache-byte-size' has been deprecated! This will default "
            "to the 'local' cache implementation with the provided byte size for its "
            "config. Please use '--cache-config' instead. The equivalent --cache-config CLI "
            f"args would be: '--cache-config=local,size={size}'",
            file=sys.stderr,
        )
        return {"kind": "local", "settings": {"size": size}}
    caches: dict[str, dict[str, str]] = {}
    for arg in args.cache_config:
        name, setting, value = parse_cache_setting(arg)
        caches.setdefault(name, {})[setting] = value
    if not caches:
        return None
    if len(caches) > 1:
        raise TritonMPError(
            f"only one response cache can be configured, got {', '.join(sorted(caches))}"
        )
    ((name, settings),) = caches.items()
    if name not in CACHE_KINDS:
        raise TritonMPError(
            f"unable to find 'libtritoncache_{name}.so' for cache: triton-mp implements the "
            "'local' and 'redis' caches"
        )
    _check_settings(name, settings)
    return {"kind": name, "settings": settings}


def _check_settings(name: str, settings: dict[str, str]) -> None:
    """The cache libraries' start-up checks (``LocalCache::Create``, ``RedisCache::Create``)."""
    if name == "local":
        if "size" not in settings:
            raise TritonMPError(
                "Failed to initialize LocalCache: config didn't contain a valid 'size' field."
            )
        if not settings["size"].isdigit():
            raise TritonMPError(f"Failed to initialize LocalCache: stoull: {settings['size']}")
        return
    if "host" not in settings or "port" not in settings:
        raise TritonMPError(
            "Failed to initialize RedisCache, didn't specify address. Must at a minimum "
            "specify 'host' and 'port' in the configuration - e.g. tritonserver "
            "--cache-config redis,host=redis --cache-config redis,port=6379 "
            "--model-repository=/models ..."
        )
    unknown = sorted(set(settings) - REDIS_KEYS)
    if unknown:
        # NOTE: the redis cache reads only the keys it knows; an unknown one would be
        # silently ignored there, so it is refused here.
        raise TritonMPError(
            f"Failed to initialize RedisCache: unknown setting(s) {', '.join(unknown)}"
        )


def cache_and_rate_limit(args: argparse.Namespace) -> dict[str, Any]:
    """The ``ServerConfig`` fields of these flags (``cache``, ``rate_limit``,
    ``rate_limit_resources``).

    Raises:
        TritonMPError: a malformed flag, with tritonserver's message.
    """
    if args.rate_limit not in ("execution_count", "off"):
        raise TritonMPError("invalid argument for --rate-limit")
    return {
        "cache": _cache(args),
        "rate_limit": args.rate_limit,
        "rate_limit_resources": tuple(
            parse_rate_limit_resource(a) for a in args.rate_limit_resource
        ),
    }
