"""The scheduler posts its pass's wake-ups last (``scheduler.main.Router.flush``): what
``Router.send`` pushes is in the consumer's ring at once, its post comes with the next
flush, one per consumer however many records the pass pushed to it, and a consumer
detached mid-pass is posted before its handle closes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.helpers.ring_channel import ring_channel
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc import Inbox
from triton_mp.ipc.memory.notify import Waiter, Wakeup
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.protocol.messages import (
    ErrorInfo,
    ReplyTo,
    Requester,
    RequestFailed,
    Shutdown,
    ToScheduler,
)
from triton_mp.ipc.protocol.specs import ChannelSpec, InboxSpec, LogSpec, SchedulerSpec
from triton_mp.scheduler.main import Router
from triton_mp.scheduler.outbox import Detach, Reply, ToInstance

Channel = tuple[str, Wakeup]


@pytest.fixture
def wired() -> Iterator[tuple[Router, Channel, Channel]]:
    """A router with one worker (instance 0) and one frontend (id 0), each a ring and a
    semaphore; yields (router, the worker's channel, the frontend's channel)."""
    with ExitStack() as stack:
        inbox_ring, inbox_wakeup = stack.enter_context(ring_channel("flush_in", 1 << 14))
        worker = stack.enter_context(ring_channel("flush_w0", 1 << 14))
        frontend = stack.enter_context(ring_channel("flush_f0", 1 << 14))
        spec = SchedulerSpec(
            models=(),
            inbox=InboxSpec(inbox_wakeup, (inbox_ring,)),
            to_workers={0: ChannelSpec(*worker)},
            to_frontends={0: ChannelSpec(*frontend)},
            log=LogSpec(),
        )
        inbox: Inbox[ToScheduler] = Inbox(inbox_wakeup, [inbox_ring], ToScheduler)
        stack.callback(inbox.close)
        yield Router(spec, inbox), worker, frontend


def _posts(channel: Channel) -> int:
    waiter = Waiter(channel[1])
    try:
        n = 0
        while waiter.posted():
            waiter.consume()
            n += 1
        return n
    finally:
        waiter.close()


def _records(channel: Channel) -> int:
    ring = Ring.attach(channel[0])
    try:
        return len(ring.pop_all())
    finally:
        ring.close()


def test_a_pass_posts_once_per_consumer_at_its_flush(
    wired: tuple[Router, Channel, Channel],
) -> None:
    router, worker, frontend = wired
    failed = RequestFailed(request_id=1, error=ErrorInfo(ErrorCode.UNAVAILABLE, "no", "test"))
    router.send(ToInstance(0, Shutdown()))
    router.send(ToInstance(0, Shutdown()))
    router.send(Reply(ReplyTo(Requester.FRONTEND, 0), failed))
    assert (_posts(worker), _posts(frontend)) == (0, 0)
    router.flush()
    assert (_posts(worker), _posts(frontend)) == (1, 1)
    assert (_records(worker), _records(frontend)) == (2, 1)
    router.flush()
    assert (_posts(worker), _posts(frontend)) == (0, 0)


def test_a_worker_detached_mid_pass_is_posted_before_its_handle_closes(
    wired: tuple[Router, Channel, Channel],
) -> None:
    router, worker, _frontend = wired
    router.send(ToInstance(0, Shutdown()))
    router.send(Detach(0))
    assert _posts(worker) == 1
    router.flush()  # NOTE: the closed handle is not posted again
    assert _posts(worker) == 0
