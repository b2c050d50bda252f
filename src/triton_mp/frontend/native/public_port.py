"""Who owns a frontend's public gRPC port: the Python grpc.aio server itself, or the native
server (``frontend.native.NativeServer``) in front of it, with the Python server moved onto
a private unix socket in a directory of this process.

Imported by ``frontend.main``. ``choose`` is the decision (pure); ``NativePort`` does it.
"""

from __future__ import annotations

import asyncio
import shutil
from functools import partial
from typing import Any, Protocol

from triton_mp.common.process import process_dirs
from triton_mp.frontend import native
from triton_mp.frontend.grpc.servicer import InferenceServicer
from triton_mp.frontend.native.handoff import Handoff
from triton_mp.frontend.native.known_answers import NativeAnswers
from triton_mp.frontend.native.known_calls import KnownCalls
from triton_mp.frontend.native.known_teach import NativeKnown, Wiring


class _Bindable(Protocol):
    def add_insecure_port(self, address: str) -> int: ...


def choose(requested: str, *, tls: bool, built: bool, why_not_built: str) -> tuple[bool, str]:
    """Whether the native server takes the public port, and the one log line saying why not.

    Args:
        requested: ``--grpc-frontend``: "native" or "python".
        tls: ``--grpc-use-ssl`` (TLS is served by the Python server).
        built: the extension loads (``native.available()``).
        why_not_built: the import error's text when it does not.

    Returns:
        (True, "") for native; (False, "") when python was asked for; (False, line) when
        native was asked for and cannot serve.
    """
    if requested != "native":
        return False, ""
    if not built:
        return False, (
            f"native gRPC frontend not built ({why_not_built}): the Python frontend serves gRPC"
        )
    if tls:
        return False, "native gRPC frontend does not serve TLS: the Python frontend serves gRPC"
    return True, ""


class NativePort:
    """The native server on the public port and the Python server's private socket.

    Args:
        address: the public ``host:port``.
        channel_args: the Python server's grpc core channel arguments, applied to the port.
        servicer: the InferenceServicer that serves ModelInfer and ModelStreamInfer in
            process (``handoff``); None: they are relayed to the Python server like the rest.
        wiring: what the gRPC thread submits known calls with (``known_teach``); None: it
            hands every call to Python.
    """

    def __init__(
        self,
        address: str,
        channel_args: list[tuple[str, int]],
        servicer: InferenceServicer | None,
        wiring: Wiring | None = None,
    ) -> None:
        self.address = address
        # NOTE: named by this process's pid: the supervisor removes it if we die unclean.
        self._dir = process_dirs.make(process_dirs.NATIVE_GRPC)
        self.backend = f"unix:{self._dir / 'python.sock'}"
        self._server = native.NativeServer(
            address, self.backend, channel_args, handoff=servicer is not None
        )
        self._handoff = None
        self._teacher: NativeKnown | None = None
        self._answers: NativeAnswers | None = None
        self._answers_inbox: Any = None
        if servicer is not None:
            known = partial(KnownCalls, servicer.inference, servicer.heads, servicer)
            self._handoff = Handoff(self._server.module, servicer, known)
            calls = self._handoff.known_calls
            if wiring is not None and calls is not None:
                self._handoff.lost = wiring.lost
                pull = self._handoff.pull_known
                self._teacher = NativeKnown(self._server.module, calls, servicer, pull)
                self._wire = partial(self._teacher.wire, wiring, servicer.inference)
                self._answers = NativeAnswers(
                    self._server.module, calls.pending, self._handoff.answered,
                    self._teacher.refill,
                )  # fmt: skip
                self._answers_inbox = wiring.inbox

    def owned(self) -> int:
        """Answers this process awaits that its pending table does not count: the known
        calls the gRPC thread submitted and keeps, whose answers C++ serves (``handoff.h``
        owned; 0 while it keeps none)."""
        return int(self._server.module.owned()) if self._answers is not None else 0

    @property
    def teacher(self) -> NativeKnown | None:
        """The gRPC thread's lessons (None: it submits nothing itself)."""
        return self._teacher

    def bind_private(self, server: _Bindable) -> bool:
        """Bind the Python server to the private socket. False: it could not be bound."""
        return bool(server.add_insecure_port(self.backend))

    def start(self) -> int:
        """Bind the public port and serve (on the running loop, which takes the handed-off
        calls). Returns the port (0: the bind failed)."""
        port = self._server.start()
        if port and self._handoff is not None:
            self._handoff.start(asyncio.get_running_loop())
            if self._teacher is not None:
                self._wire()
            if self._answers is not None and self._answers.start(self._answers_inbox):
                assert self._handoff.known_calls is not None
                self._handoff.release_owned = self._answers.release
                self._handoff.known_calls.on_head = self._answers.teach
        return port

    async def stop(self, grace_s: float) -> bool:
        """Stop the native server (off the event loop, which keeps serving the Python side
        until every relayed call is over), then remove the socket's directory. Returns
        whether calls still running after ``grace_s`` seconds were cancelled."""
        loop = asyncio.get_running_loop()
        if self._answers is not None:
            self._answers.stop()  # NOTE: owned calls go to Python, which the drain counts
        cut = await loop.run_in_executor(None, self._server.stop, grace_s)
        if self._teacher is not None:
            self._teacher.close()  # NOTE: before the arenas close (the mapping's export)
        if self._handoff is not None:
            self._handoff.stop()
        self.close()
        return cut

    def close(self) -> None:
        """Remove the private socket's directory (idempotent)."""
        shutil.rmtree(self._dir, ignore_errors=True)
