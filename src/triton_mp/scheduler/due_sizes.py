"""Which idle instances get a ``BatchDue``: those whose recent batches were small.

Imported by ``scheduler.core`` (``SchedulerCore.due_notices``). After a ``BatchDue`` the
worker polls its inbox for the batch (``workers.due``) instead of sleeping on its
semaphore; that poll pays where latency is the goal (a lone request waits for the wake-up)
but, on a quiet machine, spends a core for its whole length once per batch, which under
load (a batch's requests share one wake-up; the 2 cores are what limits) costs more than
the wake-up it saves. This module is the one place that rule lives: the scheduler keeps,
per instance, the running mean of the batch sizes it handed that instance (``SIZE_WEIGHT``)
and notices only an instance whose mean is at most ``POLL_MAX_REQUESTS``. A loaded
instance gets no notice, so nothing is encoded, pushed or posted for it, and its worker
sleeps until the batch's own post. The worker polls after every notice it gets.
"""

from __future__ import annotations

POLL_MAX_REQUESTS = 4
"""An instance is noticed only while its recent batches held at most this many requests
on average (``SIZE_WEIGHT``). Measured (add_sub_py, load ~11, instrumented worker, s15wrk):
at c=16 (batches of ~10) 67% of the batches came after a notice and the worker's poll lasted
127 µs per notice (~85 µs per batch, ~8.5 µs per inference on a quiet machine); at c=1
(batches of 1) it lasts ~110 µs per batch and keeps p50 at 0.80x Triton's. The notice itself
costs the scheduler ~18-24 µs per batch (walk, encode, push, post; s15sch)."""

SIZE_WEIGHT = 0.25
"""The weight of the last batch in the running mean of batch sizes that
``POLL_MAX_REQUESTS`` bounds. On the last batch alone, 7-27% of c=16's batches (sizes
spread around ~10) still followed one of at most 4 requests and were polled for ~116 µs
each (instrumented, load 5-8)."""


class BatchSizes:
    """Per instance id: the running mean of the sizes (requests per ``BatchAssign``) of
    the batches it was handed, scheduler-formed or a frontend's direct handoff alike (the
    same batches its worker reads). 0 before the first batch."""

    __slots__ = ("_mean",)

    def __init__(self) -> None:
        self._mean: dict[int, float] = {}

    def sent(self, instance_id: int, requests: int) -> None:
        """``instance_id`` was handed a batch of ``requests`` requests."""
        mean = self._mean.get(instance_id, 0.0)
        self._mean[instance_id] = mean + SIZE_WEIGHT * (requests - mean)

    def mean(self, instance_id: int) -> float:
        """The running mean of ``instance_id``'s batch sizes (requests)."""
        return self._mean.get(instance_id, 0.0)

    def polls(self, instance_id: int) -> bool:
        """Whether ``instance_id``'s worker should be told a batch is due (module
        docstring): its recent batches held at most ``POLL_MAX_REQUESTS`` on average."""
        return self._mean.get(instance_id, 0.0) <= POLL_MAX_REQUESTS

    def forget(self, instance_id: int) -> None:
        """``instance_id`` is gone."""
        self._mean.pop(instance_id, None)
