"""Per model-version statistics kept by the scheduler (Triton's ModelStatistics).

Imported by ``scheduler.main``; pure bookkeeping, no I/O. Counting rules follow Triton
(core ``infer_stats.cc``, triton.md §1.4):

- per successful request: ``success`` (request end-to-end), ``queue``, ``compute_input``,
  ``compute_infer``, ``compute_output`` each get count 1 and that request's duration (a
  request in a batch is charged the whole batch's compute durations);
- ``inference_count`` += the request's batch size; ``execution_count`` += 1 per batch;
- ``batch_stats[batch size]``: count 1 per execution and the execution's durations;
- failed requests: ``fail`` count 1 and their end-to-end duration;
- response cache (``CacheOutcome``): a hit counts in ``success`` and ``queue`` and in
  ``cache_hit``, never in compute, inference or execution counts; a miss adds its lookup
  and insertion time to ``success`` and ``cache_miss`` (``UpdateSuccessCacheHit/Miss``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import msgspec

from triton_mp.ipc.protocol.messages import CacheOutcome
from triton_mp.ipc.protocol.reports import BatchStats, ModelStats


class StatsBook:
    """ModelStats for every model version the scheduler serves."""

    def __init__(self, keys: Iterable[tuple[str, int]]) -> None:
        self._stats: dict[tuple[str, int], ModelStats] = {
            (m, v): ModelStats(name=m, version=v) for m, v in keys
        }

    def add(self, model: str, version: int) -> None:
        """Start the books of a version loaded at run time (kept when it is reloaded)."""
        self._stats.setdefault((model, version), ModelStats(name=model, version=version))

    def remove(self, model: str, version: int) -> None:
        """Drop the books of an unloaded version."""
        self._stats.pop((model, version), None)

    def record_execution(
        self,
        model: str,
        version: int,
        *,
        requests: int,
        arrivals_ns: int,
        dispatch_ns: int,
        inferences: int,
        total_batch_size: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
        end_ns: int,
    ) -> None:
        """One batch ran; its successful requests are counted as a whole (the same sums as
        one ``add`` per request: each request's success is ``end_ns - arrival``, its queue
        ``dispatch_ns - arrival``).

        Args:
            requests: how many of its requests succeeded.
            arrivals_ns: the sum of their ``arrival_ns`` (monotonic ns).
            dispatch_ns: when the batch left the queue (monotonic ns).
            inferences: the sum of their batch sizes (``inference_count``).
            total_batch_size: sum of batch sizes in the execution (its batch_stats key).
            compute_*_ns: the execution's phase durations in nanoseconds.
            end_ns: when the worker finished (monotonic ns).
        """
        st = self._stats.get((model, version))
        if st is None:
            return
        n_ok = requests
        if n_ok:
            st.success.add(end_ns * n_ok - arrivals_ns, n_ok)
            st.queue.add(dispatch_ns * n_ok - arrivals_ns, n_ok)
            st.inference_count += inferences
            st.compute_input.add(compute_input_ns * n_ok, n_ok)
            st.compute_infer.add(compute_infer_ns * n_ok, n_ok)
            st.compute_output.add(compute_output_ns * n_ok, n_ok)
        st.execution_count += 1
        st.last_inference_ms = time.time_ns() // 1_000_000
        bs = st.batch_stats.get(total_batch_size)
        if bs is None:
            bs = st.batch_stats[total_batch_size] = BatchStats(batch_size=total_batch_size)
        bs.compute_input.add(compute_input_ns)
        bs.compute_infer.add(compute_infer_ns)
        bs.compute_output.add(compute_output_ns)

    def record_failure(
        self, model: str, version: int, arrival_ns: int, end_ns: int, reason: str = "OTHER"
    ) -> None:
        """A request ended in an error after it reached the scheduler.

        Args:
            reason: Triton's failure reason (``nv_inference_request_failure{reason}``):
                ``REJECTED``, ``CANCELED``, ``BACKEND`` or ``OTHER``.
        """
        st = self._stats.get((model, version))
        if st is not None:
            st.fail.add(end_ns - arrival_ns)
            st.fail_reasons[reason] = st.fail_reasons.get(reason, 0) + 1

    def record_cache(self, model: str, version: int, outcome: CacheOutcome) -> None:
        """A frontend's response-cache lookup (``CacheOutcome``): a hit counts as a
        successful request that never queued or ran; a miss adds its cache time."""
        st = self._stats.get((model, version))
        if st is None:
            return
        if outcome.hit:
            st.success.add(outcome.request_ns)
            st.queue.add(outcome.queue_ns)
            st.cache_hit.add(outcome.cache_ns)
            st.last_inference_ms = time.time_ns() // 1_000_000
        else:
            st.success.ns += outcome.cache_ns
            st.cache_miss.add(outcome.cache_ns)

    def snapshot(self, model: str = "", version: int = -1) -> tuple[ModelStats, ...]:
        """Copies of the stats of one model (all versions when ``version`` < 0) or of all."""
        return tuple(
            _copy(st)
            for (m, v), st in sorted(self._stats.items())
            if (not model or m == model) and (version < 0 or v == version)
        )


def _copy(st: ModelStats) -> ModelStats:
    """A deep copy, so a reply never changes after it was taken."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(st), type=ModelStats)
