"""Triton's restricted protocols: APIs that answer only requests carrying a header.

Imported by the CLI (parses ``--grpc-restricted-protocol`` / ``--http-restricted-api``) and by
the frontend's transports, which apply the rules: ``frontend.grpc.interceptor`` per gRPC
method (``grpc_rules``), ``frontend.http.routes`` per HTTP route (``http_refusal``). No
transport is imported here, so the CLI loads neither grpc nor aiohttp.

Flag syntax (Triton's ``TritonParser::ParseRestrictedFeatureOption``), repeatable::

    --grpc-restricted-protocol=<category>[,<category>...]:<key>=<value>
    --http-restricted-api=<category>[,<category>...]:<key>=<value>

A request to an API of a restricted category must carry the header ``<key>: <value>``; over
gRPC the header is ``triton-grpc-protocol-<key>`` (Triton's prefix). Otherwise gRPC answers
UNAVAILABLE "This protocol is restricted, expecting header 'triton-grpc-protocol-<key>'" and
HTTP 403 ``{"error":"This API is restricted, expecting header '<key>'"}``, as Triton 2.51
does (checked against the real server).
"""

from __future__ import annotations

from triton_mp.common.errors import TritonMPError

CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
"""Triton's restricted-feature categories (``RESTRICTED_CATEGORY_NAMES``)."""

GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
"""What Triton puts before ``<key>`` for gRPC metadata."""

Restrictions = dict[str, tuple[str, str]]
"""Category -> (header key, expected value); categories absent are open."""


def parse_restrictions(values: list[str], flag: str) -> Restrictions:
    """Parse every occurrence of one restriction flag.

    Args:
        values: the flag's values, e.g. ``["shared-memory,model-repository:admin=s3cret"]``.
        flag: ``--grpc-restricted-protocol`` or ``--http-restricted-api`` (for messages).

    Raises:
        TritonMPError: with Triton's messages: ``<flag> option format is '<config
            name>:<setting>=<value>'. Got <text>``; ``unknown restricted protocol '<c>'``
            (``api`` for HTTP); ``restricted protocol '<c>' can not be specified in
            multiple config groups``.
    """
    word = "protocol" if "grpc" in flag else "api"
    out: Restrictions = {}
    for text in values:
        names, sep, setting = text.partition(":")
        key, eq, value = setting.partition("=")
        if not sep or not eq or not names or not key or not value:
            raise TritonMPError(
                f"{flag} option format is '<config name>:<setting>=<value>'. Got {text}"
            )
        for name in names.split(","):
            if name not in CATEGORIES:
                raise TritonMPError(f"unknown restricted {word} '{name}'")
            if name in out:
                raise TritonMPError(
                    f"restricted {word} '{name}' can not be specified in multiple config groups"
                )
            out[name] = (key, value)
    return out


GRPC_METHOD_CATEGORIES: dict[str, str] = {
    **{
        f"/inference.GRPCInferenceService/{m}": c
        for c, methods in {
            "health": ("ServerLive", "ServerReady", "ModelReady"),
            "metadata": ("ServerMetadata", "ModelMetadata"),
            "inference": ("ModelInfer", "ModelStreamInfer"),
            "model-config": ("ModelConfig",),
            "statistics": ("ModelStatistics",),
            "model-repository": ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"),
            "shared-memory": (
                "SystemSharedMemoryStatus",
                "SystemSharedMemoryRegister",
                "SystemSharedMemoryUnregister",
                "CudaSharedMemoryStatus",
                "CudaSharedMemoryRegister",
                "CudaSharedMemoryUnregister",
            ),
            "trace": ("TraceSetting",),
            "logging": ("LogSettings",),
        }.items()
        for m in methods
    },
    "/grpc.health.v1.Health/Check": "health",
    # NOTE: our own queue inspection is statistics, as ModelStatistics is.
    "/triton_mp.admin.Admin/QueueStatus": "statistics",
}
"""Full gRPC method name -> restricted category."""


def grpc_refusal(key: str) -> str:
    """Triton's gRPC message for a request without the header (UNAVAILABLE)."""
    return f"This protocol is restricted, expecting header '{GRPC_HEADER_PREFIX}{key}'"


def http_refusal(key: str) -> str:
    """Triton's HTTP message for a request without the header (403)."""
    return f"This API is restricted, expecting header '{key}'"


GrpcRule = tuple[str, str, str]
"""(metadata key ``triton-grpc-protocol-<key>`` in lower case, expected value, refusal)."""


def grpc_rules(restrictions: Restrictions) -> dict[str, GrpcRule]:
    """Full gRPC method name -> the rule its calls must pass; open methods are absent."""
    return {
        method: ((GRPC_HEADER_PREFIX + key).lower(), value, grpc_refusal(key))
        for method, category in GRPC_METHOD_CATEGORIES.items()
        if category in restrictions
        for key, value in (restrictions[category],)
    }
