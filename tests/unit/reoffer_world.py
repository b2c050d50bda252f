"""A process-free model of one leased instance, its worker, two frontend processes and the
scheduler, for the worker's lease re-offer (``ipc.direct.worker_reoffers``) and the
scheduler's count of its posts (``scheduler.direct.Handoffs._posts``).

Imported by tests only. The scheduler is the real ``SchedulerCore`` on the recording harness
with ``test_direct_handoff``'s fake lease; around it each process is a small state machine
whose steps are the real process's atomic ones, so a schedule (a list of step names) replays
one interleaving:

- ``f0`` / ``f1``: the frontend's next step of ``frontend.dispatch.direct.DirectRoutes.hand``:
  the clock read for ``dispatch_ns``; the ``sem_trywait`` of the lease (with none on offer the
  request goes onto its ring to the scheduler instead); the ``DirectSent`` pushed onto that
  ring; the batch pushed into the worker's inbox;
- ``run+`` / ``run-``: the worker runs its next batch, then posts the lease (``+``) or not;
  ``done``: it pushes that batch's ``BatchDone`` (``reoffered`` when it posted);
- ``read``: the scheduler's next step of its loop (``scheduler.main._serve``): the read of one
  ring, in ``Inbox.drain``'s order (frontend 0's, frontend 1's, the worker's), so the others
  may run between two reads of one drain; then the drain handled (``done_first``,
  ``handle_all``); then the pass (``dispatch``: take backs and offers);
- ``wait``: the clock moves on by ``CLAIM_TIMEOUT_NS``, as when a frontend stalls between its
  take and its ``DirectSent``, or the scheduler between a drain's read and its pass.

``finish`` runs what is left to the end, the scheduler reading whole drains; ``check`` says
what went wrong. Each error is a string; an empty list is a correct run.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field

import msgspec
import posix_ipc

from tests.unit.scheduler_harness import US, Harness, fe
from tests.unit.test_direct_handoff import DELAYED, NODELAY
from triton_mp.ipc.direct import Lease, SelfOffer, create_lease
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BatchDone,
    DirectSent,
    InferRequest,
    WorkerReady,
    direct_batch_id,
)
from triton_mp.scheduler.direct import CLAIM_TIMEOUT_NS
from triton_mp.scheduler.main import done_first

IID = 0
"""The instance (``nodelay``'s instance 1 never starts)."""
_TEMPLATE = msgspec.structs.replace(Harness(models=(DELAYED,)).request("delayed"), model="nodelay")
"""A request of ``nodelay`` (made by a harness of another model, where it is queued)."""


class _Lease:
    """Instance ``IID``'s lease: a real one (``ipc.direct.Lease``, a POSIX semaphore of this
    process, unlinked at once), as the scheduler's ``Leases``, a frontend's take and the
    worker's re-offer (``SelfOffer``: always quiet, never woken) see it. One per process,
    taken to 0 for each new ``World`` (the last one created owns it)."""

    _one: _Lease | None = None

    def __init__(self) -> None:
        name = create_lease(f"/triton_mp_test_world_{os.getpid()}")
        try:
            self._lease = Lease(name)
            self.worker = SelfOffer(name, lambda: True, lambda: False)
        finally:
            posix_ipc.unlink_semaphore(name)
        self.reposts = 0
        """The scheduler's posts that found the lease posted (``Lease.offer`` makes none)."""
        self.owner: object = None

    @classmethod
    def fresh(cls, owner: object) -> _Lease:
        """The process's lease, not posted, owned by ``owner`` from now on."""
        if cls._one is None:
            cls._one = _Lease()
        one = cls._one
        while one.take(IID):
            pass
        one.reposts, one.owner = 0, owner
        return one

    @property
    def value(self) -> dict[int, int]:
        return {IID: self._lease._sem.value}

    def offer(self, instance_id: int) -> None:
        assert instance_id == IID
        if self._lease.offered():
            self.reposts += 1
        self._lease.offer()

    def take(self, instance_id: int) -> bool:
        assert instance_id == IID
        return self._lease.take()

    frontend_take = take


@dataclass
class _Frontend:
    fid: int
    left: int
    """Requests this frontend has yet to start."""
    state: str = "idle"
    """idle -> stamped -> took -> sent -> idle (or stamped -> idle: sent to the scheduler)."""
    stamp_ns: int = 0
    sent: DirectSent | None = None


@dataclass
class World:
    """The model (module docstring); ``requests`` per frontend."""

    requests: tuple[int, int] = (1, 1)
    h: Harness = field(init=False)
    frontends: list[_Frontend] = field(init=False)
    rings: list[list[object]] = field(init=False)
    """The scheduler's inbox, in ``Inbox.drain`` order: frontend 0, frontend 1, the worker."""
    inbox: deque[BatchAssign] = field(init=False)
    """The worker's: batches handed to it, in order."""
    ran: BatchDone | None = None
    """The worker's batch that ran and whose ``BatchDone`` is not pushed yet."""
    drain: list[object] | None = None
    next_ring: int = 0
    handled: bool = False
    waited: bool = False
    """A ``wait`` ran: a claim may have expired, and two batches may be handed to the
    instance by design (the scheduler took the frontend that held it for dead)."""
    total: int = field(init=False)
    errors: list[str] = field(default_factory=list)
    taken: list[int] = field(default_factory=list)
    """The direct batches in the order their frontends took the lease (the worker's)."""
    drains: list[list[int]] = field(default_factory=list)
    """Per drain the scheduler handled: the direct batches whose ``DirectSent`` it read."""

    def __post_init__(self) -> None:
        self.h = Harness(models=(NODELAY,), frontend_ids=(0, 1))
        self.lease = _Lease.fresh(self)
        self.h.core.handoffs.leases = self.lease
        self.h.send_worker = self._to_worker
        self.frontends = [_Frontend(i, n) for i, n in enumerate(self.requests)]
        self.rings = [[], [], []]
        self.inbox = deque()
        self.total = sum(self.requests)
        self.ids = 1000
        self.h.handle(WorkerReady(instance_id=IID, pid=1000))
        self.h.dispatch()
        assert self.lease.value == {IID: 1}

    # ------------------------------------------------------------ the processes
    def _to_worker(self, instance_id: int, msg: object) -> None:
        self.h.to_workers.append((instance_id, msg))
        if isinstance(msg, BatchAssign):
            assert instance_id == IID
            self._assign(msg)

    def _assign(self, batch: BatchAssign) -> None:
        held = batch.batch_id >= 0 and any(f.state in ("took", "sent") for f in self.frontends)
        if (self.inbox or held) and not self.waited:
            self.errors.append(f"batch {batch.batch_id} handed to an instance already handed one")
        self.inbox.append(batch)

    def _frontend(self, f: _Frontend) -> bool:
        h = self.h
        if f.state == "idle":
            if not f.left:
                return False
            f.left -= 1
            f.stamp_ns = h.now
            f.state = "stamped"
        elif f.state == "stamped":
            self.ids += 1
            req = self._request(f.fid)
            if self.lease.frontend_take(IID):
                bid = direct_batch_id(f.fid, req.request_id)
                f.sent = DirectSent(
                    instance_id=IID, batch_id=bid, dispatch_ns=f.stamp_ns, request=req
                )
                self.taken.append(bid)
                f.state = "took"
            else:
                self.rings[f.fid].append(req)
                f.state = "idle"
        elif f.state == "took":
            assert f.sent is not None
            self.rings[f.fid].append(f.sent)
            f.state = "sent"
        else:
            assert f.sent is not None
            s = f.sent
            self._assign(BatchAssign(batch_id=s.batch_id, requests=(s.request,), dispatch_ns=0))
            f.sent, f.state = None, "idle"
        return True

    def _request(self, fid: int) -> InferRequest:
        """A request of ``nodelay`` from frontend ``fid``."""
        return msgspec.structs.replace(
            _TEMPLATE, request_id=self.ids, reply_to=fe(fid), arrival_ns=self.h.now
        )

    def _run(self, post: bool) -> bool:
        if self.ran is not None or not self.inbox:
            return False
        batch = self.inbox.popleft()
        if post:
            posted = self.lease.value[IID]
            post = self.lease.worker.after_batch(False)
            if posted and not self.waited:
                self.errors.append(f"the worker found the lease posted after {batch.batch_id}")
        self._lease_once()
        h = self.h
        self.ran = BatchDone(
            instance_id=IID,
            batch_id=batch.batch_id,
            start_ns=h.now,
            compute_input_ns=1 * US,
            compute_infer_ns=5 * US,
            compute_output_ns=2 * US,
            end_ns=h.now + 8 * US,
            reoffered=post,
        )
        return True

    def _done(self) -> bool:
        if self.ran is None:
            return False
        self.rings[2].append(self.ran)
        self.ran = None
        return True

    def _read(self) -> bool:
        self._read_step()
        self._count_agrees()
        return True

    def _read_step(self) -> None:
        h = self.h
        if self.drain is None:
            self.drain, self.next_ring = [], 0
        if self.next_ring < len(self.rings):
            self.drain += self.rings[self.next_ring]
            self.rings[self.next_ring] = []
            self.next_ring += 1
        elif not self.handled:
            self.drains.append([m.batch_id for m in self.drain if isinstance(m, DirectSent)])
            h.deliver(h.core.handle_all(done_first(self.drain), h.now))  # type: ignore[arg-type]
            self.handled = True
        else:
            reposts = self.lease.reposts
            h.dispatch()
            self._lease_once()
            if self.lease.reposts != reposts and not self.waited:
                self.errors.append("the scheduler posted a posted lease")
            self.drain, self.handled = None, False

    def _lease_once(self) -> None:
        posted = self.lease.value[IID]
        if posted > 1:
            self.errors.append(f"the lease is posted {posted} times")

    def step(self, name: str) -> bool:
        """Run one step; False when it cannot run now (nothing changed)."""
        assert self.lease.owner is self, "a World created later owns the lease"
        self.h.clock.advance_us(1)
        if name in ("f0", "f1"):
            return self._frontend(self.frontends[int(name[1])])
        if name in ("run+", "run-"):
            return self._run(name == "run+")
        if name == "done":
            return self._done()
        if name == "wait":
            self.waited = True
            self.h.clock.advance_us(CLAIM_TIMEOUT_NS // 1000)
            return True
        assert name == "read", name
        return self._read()

    def _count_agrees(self) -> None:
        """The scheduler's count of posts (``Handoffs._posts``) is never above 1, and an
        instance is offered exactly while it is above 0, unless a take back failed."""
        handoffs = self.h.core.handoffs
        posts = handoffs._posts.get(IID, 0)
        if posts > 1:
            self.errors.append(f"{posts} posts counted")
        claimed = IID in handoffs.claimed
        if not claimed and (IID in handoffs.offered) != (posts > 0):
            self.errors.append(f"offered {handoffs.offered} with {posts} posts counted")

    def moves(self) -> list[str]:
        """The steps that can run now (the scheduler's always can)."""
        out = [f"f{f.fid}" for f in self.frontends if f.state != "idle" or f.left]
        if self.ran is None and self.inbox:
            out += ["run+", "run-"]
        if self.ran is not None:
            out.append("done")
        return [*out, "read"]

    def settled(self) -> bool:
        """Nothing left to run or read: only the scheduler's idle passes can follow."""
        return (
            self.moves() == ["read"]
            and self.drain is None
            and not any(self.rings)
            and not self.h.core.handoffs.stale
        )

    # ------------------------------------------------------------ the end
    def finish(self) -> None:
        """Everything left runs to its end; the worker posts nothing more, the scheduler
        reads whole drains, and a claim may expire (which ``check`` reports)."""
        for _ in range(50):
            busy = False
            for f in self.frontends:
                while f.state != "idle" or f.left:
                    busy = self._frontend(f) or busy
            while self._run(False) or self._done():
                busy = True
            while self.drain is not None:
                self._read()
            for _ in range(len(self.rings) + 2):
                self._read()
            if not busy and not any(self.rings) and not self.inbox and self.ran is None:
                if not self.h.core.handoffs.claimed:
                    return
                self.errors.append("a claim on the lease expired (a 1 s stall)")
                self.h.clock.advance_us(CLAIM_TIMEOUT_NS // 1000)

    def key(self) -> tuple[object, ...]:
        """What the rest of a schedule depends on (request ids and the order of the
        ``dispatch_ns`` stamps, not the clock): two schedules that reach one key go on alike."""
        pending = [m for r in (*self.rings, self.drain or []) for m in r]
        stamps = [m.dispatch_ns for m in pending if isinstance(m, DirectSent)]
        stamps += [f.stamp_ns for f in self.frontends if f.state != "idle"]
        rank = {s: i for i, s in enumerate(sorted(set(stamps)))}

        def said(m: object) -> tuple[object, ...]:
            if isinstance(m, DirectSent):
                return ("sent", m.batch_id, rank[m.dispatch_ns])
            if isinstance(m, BatchDone):
                return ("done", m.batch_id, m.reoffered)
            assert isinstance(m, InferRequest)
            return ("request", m.request_id)

        handoffs = self.h.core.handoffs
        inst = self.h.core.lifecycle.instances.get(IID)
        assert inst is not None
        assert inst.generation is not None
        return (
            self.lease.value[IID],
            tuple(
                (f.state, f.left, rank.get(f.stamp_ns) if f.state != "idle" else None)
                for f in self.frontends
            ),
            tuple(tuple(said(m) for m in r) for r in self.rings),
            None if self.drain is None else tuple(said(m) for m in self.drain),
            self.next_ring,
            self.handled,
            tuple(b.batch_id for b in self.inbox),
            self.ran and (self.ran.batch_id, self.ran.reoffered),
            tuple(sorted(handoffs._posts.items())),
            tuple(sorted(handoffs.offered)),
            tuple(sorted(handoffs.claimed)),
            tuple((i, tuple(s.batch_id for s in q)) for i, q in handoffs._after.items()),
            tuple(sorted(handoffs._early)),
            inst.batch and inst.batch.batch_id,
            inst.leased,
            inst.generation.policy.queue_depth(),
            self.h.stats("nodelay").inference_count,
            tuple(self.errors),
        )

    def read_late(self) -> bool:
        """Whether a drain read the ``DirectSent`` of a batch before that of one that ran
        earlier, read by a later drain (r7's case: the scheduler preempted between two
        rings' reads while a batch ran and another was handed)."""
        seen: list[int] = []
        for drain in self.drains:
            for bid in drain:
                if any(self.taken.index(bid) < self.taken.index(s) for s in seen):
                    return True
            seen += drain
        return False

    def check(self) -> list[str]:
        """What went wrong: the errors seen on the way, then the end state's."""
        h, out = self.h, list(self.errors)
        handoffs = h.core.handoffs
        st = h.stats("nodelay")
        if st.inference_count != self.total:
            out.append(f"counted {st.inference_count} of {self.total} requests")
        if h.failures():
            out.append(f"failed: {h.failures()}")
        inst = h.core.lifecycle.instances.get(IID)
        if inst is None or inst.batch is not None or inst.leased:
            out.append("the instance is not idle at the end")
        posted = self.lease.value[IID]
        if (IID in handoffs.offered) != bool(posted):
            out.append(f"lease {posted}, offered {handoffs.offered}")
        return out
