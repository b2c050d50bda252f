"""The messages of each frontend's control pipe to the supervisor (``ipc.handshake``).

``ToSupervisor``: a frontend's RepositoryModelLoad / RepositoryModelUnload calls
(``ModelLoadCall``, ``ModelUnloadCall``) and its acknowledgements of model table updates
(``TableAck``), and the log settings a client set (``LogSettingsUpdate``).
``FromSupervisor``: the calls' replies (``ControlReply``) and the model table
(``ModelTableUpdate`` of ``ModelEntry``: what RepositoryIndex, ModelReady and ModelMetadata
answer from, and the ``DirectRoute`` s of ``ipc.direct``). Frozen tagged msgspec structs
like ``ipc.protocol.messages``; nothing is pickled.
"""

from __future__ import annotations

import msgspec

from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate
from triton_mp.ipc.protocol.messages import ErrorInfo


class ModelEntry(msgspec.Struct, frozen=True, kw_only=True):
    """The frontend's view of one model in the repository."""

    name: str
    config: bytes
    """Serialized effective ``inference.ModelConfig`` (empty when it failed to load)."""
    ready_versions: tuple[int, ...]
    failed_versions: tuple[int, ...] = ()
    reason: str = ""
    """Why the model (or a version) is UNAVAILABLE."""
    unloaded: bool = False
    """Unloaded (explicit unload, or gone from the repository under polling): listed by
    RepositoryIndex as UNAVAILABLE with ``reason``, otherwise unknown to requests."""
    transition: str = ""
    """``LOADING`` while the supervisor loads a model that serves no version yet (index
    only)."""
    version_reasons: dict[int, str] = {}
    """Per failed version, why (RepositoryIndex); ``reason`` when absent."""
    ready_reasons: dict[int, str] = {}
    """Per ready version whose update in place failed, why (RepositoryIndex lists it READY
    with that reason, as 2.51 does)."""
    retired_versions: tuple[int, ...] = ()
    """Versions once served that a later change stopped (version policy): Triton keeps them
    as UNAVAILABLE "unloaded" (a request naming one: "... is not at ready state")."""
    unloading_versions: tuple[int, ...] = ()
    """Versions a change or an unload stopped serving whose workers still finish the
    requests they had (an unloaded model with such versions is not ``unloaded`` yet):
    Triton's lifecycle shows them UNLOADING (no reason) until then, and a request naming one
    gets "... is not at ready state"; they become ``retired_versions`` afterwards."""
    labels: dict[str, tuple[str, ...]] = {}
    """Output name -> its classification labels (``label_filename``), for the classification
    extension."""
    readiness_hook: bool = False
    """Its backend's models may define ``is_ready()`` (``BackendCapabilities``): ModelReady,
    and ServerReady under strict readiness, ask the instances."""


class ModelLoadCall(msgspec.Struct, frozen=True, kw_only=True, tag="load", array_like=True):
    """RepositoryModelLoad, forwarded by a frontend to the supervisor."""

    call_id: int
    model: str
    config_json: str | None = None
    """The ``config`` parameter: a JSON ModelConfig used instead of config.pbtxt."""
    files: dict[str, bytes] = {}
    """The ``file:<path>`` parameters: path within the model directory -> content."""


class ModelUnloadCall(msgspec.Struct, frozen=True, kw_only=True, tag="unload", array_like=True):
    """RepositoryModelUnload, forwarded by a frontend to the supervisor."""

    call_id: int
    model: str
    unload_dependents: bool = False


class TableAck(msgspec.Struct, frozen=True, kw_only=True, tag="table_ack", array_like=True):
    """A frontend applied ``ModelTableUpdate`` number ``seq``."""

    seq: int


ToSupervisor = ModelLoadCall | ModelUnloadCall | TableAck | LogSettingsUpdate
"""``LogSettingsUpdate``: a client changed the log settings (the supervisor logs by them)."""


class ControlReply(msgspec.Struct, frozen=True, kw_only=True, tag="reply", array_like=True):
    """The supervisor's answer to a ``ModelLoadCall`` / ``ModelUnloadCall``."""

    call_id: int
    error: ErrorInfo | None = None


class DirectRoute(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """What one frontend needs to hand requests of one instance's version straight to it."""

    instance_id: int
    model: str
    version: int
    frontend_id: int
    """The frontend this route is for (the ring is that frontend's alone)."""
    ring: str
    """The frontend's ring into the worker's inbox."""
    wakeup: Wakeup
    """The worker's inbox semaphore."""
    lease: str
    """The instance's lease semaphore."""


class ModelTableUpdate(msgspec.Struct, frozen=True, kw_only=True, tag="table", array_like=True):
    """Replace these models' entries in a frontend's table, in one step; attach and detach
    worker rings. ``seq`` > 0 asks for a ``TableAck``."""

    seq: int = 0
    models: tuple[ModelEntry, ...] = ()
    add_rings: tuple[str, ...] = ()
    """Rings from new workers to this frontend (join its inbox)."""
    remove_rings: tuple[str, ...] = ()
    """Rings of workers that stopped for good."""
    drop_segments: tuple[str, ...] = ()
    """Name prefixes of stopped workers' arenas to unmap."""
    add_routes: tuple[DirectRoute, ...] = ()
    """New instances' direct routes (``ipc.direct``; each frontend takes its own)."""
    remove_routes: tuple[int, ...] = ()
    """Instances whose direct routes are gone (stopped for good)."""
    resend_shm_to: int = -1
    """A frontend restarted in a dead one's place (-1: none): send it every client
    shared-memory registration this frontend knows, on the ring to it, before it serves."""
    frontend_restarts: dict[int, int] | None = None
    """Per frontend id: the supervisor's restarts of it so far (None: unchanged);
    ``supervisor.processes.frontend_restart``."""


FromSupervisor = ControlReply | ModelTableUpdate
