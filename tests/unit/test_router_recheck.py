"""``Router.recheck``: before it sleeps, the scheduler's loop looks for records pushed without
a post only in the rings whose quiet flag, quiet word or forming words the pass cleared or
changed (``scheduler.main``). A quiet ``BatchDone`` of an instance that stays quiet waits for
the next post, as it would had it come during the sleep; one in a ring whose flag was just
cleared, or a request in a frontend ring whose words changed, ends the wait at once (real
rings and semaphores, no process)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.helpers.ring_channel import ring_channel
from triton_mp.ipc import Inbox, Sender, encode
from triton_mp.ipc.memory.notify import Waiter
from triton_mp.ipc.protocol.messages import InstanceWiring, Shutdown, ToScheduler
from triton_mp.ipc.protocol.specs import ChannelSpec, InboxSpec, LogSpec, SchedulerSpec
from triton_mp.ipc.recordio.quiet_requests import model_bit
from triton_mp.scheduler.forming import NOT_FORMING, Forming
from triton_mp.scheduler.main import Router
from triton_mp.scheduler.outbox import Attach

ADD_SUB = model_bit("add_sub")
RECORD = encode(Shutdown())
"""Any record: the recheck decodes nothing, it only asks whether a ring holds one."""


class Wired:
    """A router over one frontend's request ring and two workers' rings (ids 0 and 1)."""

    def __init__(self, stack: ExitStack) -> None:
        self.request_ring, wakeup = stack.enter_context(ring_channel("recheck_in", 1 << 16))
        frontend = stack.enter_context(ring_channel("recheck_f0", 1 << 12))
        spec = SchedulerSpec(
            models=(),
            inbox=InboxSpec(wakeup, (self.request_ring,)),
            to_workers={},
            to_frontends={0: ChannelSpec(*frontend)},
            log=LogSpec(),
        )
        self.inbox: Inbox[ToScheduler] = Inbox(
            wakeup, [self.request_ring], ToScheduler, spin_on_posts=True
        )
        stack.callback(self.inbox.close)
        self.router = Router(spec, self.inbox)
        self.waiter = Waiter(wakeup)
        stack.callback(self.waiter.close)
        self.senders: dict[int, Sender] = {-1: Sender(self.request_ring, wakeup)}
        for iid in (0, 1):
            ring, _ = stack.enter_context(ring_channel(f"recheck_w{iid}", 1 << 12))
            to_worker, to_wakeup = stack.enter_context(ring_channel(f"recheck_t{iid}", 1 << 12))
            wiring = InstanceWiring(
                instance_id=iid,
                name=f"add_sub_{iid}",
                model="add_sub",
                version=1,
                to_worker_ring=to_worker,
                to_worker_wakeup=to_wakeup,
                from_worker_ring=ring,
            )
            self.router.send(Attach(wiring))
            self.senders[iid] = Sender(ring, wakeup)
        for s in self.senders.values():
            stack.callback(s.close)


@pytest.fixture
def wired() -> Iterator[Wired]:
    with ExitStack() as stack:
        yield Wired(stack)


def test_a_quiet_done_of_an_instance_still_quiet_waits_for_the_next_post(wired: Wired) -> None:
    r = wired.router
    assert not r.quiet_done(frozenset({0, 1}))  # flags set: nothing cleared
    assert not wired.senders[0].send_lazy(RECORD)  # quiet: no post
    # the batch for the other instance left: the forming words change (a new epoch)
    assert r.forming(Forming(ADD_SUB, 3, 1000))
    assert not r.recheck()  # only the frontend ring was changed, and it is empty
    assert not wired.waiter.posted()
    assert wired.inbox.has_pending()  # read on the pass the next post starts
    assert not r.forming(Forming(ADD_SUB, 3, 1000))
    assert not r.recheck()  # nothing changed since: nothing to look at


def test_a_record_in_a_ring_whose_flag_or_words_were_cleared_ends_the_wait(
    wired: Wired,
) -> None:
    r = wired.router
    r.quiet_done(frozenset({0, 1}))
    assert not wired.senders[1].send_lazy(RECORD)  # pushed while 1 was quiet
    assert r.quiet_done(frozenset({0}))  # 1's flag cleared: its ring is looked at
    assert r.recheck()
    wired.inbox.drain()
    assert not r.recheck()  # each recheck looks at what changed since the last one
    r.forming(Forming(ADD_SUB, 3, 1000))
    wired.senders[-1].push_bytes(RECORD)  # a request counted under the old epoch
    assert r.forming(NOT_FORMING)
    assert r.recheck()
    wired.inbox.drain()
    r.quiet_requests(ADD_SUB)
    wired.senders[-1].push_bytes(RECORD)  # pushed quietly while add_sub was busy
    assert r.quiet_requests(0)  # the bit cleared: every request wakes again
    assert r.recheck()


def test_the_recheck_ignores_a_worker_ring_detached_since(wired: Wired) -> None:
    r = wired.router
    r.quiet_done(frozenset({0, 1}))
    wired.senders[0].send_lazy(RECORD)
    assert r.quiet_done(frozenset({1}))
    r._detach(0)  # its worker stopped: its ring left the inbox
    assert not r.recheck()
