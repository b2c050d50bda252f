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
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable

import posix_ipc

from triton_mp.ipc import Sender, encode
from triton_mp.ipc.direct import DirectRoute, Lease
from triton_mp.ipc.protocol.messages import BatchAssign, DirectSent, InferRequest, direct_batch_id

log = logging.getLogger(__name__)


class _Route:
    """One instance's lease and this frontend's ring into its inbox."""

    __slots__ = ("instance_id", "lease", "sender", "key")

    def __init__(self, route: DirectRoute) -> None:
        self.instance_id = route.instance_id
        self.key = (route.model, route.version)
        self.lease = Lease(route.lease)
        try:
            self.sender = Sender(route.ring, route.wakeup)
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
    """

    def __init__(
        self,
        frontend_id: int,
        push_scheduler: Callable[[bytes], bool],
        send_scheduler: Callable[[bytes], None],
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._fid = frontend_id
        self._push = push_scheduler
        self._send = send_scheduler
        self._clock_ns = clock_ns
        self._routes: dict[int, _Route] = {}
        self._by_version: dict[tuple[str, int], list[_Route]] = {}
        self.handed = 0
        """Requests handed to an instance directly (tests, logs)."""

    def update(self, add: Iterable[DirectRoute], remove: Iterable[int] = ()) -> None:
        """Open the routes of new instances (this frontend's only) and close those of
        instances stopped for good."""
        for iid in remove:
            route = self._routes.pop(iid, None)
            if route is not None:
                self._by_version[route.key].remove(route)
                if not self._by_version[route.key]:
                    del self._by_version[route.key]
                route.close()
        for r in add:
            if r.frontend_id != self._fid or r.instance_id in self._routes:
                continue
            try:
                route = _Route(r)
            except (posix_ipc.Error, OSError, ValueError) as e:
                # NOTE: the instance stopped meanwhile; its requests go to the scheduler.
                log.debug("no direct route to instance %d: %s", r.instance_id, e)
                continue
            self._routes[r.instance_id] = route
            self._by_version.setdefault(route.key, []).append(route)

    def serves(self, model: str, version: int) -> bool:
        """Whether ``hand`` may hand a request of this model version (it has routes)."""
        return bool(self._by_version.get((model, version)))

    def hand(self, desc: InferRequest) -> bool:
        """Hand ``desc`` to an idle instance of its version if one is on offer; True when
        handed (the worker answers it as any request), False to send it to the scheduler.

        Raises:
            ChannelTimeout: a ring stayed full (the lease is taken: the scheduler frees the
                instance after ``scheduler.direct.CLAIM_TIMEOUT_NS``).
        """
        routes = self._by_version.get((desc.model, desc.version))
        if not routes:
            return False
        for route in routes:
            if not route.lease.offered():
                continue
            batch_id = direct_batch_id(self._fid, desc.request_id)
            now = self._clock_ns()
            assign = encode(BatchAssign(batch_id=batch_id, requests=(desc,), dispatch_ns=now))
            if not route.sender.fits(len(assign)) or not route.lease.take():
                return False
            sent = encode(
                DirectSent(
                    instance_id=route.instance_id, batch_id=batch_id, dispatch_ns=now, request=desc
                )
            )
            # NOTE: before the batch: the worker's BatchDone is never read before it is sent.
            if not self._push(sent):
                self._send(sent)
            route.sender.send_bytes(assign)
            self.handed += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "request %d accepted for '%s' version %d, handed to instance %d",
                    desc.request_id,
                    desc.model,
                    desc.version,
                    route.instance_id,
                )
            return True
        return False

    def close(self) -> None:
        """Close every route."""
        for route in self._routes.values():
            with contextlib.suppress(Exception):
                route.close()
        self._routes.clear()
        self._by_version.clear()
