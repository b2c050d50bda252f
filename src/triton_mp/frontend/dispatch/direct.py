"""The frontend's side of the direct handoff (``ipc.direct``): a request handed straight to
an idle instance of its version, when the scheduler offers one.

Imported by ``frontend.inference`` (which tries ``DirectRoutes.hand`` before it sends a
request to the scheduler) and ``frontend.dispatch.inbox`` (which applies the supervisor's route
updates). The supervisor gives this frontend a route per instance of every version whose
requests the scheduler would dispatch alone and at once (``ipc.direct.handoff_eligible``);
the scheduler posts an instance's lease while it is idle with an empty queue. ``hand`` takes
the first lease on offer (``sem_trywait``: one taker wins), leaves a ``DirectSent`` on the
ring to the scheduler without waking it, pushes the ``BatchAssign`` onto this frontend's ring
into the worker's inbox and wakes the worker. With no lease on offer, or a request too large
for the route's ring, it returns False and the request goes to the scheduler as before.

A request travels in its wire form (``records.wire_form``): its REQUEST record verbatim when
it has one, else the message. The native gRPC thread hands its known calls by the same rules
(``native/direct_handoff.h``, its twin): ``mirror`` opens each route there too (``native``:
``_native.direct_route_*``), with the ring into the worker's inbox shared (``attach``: its
producer is ``_native.RingProducer``, whose pushes both threads make under one lock).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import posix_ipc

from triton_mp.ipc import Sender, encode
from triton_mp.ipc.direct import DirectRoute, Lease
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.protocol.messages import BatchAssign, DirectSent, InferRequest, direct_batch_id


class NativeRoutes(Protocol):
    """The extension's ``direct_route_*`` functions (``direct_handoff_py.cc``)."""

    def direct_route_add(
        self,
        frontend_id: int,
        instance_id: int,
        model: str,
        version: int,
        lease: str,
        producer: object,
        wake: str,
        /,
    ) -> None: ...
    def direct_route_remove(self, instance_id: int, /) -> None: ...
    def direct_route_clear(self) -> None: ...


log = logging.getLogger(__name__)


class _Route:
    """One instance's lease and this frontend's ring into its inbox."""

    __slots__ = ("instance_id", "lease", "sender", "key", "route")

    def __init__(self, route: DirectRoute, attach: Callable[[str], Ring]) -> None:
        self.instance_id = route.instance_id
        self.key = (route.model, route.version)
        self.route = route
        self.lease = Lease(route.lease)
        try:
            self.sender = Sender(route.ring, route.wakeup, attach=attach)
        except BaseException:
            self.lease.close()
            raise

    def close(self) -> None:
        self.lease.close()
        self.sender.close()


