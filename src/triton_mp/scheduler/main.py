"""The scheduler process: its I/O shell around ``scheduler.core``.

``run_scheduler`` is the process entry. It owns the channels: the inbox (the supervisor's
ring, every frontend's, every worker's and every python worker's BLS ring into it) and a
ring to each worker, each frontend and each BLS client. ``SchedulerCore`` decides; this
module only reads, times and sends (``Router``).

The loop: block on the inbox semaphore until a message arrives or shortly before the
nearest batching deadline (``clock.wait_plan``; from there it polls its rings until the
deadline and tells the worker whose batch is due, ``BatchDue``), drain every ring, hand
every message to the core (``BatchDone`` first, ``done_first``), send what it returns, form
batches, send them. Before it waits it tells each worker whether its next ``BatchDone`` may
come without a wake-up (``SchedulerCore.quiet_done``, ``Router.quiet_done``), and the
frontends which models' requests may (``SchedulerCore.quiet_requests``,
``Router.quiet_requests``: those whose instances are all busy).
NOTE: the loop is synchronous on purpose: its only blocking point is one semaphore wait
with a timeout, which asyncio cannot await without a thread hop per wake-up.
"""

from __future__ import annotations

import logging
import operator
import os
import signal
from multiprocessing.connection import Connection

from triton_mp.common.process.log import configure_logging
from triton_mp.common.process.platform import set_timer_slack_ns
from triton_mp.ipc import Inbox, Sender, encode
from triton_mp.ipc.direct import Lease
from triton_mp.ipc.handshake import report_ready
from triton_mp.ipc.memory.notify import fence
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BatchDone,
    BatchDue,
    DirectSent,
    InstanceWiring,
    Requester,
    Shutdown,
    ToScheduler,
)
from triton_mp.ipc.protocol.specs import SchedulerSpec
from triton_mp.ipc.recordio.codec import Decoder
from triton_mp.ipc.recordio.quiet_requests import allowance_word
from triton_mp.ipc.tensor_pool import SegmentCache, free_block
from triton_mp.scheduler.assign_push import push_assign
from triton_mp.scheduler.core import SchedulerCore, deliver
from triton_mp.scheduler.forming import NOT_FORMING, Forming
from triton_mp.scheduler.limits.rate_limiter import RateLimiter
from triton_mp.scheduler.outbox import (
    Attach,
    Broadcast,
    Detach,
    Free,
    Outbound,
    Reply,
    ToInstance,
    Unmap,
)
from triton_mp.scheduler.policies.clock import (
    SCHEDULER_TIMER_SLACK_NS,
    Clock,
    MonotonicClock,
    WakeLead,
    wait_plan,
)

log = logging.getLogger(__name__)

INBOX_SPIN_S = 50e-6
"""How long the scheduler polls its wake-up before it sleeps (``ipc.channel.Inbox.wait``):
requests and BatchDones of a busy server arrive within tens of µs of each other, so most
are taken without a wake-up; the adaptive budget stops spinning when work comes seldom.
The spin watches posts only (``spin_on_posts``): a request for a busy model
(``scheduler.request_wakeups``) or a quiet ``BatchDone`` does not end it, and is read on
the pass the next post starts."""


