"""triton-mp's own flags (``MP_FLAGS``, the end of ``cli.flag_table.FLAGS``): what the
multi-process server adds to tritonserver's flags (processes, shared-memory sizes,
heartbeats). Each row's ``dest`` is the ``ServerConfig`` field it sets."""

from __future__ import annotations

from triton_mp.cli.flags import Flag, Kind, in_range, one_of

G_MP = "triton-mp"

MP_FLAGS: tuple[Flag, ...] = (
    Flag(
        "frontend-processes",
        Kind.INT,
        "frontend_processes",
        1,
        help="frontend processes sharing the ports (SO_REUSEPORT)",
        group=G_MP,
    ),
    Flag(
        "frontend-spare",
        Kind.BOOL,
        "frontend_spare",
        True,
        help="keep a frontend process imported ahead to take a dead frontend's place "
        "(false: a restart starts one from scratch, a second or more later)",
        group=G_MP,
    ),
    Flag(
        "client-shm-prefix",
        Kind.STR,
        "client_shm_prefix",
        "",
        help="registered system shared memory keys must start with this",
        group=G_MP,
    ),
    Flag(
        "arena-budget-bytes",
        Kind.INT,
        "arena_budget_bytes",
        4 << 30,
        help="most /dev/shm one process may hold for tensors (default 4 GiB)",
        group=G_MP,
    ),
    Flag(
        "heartbeat-timeout-secs",
        Kind.FLOAT,
        "heartbeat_timeout_s",
        30.0,
        help="kill (and restart) a process whose heartbeat is silent this long (0 = off)",
        group=G_MP,
    ),
    Flag(
        "ring-bytes",
        Kind.INT,
        "ring_bytes",
        1 << 20,
        check=in_range("--ring-bytes must be at least 4096", 4096),
        help="each request ring's size in /dev/shm (default 1 MiB); one request's "
        "descriptor (its id and parameters) may take half of it",
        group=G_MP,
    ),
    Flag(
        "grpc-frontend",
        Kind.STR,
        "grpc_frontend",
        "native",
        check=one_of("--grpc-frontend", "native", "python"),
        help="who owns the gRPC port: native (C++, hands Python what it does not serve; "
        "the Python server where it was not built) or python",
        group=G_MP,
    ),
)
"""triton-mp's own flags, in usage order."""