class DirectRoutes:
    """This frontend's routes, by model version (see the module docstring).

    Args:
        frontend_id: this frontend (routes for others are ignored; batch ids name it).
        push_scheduler: pushes encoded bytes onto the ring to the scheduler without waking
            it; False when the ring is full.
        send_scheduler: pushes and wakes (waits for room; raises when it stays full).
        clock_ns: the monotonic clock stamping ``dispatch_ns``.
        attach: maps a route's ring into a worker's inbox (``Ring.attach``; a shared
            producer where the native gRPC thread hands calls too: module docstring).
    """

    def __init__(
        self,
        frontend_id: int,
        push_scheduler: Callable[[bytes], bool],
        send_scheduler: Callable[[bytes], None],
        clock_ns: Callable[[], int] = time.monotonic_ns,
        attach: Callable[[str], Ring] = Ring.attach,
    ) -> None:
        self._fid = frontend_id
        self._push = push_scheduler
        self._send = send_scheduler
        self._clock_ns = clock_ns
        self._attach = attach
        self._native: NativeRoutes | None = None
        self._routes: dict[int, _Route] = {}
        self._by_version: dict[tuple[str, int], list[_Route]] = {}
        self.handed = 0
        """Requests handed to an instance directly (tests, logs)."""

    def update(self, add: Iterable[DirectRoute], remove: Iterable[int] = ()) -> None:
        """Open the routes of new instances (this frontend's only) and close those of
        instances stopped for good."""
        native = self._native
        for iid in remove:
            route = self._routes.pop(iid, None)
            if route is not None:
                if native is not None:
                    native.direct_route_remove(iid)
                self._by_version[route.key].remove(route)
                if not self._by_version[route.key]:
                    del self._by_version[route.key]
                route.close()
        for r in add:
            if r.frontend_id != self._fid or r.instance_id in self._routes:
                continue
            try:
                route = _Route(r, self._attach)
            except (posix_ipc.Error, OSError, ValueError) as e:
                # NOTE: the instance stopped meanwhile; its requests go to the scheduler.
                log.debug("no direct route to instance %d: %s", r.instance_id, e)
                continue
            if native is not None and not self._mirror(native, route):
                route.close()
                continue
            self._routes[r.instance_id] = route
            self._by_version.setdefault(route.key, []).append(route)

    def mirror(self, native: NativeRoutes) -> None:
        """Open every route in the native gRPC thread's handoff too, now and on each
        ``update`` (module docstring); a route whose ring has no shared producer (the
        extension is absent from ``attach``) stays Python's, which only loses that
        thread's handoffs to it."""
        self._native = native
        for iid, route in list(self._routes.items()):
            if not self._mirror(native, route):
                self.update((), (iid,))

    def _mirror(self, native: NativeRoutes, route: _Route) -> bool:
        """Open ``route`` in C++; False: a semaphore is gone (the instance stopped)."""
        producer = getattr(route.sender.ring, "producer", None)
        if producer is None:
            return True
        r = route.route
        try:
            native.direct_route_add(
                self._fid, r.instance_id, r.model, r.version, r.lease, producer, r.wakeup.name
            )
        except OSError as e:
            log.debug("no native direct route to instance %d: %s", r.instance_id, e)
            return False
        return True

    def serves(self, model: str, version: int) -> bool:
        """Whether ``hand`` may hand a request of this model version (it has routes)."""
        return bool(self._by_version.get((model, version)))

    def hand(self, model: str, version: int, request_id: int, wire: InferRequest | bytes) -> bool:
        """Hand request ``request_id`` of ``model`` ``version`` (``wire``: its REQUEST record
        or its message) to an idle instance of its version if one is on offer; True when
        handed (the worker answers it as any request), False to send it to the scheduler.

        Raises:
            ChannelTimeout: a ring stayed full (the lease is taken: the scheduler frees the
                instance after ``scheduler.direct.CLAIM_TIMEOUT_NS``).
        """
        routes = self._by_version.get((model, version))
        if not routes:
            return False
        for route in routes:
            if not route.lease.offered():
                continue
            batch_id = direct_batch_id(self._fid, request_id)
            now = self._clock_ns()
            assign = encode(BatchAssign(batch_id=batch_id, requests=(wire,), dispatch_ns=now))
            if not route.sender.fits(len(assign)) or not route.lease.take():
                return False
            sent = encode(
                DirectSent(
                    instance_id=route.instance_id, batch_id=batch_id, dispatch_ns=now, request=wire
                )
            )
            # NOTE: before the batch: the worker's BatchDone is never read before it is sent.
            if not self._push(sent):
                self._send(sent)
            # NOTE: does not find the ring full: only the lease holder pushes into it and
            # ``fits`` saw its room (native/direct_handoff.cc Hand: why, and the one way past)
            route.sender.send_bytes(assign)
            self.handed += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "request %d accepted for '%s' version %d, handed to instance %d",
                    request_id,
                    model,
                    version,
                    route.instance_id,
                )
            return True
        return False

    def close(self) -> None:
        """Close every route (the native gRPC thread's too)."""
        if self._native is not None:
            self._native.direct_route_clear()
        for route in self._routes.values():
            with contextlib.suppress(Exception):
                route.close()
        self._routes.clear()
        self._by_version.clear()