class Router:
    """The scheduler's producer ends: a sender per worker, frontend and BLS client.

    Args:
        spec: the scheduler's spec (its frontends; workers join by ``Attach``).
        inbox: the scheduler's inbox (an attached worker's ring joins it).
    """

    def __init__(self, spec: SchedulerSpec, inbox: Inbox[ToScheduler]) -> None:
        self._inbox = inbox
        self._workers = {i: Sender(c.ring, c.wakeup) for i, c in spec.to_workers.items()}
        self._frontends = {i: Sender(c.ring, c.wakeup) for i, c in spec.to_frontends.items()}
        self._bls: dict[int, Sender] = {}
        """Per python worker instance id: the ring into its BLS client's inbox."""
        self._from_workers: dict[int, str] = {}
        self._replies = {Requester.FRONTEND: self._frontends, Requester.BLS: self._bls}
        self._arenas = SegmentCache()
        """Workers' arenas, attached to free ensemble steps' blocks (``Free``) only."""
        self._leases: dict[int, Lease] = {}
        """Per instance a frontend may hand requests to: its lease (``ipc.direct``)."""
        self._quiet: frozenset[int] = frozenset()
        """The instances whose ring's quiet flag is set (``quiet_done``)."""
        self._request_rings = tuple(spec.inbox.rings)
        """The rings the scheduler starts with: the supervisor's and every frontend's (the
        frontends read their quiet word as a mask of model buckets, ``quiet_requests``; the
        supervisor never reads it). Workers' rings join later (``Attach``)."""
        self._request_mask = 0
        """The quiet word last stored into ``_request_rings``."""
        self._forming = NOT_FORMING
        """The forming words last stored into ``_request_rings`` (``forming``)."""
        self._epoch = 0
        """The allowance's epoch last stored (``scheduler.forming``)."""
        self._due: dict[int, Sender] = {}
        """The senders ``send`` pushed to and ``flush`` has not woken yet, by ``id``."""
        # NOTE: every request wakes until this scheduler says otherwise.
        inbox.set_quiet_word(self._request_rings, 0)

    def quiet_done(self, quiet: frozenset[int]) -> bool:
        """Set each worker ring's quiet flag (``ipc.memory.ring.Ring.set_quiet``): set for the
        instances in ``quiet``, cleared for the others. True when a flag was cleared: the
        caller then rechecks the rings before it sleeps (a worker that read the flag still
        set pushed its ``BatchDone`` without a post); the fence is done here."""
        if quiet == self._quiet:
            return False
        asked = False
        was = self._quiet
        for iid, ring in self._from_workers.items():
            now = iid in quiet
            if now != (iid in was):
                self._inbox.set_quiet(ring, now)
                asked = asked or not now
        self._quiet = quiet
        if asked:
            fence()
        return asked

    def quiet_requests(self, mask: int) -> bool:
        """Store ``mask`` (``SchedulerCore.quiet_requests``) as the quiet word of every
        frontend's ring. True when a bit was cleared: the caller then rechecks the rings
        before it sleeps (a frontend that read the bit still set pushed its request
        without a post); the fence is done here."""
        was = self._request_mask
        if mask == was:
            return False
        self._inbox.set_quiet_word(self._request_rings, mask)
        self._request_mask = mask
        if was & ~mask:
            fence()
            return True
        return False

    @property
    def frontends(self) -> int:
        """How many frontends push requests (``SchedulerCore.forming``)."""
        return len(self._frontends)

    def forming(self, forming: Forming) -> bool:
        """Store ``forming`` (``SchedulerCore.forming``) as the forming words of every
        frontend's ring, under a new epoch. True when they changed: the caller then
        rechecks the rings before it sleeps (a frontend that read the old words, or counted
        under the old epoch, pushed its request without a post: ``scheduler.forming``);
        the fence is done here."""
        if forming == self._forming:
            return False
        self._epoch = (self._epoch + 1) & 0xFFFFFFFF
        self._inbox.set_forming(
            self._request_rings,
            forming.mask,
            allowance_word(self._epoch, forming.rows),
            forming.floor_ns,
        )
        self._forming = forming
        fence()
        return True

    def offer(self, instance_id: int) -> None:
        """Post an instance's lease (``scheduler.direct.Leases``)."""
        lease = self._leases.get(instance_id)
        if lease is not None:
            lease.offer()

    def take(self, instance_id: int) -> bool:
        """Take an instance's lease back; False when a frontend holds it."""
        lease = self._leases.get(instance_id)
        return lease is None or lease.take()

    def send(self, item: Outbound) -> None:
        """Send one outbound item (messages to unknown destinations are dropped).

        Raises:
            RecordTooLarge: the message does not fit its ring (``core.deliver`` handles it).
        """
        if isinstance(item, ToInstance):
            sender = self._workers.get(item.instance_id)
            if sender is not None:
                msg = item.msg
                if type(msg) is BatchDue and sender.consumer_quiet():
                    # NOTE: the worker polls for no due batch now (its batches are large,
                    # workers.due): the notice would only wake it for nothing.
                    return
                # NOTE: a plain batch is written into the ring in one C call
                # (scheduler.assign_push); anything else, or a full ring, as before.
                if type(msg) is not BatchAssign or not push_assign(sender.ring, msg):
                    sender.push_bytes(encode(msg))
                self._due[id(sender)] = sender
        elif isinstance(item, Reply):
            sender = self._replies[item.to.kind].get(item.to.id)
            if sender is not None:
                sender.push_bytes(encode(item.msg))
                self._due[id(sender)] = sender
        elif isinstance(item, Broadcast):
            data = encode(item.msg)
            for sender in self._frontends.values():
                sender.send_bytes(data)
        elif isinstance(item, Free):
            self._free(item)
        elif isinstance(item, Attach):
            self._attach(item.wiring)
        elif isinstance(item, Detach):
            self._detach(item.instance_id)
        elif isinstance(item, Unmap):
            self._arenas.drop(item.prefix)

    def flush(self) -> None:
        """Post one wake-up to each worker and requester that ``send`` pushed a record to
        since the last flush. The loop flushes at the end of each pass and before it polls:
        a worker woken mid-pass takes this vCPU from the scheduler (measured: 74 µs of wall
        time per post, 6 µs of CPU) and the rest of the pass runs after it, on a cold
        cache; posted last, the wake-up hands over a pass that is done."""
        due, self._due = self._due, {}
        for sender in due.values():
            sender.wake()

    def _free(self, item: Free) -> None:
        try:
            free_block(self._arenas.get(item.block.segment), item.block)
        except Exception as e:  # noqa: BLE001 - posix_ipc's errors are no OSError
            # NOTE: the worker stopped and unlinked its arena: nothing is left to free.
            log.debug("block %s not freed: %s", item.block, e)

    def _attach(self, w: InstanceWiring) -> None:
        # NOTE: a ring attached (again) has its flag cleared: forget what was set.
        self._quiet = self._quiet - {w.instance_id}
        self._workers[w.instance_id] = Sender(w.to_worker_ring, w.to_worker_wakeup)
        self._inbox.add_ring(w.from_worker_ring)
        self._from_workers[w.instance_id] = w.from_worker_ring
        if w.bls_client is not None:
            self._bls[w.instance_id] = Sender(w.bls_client.ring, w.bls_client.wakeup)
        if w.lease:
            self._leases[w.instance_id] = Lease(w.lease)

    def _detach(self, instance_id: int) -> None:
        self._quiet = self._quiet - {instance_id}
        lease = self._leases.pop(instance_id, None)
        if lease is not None:
            lease.close()
        for senders in (self._workers, self._bls):
            sender = senders.pop(instance_id, None)
            if sender is not None:
                if self._due.pop(id(sender), None) is not None:
                    sender.wake()  # NOTE: e.g. its Shutdown, pushed this pass
                sender.close()
        ring = self._from_workers.pop(instance_id, None)
        if ring is not None:
            # NOTE: what a stopped worker left behind (its last BatchDone) no longer matters.
            self._inbox.remove_ring(ring)

    def stop_workers(self) -> None:
        """Tell every worker still wired to stop."""
        for sender in self._workers.values():
            sender.send_bytes(encode(Shutdown()))


