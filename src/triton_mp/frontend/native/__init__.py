"""The native gRPC server of a frontend process (C++ on the system's libgrpc++, built by the
project's install from the sources beside this file: ``setup.py``).

Imported by ``frontend.main`` only. With ``--grpc-frontend native`` (the default where the
extension was built) the native server owns the public gRPC port and the Python grpc.aio
server moves onto a private unix socket of this process. Every call on the public port goes
to ``NativeServer``'s single completion-queue thread (it never takes the GIL):

- **ModelInfer and ModelStreamInfer, in process** (``handoff.cc`` / ``handoff.py``,
  ``infer_call.cc``, ``stream_call.cc``): ModelInfer is a registered raw method of the port
  (``infer_service.h``), so a call reaches the thread with its request bytes in one
  completion; a unary call's request bytes and metadata, and a stream's opening
  metadata, each request message as it is read and its half-close, are queued for this
  process's event loop, woken through an eventfd, which runs the Python handler on them (no
  grpc.aio call); a stream's response messages are written to the client in the order the
  handler yields them, and every call ends with the status the handler ends it with (OK, or
  the one it aborted with, e.g. ``triton_grpc_error``); the answers of one event-loop pass
  are handed to gRPC from the Python thread at its end, under the server's serial lock. A
  call the client abandons (cancel, deadline) cancels the handler's task. Not with
  ``--grpc-restricted-protocol`` (grpc.aio's interceptor checks those headers): then both
  are relayed like the rest.

- **Handed to Python as it came** (``proxy_call.cc``): the native server accepts any method
  through ``grpc::AsyncGenericService`` and relays it, message by message, over
  ``grpc::GenericStub`` to the Python server: the request's bytes, its metadata (every user
  key; not the keys gRPC writes itself, ``metadata.cc``) and its deadline unchanged; the
  Python side's initial metadata, messages, status code, message, details and trailers come
  back unchanged. A client that goes away cancels the Python side's call. So every answer,
  every error and every word is Python's, exactly as with ``--grpc-frontend python``.
- The public port keeps the Python server's settings: the same grpc core channel arguments
  (message limits, ``SO_REUSEPORT`` so several frontends share the port, keepalive, the
  response compression level). TLS stays with the Python server (``public_port.choose``).

Where the extension is absent (another platform, a failed build) or ``TRITON_MP_NATIVE=0``
is set, ``UNAVAILABLE`` says why and the Python server serves the public port as before.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from triton_mp.ipc import BlockRef, TensorRef
    from triton_mp.ipc.memory.ring import Ring
    from triton_mp.ipc.memory.shm import Segment
    from triton_mp.ipc.tensor_pool import ArenaBlocks

_ABI = 9
"""What the Python side passes the extension (``module.cc``'s ``ABI``, its twin): 9,
``reply`` takes a response's parts, ``take`` gives KNOWN (with the call's request id), LOST
and ACCEPTED entries (``known_log``), a known lesson serves calls with any request id,
``known_*`` teach the gRPC thread (``known_teach``), ``direct_*`` open the direct handoff's routes
(``dispatch.direct``) and set its full ring's wait (``direct_full_timeout``),
``answer_thread_*`` read the inbox in C++ (``answer_thread``), ``known_submit`` can hold a
copy in flight (``known_release_held``, ``known_reserved``). A build older than its sources
is treated as absent."""


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("TRITON_MP_NATIVE") == "0":
        return None, "TRITON_MP_NATIVE=0"
    try:
        module = importlib.import_module("triton_mp.frontend.native._native")
    except ImportError as e:
        return None, str(e)
    abi = getattr(module, "ABI", 1)
    if abi != _ABI:
        return None, (
            f"the extension was built from older sources (ABI {abi}, not {_ABI}): "
            "rebuild it (python setup.py build_ext --inplace)"
        )
    return module, ""


_NATIVE, UNAVAILABLE = _load()
"""The extension module, or None and the import error's text."""


def available() -> bool:
    """True where the native extension was built and loads."""
    return _NATIVE is not None


def record_patch() -> Callable[[bytes, int, int, BlockRef, Sequence[TensorRef]], bytes] | None:
    """``_native.patch_request`` (``record_patch.h``), the C++ twin of
    ``dispatch.known_records``' Python patch; None where the extension is absent."""
    return None if _NATIVE is None else cast("Callable[..., bytes]", _NATIVE.patch_request)


def input_arena_type() -> Callable[[Segment], ArenaBlocks] | None:
    """The C++ twin of ``ipc.tensor_pool._Arena`` (``input_arena.h``: ``InputArena(segment)``)
    for this frontend's input arenas, which the gRPC thread can allocate with too; None where
    the extension is absent (the Python allocator serves)."""
    return None if _NATIVE is None else cast("Callable[[Segment], ArenaBlocks]", _NATIVE.InputArena)


def shared_ring_attach() -> Callable[[str], Ring] | None:
    """``Ring.attach`` for the frontend's ring to the scheduler with its pushes in C++ under
    the lock the gRPC thread shares (``shared_ring.SharedRing``); None where the extension is
    absent (``Ring.attach`` serves)."""
    if _NATIVE is None:
        return None
    from triton_mp.frontend.native.shared_ring import attach_shared

    return attach_shared(_NATIVE.RingProducer)


class NativeServer:
    """The native server of this process (one at most): ``start`` binds, ``stop`` drains.

    Args:
        address: the public ``host:port`` (port 0: any free port).
        backend: the Python server's target, ``unix:/path``.
        channel_args: grpc core channel arguments of the public port (int values only), the
            Python server's own (``frontend.grpc.server_setup.grpc_options``).
        handoff: ModelInfer and ModelStreamInfer calls go to this process's event loop
            (``handoff.Handoff``) rather than through the private socket.
    """

    def __init__(
        self, address: str, backend: str, channel_args: list[tuple[str, int]], handoff: bool
    ) -> None:
        self._args = (address, backend, channel_args, handoff)
        self._running = False

    @property
    def module(self) -> ModuleType:
        """The extension (its handoff functions: ``handoff.Handoff``).

        Raises:
            RuntimeError: the extension is absent.
        """
        if _NATIVE is None:
            raise RuntimeError(f"native gRPC frontend unavailable: {UNAVAILABLE}")
        return _NATIVE

    def start(self) -> int:
        """Bind and serve. Returns the bound port (0: the bind failed).

        Raises:
            RuntimeError: the extension is absent, or a server already runs here.
        """
        if _NATIVE is None:
            raise RuntimeError(f"native gRPC frontend unavailable: {UNAVAILABLE}")
        port = int(_NATIVE.start(*self._args))
        self._running = port != 0
        return port

    def stop(self, grace_s: float) -> bool:
        """Stop accepting, close the connections once no call runs (a client that answers
        nothing does not hold the stop), cancel calls still running after ``grace_s`` seconds,
        and join the server's thread (blocks: call it off the event loop). Returns whether it
        cancelled a call still running then (``stop_cut.h``; False when it was not running)."""
        if self._running and _NATIVE is not None:
            self._running = False
            return bool(_NATIVE.stop(grace_s))
        return False
