"""What a ``BatchDone`` moves on: its instance idles, its batch counts in the statistics,
an ensemble's steps learn their compute times, an iterative sequence queues its next step.

Imported by ``scheduler.core`` (its ``BatchDone`` handler, and a direct batch's end,
``scheduler.direct``); pure: no I/O and no clock. Per batch, not per request: the sums
run in C (``map`` over the requests), and the requests are walked one by one only for an
ensemble's steps, an iterative model's sequences and the failed ones.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import msgspec

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import BatchDone, Requester
from triton_mp.ipc.recordio.records import Request, as_request
from triton_mp.scheduler.direct import Handoffs
from triton_mp.scheduler.ensembles import Ensembles
from triton_mp.scheduler.instances import Generation, InFlight, Instance, InstanceTable
from triton_mp.scheduler.lifecycle import STOPPING_MESSAGE
from triton_mp.scheduler.outbox import Outbox
from triton_mp.scheduler.policies.policy import IterativeSteps
from triton_mp.scheduler.stats import StatsBook

_ARRIVAL = operator.attrgetter("arrival_ns")
_BATCH_SIZE = operator.attrgetter("batch_size")


class BatchEnds:
    """The core's ``BatchDone`` handler.

    Args:
        instances, handoffs, stats, ensembles, out: the core's parts it moves on.
        release: frees an instance's rate-limiter resources ``(instance_id, now_ns)``.
        offer: queues a request in its generation's policy ``(gen, req, now_ns, again)``
            (``again``: first in its iterative sequence).
        stopping: whether a ``Shutdown`` arrived (rescheduled requests fail then).
        promote: runs an instance's staged batch once its batch ended; False when none was
            staged (``scheduler.staging.Stager.promote``).
    """

    def __init__(
        self,
        instances: InstanceTable,
        handoffs: Handoffs,
        stats: StatsBook,
        ensembles: Ensembles,
        out: Outbox,
        release: Callable[[int, int], None],
        offer: Callable[[Generation, Request, int, bool], None],
        stopping: Callable[[], bool],
        promote: Callable[[Instance], bool],
    ) -> None:
        self._instances = instances
        self.handoffs = handoffs
        self.stats = stats
        self.ensembles = ensembles
        self._out = out
        self._release = release
        self._offer = offer
        self._stopping = stopping
        self._promote = promote

    def on_done(self, msg: BatchDone, now_ns: int) -> None:
        """An instance ended its batch ``msg.batch_id`` (a stale one is ignored, or kept for
        the direct handoff's batch whose ``DirectSent`` was not read yet); a direct batch
        that waited for it starts (``Handoffs.batch_ended``), and ends too when its own
        ``BatchDone`` was read first."""
        done: BatchDone | None = msg
        while done is not None:
            inst = self._instances.get(done.instance_id)
            flight = None if inst is None else inst.batch
            if inst is None or flight is None or flight.batch_id != done.batch_id:
                if inst is not None:
                    # NOTE: a direct batch whose DirectSent this pass has not read yet.
                    self.handoffs.early_done(done)
                return
            inst.batch = None
            self._end(inst, flight, done, now_ns)
            # NOTE: a batch staged behind it runs now; a direct batch waits for it too.
            staged = self._promote(inst)
            done = self.handoffs.batch_ended(inst, done.reoffered, now_ns, not staged)

    def _end(self, inst: Instance, flight: InFlight, msg: BatchDone, now_ns: int) -> None:
        """``inst``'s batch ``flight`` ended with ``msg``: statistics, resources, steps."""
        reqs = flight.requests
        failed, again = msg.failed, msg.rescheduled
        if failed or again:
            gone = {*failed, *again}
            ok: Sequence[Request] = [r for i, r in enumerate(reqs) if i not in gone]
        else:
            ok = reqs  # NOTE: the common case: no per-request work but the sums below.
        # NOTE: per batch: C-level sums over the requests, no Python loop per request.
        arrivals = sum(map(_ARRIVAL, ok))
        inferences = sum(map(_BATCH_SIZE, ok))
        inst.executions += 1
        self._release(msg.instance_id, now_ns)
        self.handoffs.touch(inst.generation)
        # NOTE: positional (StatsBook.record_execution's order: key, requests, arrivals,
        # dispatch, inferences, batch size, the three compute phases, end).
        self.stats.record_execution(
            inst.key,
            len(ok),
            arrivals,
            # NOTE: a staged batch was queued until its worker started it (scheduler.staging).
            max(flight.dispatch_ns, msg.start_ns) if flight.staged else flight.dispatch_ns,
            inferences,
            flight.total_batch_size,
            msg.compute_input_ns,
            msg.compute_infer_ns,
            msg.compute_output_ns,
            msg.end_ns,
        )
        for i in set(failed):
            r = reqs[i]
            self.stats.record_failure(r.model, r.version, r.arrival_ns, msg.end_ns, "BACKEND")
        if self.ensembles.counting():
            # NOTE: only an ensemble's step requests answer to the ensemble scheduler.
            compute = (msg.compute_input_ns, msg.compute_infer_ns, msg.compute_output_ns)
            for r in reqs:
                if r.reply_to.kind is Requester.ENSEMBLE:
                    self.ensembles.on_executed(r.request_id, compute, now_ns)
        gen = inst.generation
        if gen is not None and gen.policy.iterative_steps is not None:
            self._release_iterative(gen, gen.policy.iterative_steps, reqs, set(again), now_ns)
        if not self._stopping() and gen is not None and inst.behind is None:
            gen.policy.instance_idle(msg.instance_id, now_ns)

    def _release_iterative(
        self,
        gen: Generation,
        steps: IterativeSteps,
        reqs: Sequence[Request],
        again: set[int],
        now_ns: int,
    ) -> None:
        """After a batch of an iterative sequence model: each request the model released
        with ``RELEASE_RESCHEDULE`` is queued again first in its sequence with no flags
        (core ``IterativeSequencer::RescheduleRequest``; while stopping it fails as queued
        requests do); every other one ends its sequence."""
        for i, r in enumerate(reqs):
            if i not in again:
                steps.finish(r.sequence_id, now_ns)
            elif self._stopping():
                self._out.fail(r, ErrorCode.UNAVAILABLE, STOPPING_MESSAGE, now_ns)
            else:
                again_req = msgspec.structs.replace(as_request(r), sequence_flags=0)
                self._offer(gen, again_req, now_ns, True)