_DISPATCH_NS = operator.attrgetter("dispatch_ns")


def done_first(msgs: list[ToScheduler]) -> list[ToScheduler]:
    """One drain in the order the core handles it: the ``BatchDone`` s first, then the
    direct handoff's ``DirectSent`` notes, the rest in their order. A quiet ``BatchDone``
    (``scheduler.done_wakeups``) or a ``DirectSent`` (pushed without a wake-up, from any
    frontend's ring) may have waited since before the messages drained with it were sent:
    a statistics query, a worker's death, a request. Each of those sees the batch ended,
    as it would have had the message woken the scheduler.

    The ``DirectSent`` s go in the order their batches were handed (``dispatch_ns``, one
    monotonic clock for every process), not of the rings read: two frontends can hand the
    same instance a batch each while the scheduler sleeps (the second took the lease its
    worker re-offered after the first), and ``scheduler.direct`` learns which batch ended
    last, and so who holds the lease, from that order."""
    if len(msgs) < 2:
        return msgs
    first: list[ToScheduler] = [m for m in msgs if type(m) is BatchDone]
    sent = [m for m in msgs if type(m) is DirectSent]
    if len(sent) > 1:
        sent.sort(key=_DISPATCH_NS)
    first += sent
    if not first or (len(first) == len(msgs) and len(sent) < 2):
        return msgs
    return first + [m for m in msgs if type(m) is not BatchDone and type(m) is not DirectSent]


