"""Everything a transport of the frontend calls, in one place: the transport-free core.

Imported by the frontend's process shell (``frontend.main``, which builds it) and its
transports (``frontend.grpc``, ``frontend.http``), which translate their wire format to
these calls and map ``ErrorCode`` to their status codes; the core imports neither grpc nor
aiohttp nor the wire protos (``tests/unit/test_layering.py`` checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from triton_mp.frontend.admin.logs import LogControl
from triton_mp.frontend.admin.repository import RepositoryApi
from triton_mp.frontend.admin.server import ServerApi
from triton_mp.frontend.admin.stats import StatsApi
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.shm.api import ClientShmApi
from triton_mp.frontend.tracing.tracer import Tracer


@dataclass(frozen=True, slots=True)
class FrontendApi:
    """The KServe v2 / Triton operations of one frontend process, by concern."""

    server: ServerApi
    """Health, metadata, model configuration."""
    inference: Inference
    """The submit path (``submit -> Ticket``) and the drain."""
    repository: RepositoryApi
    """Repository index, load, unload."""
    stats: StatsApi
    """ModelStatistics and the queue status (from the scheduler)."""
    shm: ClientShmApi
    """System (and CUDA) shared memory registration."""
    tracer: Tracer = field(default_factory=Tracer.off)
    """Request tracing: sampling, the trace settings, the trace file."""
    logs: LogControl = field(default_factory=LogControl)
    """The server's log settings (the ``logging`` extension)."""