def _serve(
    core: SchedulerCore,
    inbox: Inbox[ToScheduler],
    router: Router,
    clock: Clock,
    lead: WakeLead | None = None,
) -> int:
    """The loop (module docstring) until a ``Shutdown``; returns how many passes it made
    (logged at the stop: ``bench/ab_interleaved.py`` divides them by the batches). ``lead``:
    how early it wakes before a batching deadline (a new ``WakeLead`` by default)."""
    passes = 0
    lead = lead or WakeLead()
    while True:
        passes += 1
        deadline, requests, quiet, forming = core.pass_words(router.frontends)
        # NOTE: the BatchDone of a model whose requests may wait unread wakes the
        # scheduler before a frontend can see its bit set (scheduler.request_wakeups).
        asked = router.quiet_done(quiet)
        asked = router.quiet_requests(requests) or asked
        asked = router.forming(forming) or asked
        # NOTE: planned after the pass's bookkeeping: a timeout measured from the pass's
        # start would end the sleep that much later than planned.
        now = clock.now_ns()
        sleep_s, poll_s = wait_plan(now, deadline, lead.lead_ns)
        if asked and inbox.has_pending():
            # NOTE: a BatchDone or a request pushed quietly before its flag or its bit was
            # cleared: no sleep.
            sleep_s, poll_s = 0.0, 0.0
        due = False
        if not poll_s:
            inbox.wait(sleep_s)
        elif deadline is not None and not (sleep_s and inbox.wait(sleep_s)):
            due = True
            # NOTE: the lead before a deadline began without a message: the workers whose
            # batch is due poll for it from now on, and so does this loop, to the deadline.
            deliver(core, core.due_notices(deadline), router.send, clock.now_ns())
            router.flush()
            polls_ns = clock.now_ns()
            if sleep_s:
                # NOTE: how late the poll starts against the plan: the sleep's lateness and
                # the notices' cost, which the next lead covers (WakeLead).
                lead.slept(polls_ns - now - round(sleep_s * 1e9))
            inbox.poll(max(0.0, (deadline - polls_ns) / 1e9))
        msgs = done_first(inbox.drain())
        now = clock.now_ns()
        deliver(core, core.handle_all(msgs, now), router.send, now)
        if core.deferred:
            # NOTE: a request for a version the scheduler does not know yet may have been
            # sent right after its activation, which this drain missed; drain once more.
            deliver(core, core.handle_all(inbox.drain(), now), router.send, now)
            deliver(core, core.retry_deferred(now), router.send, now)
        if core.stopping:
            router.flush()
            return passes
        now = clock.now_ns()
        deliver(core, core.dispatch(now), router.send, now)
        # NOTE: every post of the pass, last (Router.flush).
        router.flush()
        if due:
            # NOTE: the worker polling for the batch just sent may share this vCPU: it runs
            # now, not after the rest of this pass and the inbox's spin (measured at load 2:
            # the batch seen 30 µs after its push).
            os.sched_yield()


def run_scheduler(spec_bytes: bytes, ready: Connection) -> int:
    """Process entry of the scheduler.

    Args:
        spec_bytes: a msgpack-encoded ``SchedulerSpec``.
        ready: the pipe to the supervisor (``ipc.handshake``: Ready once the channels are
            attached).

    Returns:
        The process exit status (0 after a Shutdown message).
    """
    spec: SchedulerSpec = Decoder(SchedulerSpec).decode(spec_bytes)
    configure_logging("scheduler", "", spec.log.verbose, spec.log.format, levels=spec.log.levels)
    # NOTE: Ctrl-C reaches the whole process group; the supervisor orders the shutdown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inbox: Inbox[ToScheduler] = Inbox(
        spec.inbox.wakeup,
        spec.inbox.rings,
        ToScheduler,
        spin_max_s=INBOX_SPIN_S,
        spin_on_posts=True,
        native_records=True,
    )
    router = Router(spec, inbox)
    limiter = None
    if spec.rate_limit:
        limiter = RateLimiter((r.name, r.count, r.device) for r in spec.rate_limit_resources)
    core = SchedulerCore(spec.models, limiter)
    core.defer_unknown = True
    core.handoffs.leases = router
    # NOTE: the loop sleeps until batch deadlines; see set_timer_slack_ns for why.
    set_timer_slack_ns(SCHEDULER_TIMER_SLACK_NS)
    report_ready(ready, "scheduler", "scheduler")
    log.info("scheduler ready: %d model versions", len(spec.models))
    passes = _serve(core, inbox, router, MonotonicClock())
    router.stop_workers()
    log.info("scheduler stopped after %d passes", passes)
    inbox.close()
    return 0
