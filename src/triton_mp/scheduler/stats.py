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
from itertools import compress
from operator import mul

import msgspec

from triton_mp.ipc.protocol.messages import CacheOutcome
from triton_mp.ipc.protocol.reports import BatchStats, ModelStats, StatDuration

FOLD_EVERY = 256
"""How many batches ``StatsBook.record_execution`` keeps unfolded at most (a bound on the
memory a server that is never asked for statistics holds, ~0.2 KiB per batch, and on the
one pass that folds them: ~0.1 ms hot at 256)."""

_Execution = tuple[tuple[str, int], int, int, int, int, int, int, int, int, int, int]
"""One batch as ``record_execution`` keeps it until ``fold``: (model, version), then its
arguments in order, then ``time.time_ns()`` when it was recorded."""


class StatsBook:
    """ModelStats for every model version the scheduler serves.

    Batches are counted lazily: ``record_execution`` (once per batch, on the scheduler's hot
    loop) keeps its arguments in a list, and ``fold`` adds them into the ``ModelStats`` in
    order before anything reads or changes what they depend on: ``snapshot`` (the
    statistics extension, the metrics, ``triton-mp stat``), ``add`` (which versions are
    counted), ``record_cache`` (which sets ``last_inference_ms`` too), and
    every ``fold_every`` batches. ``record_failure`` touches only ``fail`` and
    ``fail_reasons``, which no batch touches, and stays eager. So every reply is the one an
    eager book would give (tests/unit/test_stats_lazy.py); a batch costs one tuple on the
    hot loop (in process: 1.4 -> ~0.5 µs per batch; the fold runs hot, many batches at once).

    Args:
        keys: the (model, version) counted from the start.
        fold_every: fold once this many batches wait (``FOLD_EVERY``).
    """

    def __init__(self, keys: Iterable[tuple[str, int]], fold_every: int = FOLD_EVERY) -> None:
        self._stats: dict[tuple[str, int], ModelStats] = {
            (m, v): ModelStats(name=m, version=v) for m, v in keys
        }
        self._pending: list[_Execution] = []
        self._fold_every = max(1, fold_every)
        self._baselines: dict[tuple[str, int], ModelStats] = {}
        """Per version reloaded as a new model: its totals when that model took over."""

    def add(self, model: str, version: int) -> None:
        """Start the books of a version loaded at run time (kept when it is reloaded)."""
        self.fold()
        self._stats.setdefault((model, version), ModelStats(name=model, version=version))

    def remove(self, model: str, version: int) -> None:
        """Drop the books of an unloaded version (its batches not folded yet are dropped at
        the fold: ``add`` folds before it starts the books again)."""
        self._stats.pop((model, version), None)
        self._baselines.pop((model, version), None)

    def restart(self, model: str, version: int) -> None:
        """The version was reloaded as a new model (``scheduler.model_reloads``): Triton's
        statistics extension counts from 0 again, the totals (Prometheus counters) go on."""
        self.fold()
        st = self._stats.get((model, version))
        if st is not None:
            self._baselines[(model, version)] = _copy(st)

    def record_execution(
        self,
        key: tuple[str, int],
        requests: int,
        arrivals_ns: int,
        dispatch_ns: int,
        inferences: int,
        total_batch_size: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
        end_ns: int,
        /,
    ) -> None:
        """One batch ran; its successful requests are counted as a whole (the same sums as
        one count per request: each request's success is ``end_ns - arrival``, its queue
        ``dispatch_ns - arrival``). Kept until ``fold`` (class docstring); a version not
        counted by then is not counted.

        Args:
            key: the (model, version) that ran it.
            requests: how many of its requests succeeded.
            arrivals_ns: the sum of their ``arrival_ns`` (monotonic ns).
            dispatch_ns: when the batch left the queue (monotonic ns).
            inferences: the sum of their batch sizes (``inference_count``).
            total_batch_size: sum of batch sizes in the execution (its batch_stats key).
            compute_*_ns: the execution's phase durations in nanoseconds.
            end_ns: when the worker finished (monotonic ns).
        """
        pending = self._pending
        pending.append(
            (
                key,
                requests,
                arrivals_ns,
                dispatch_ns,
                inferences,
                total_batch_size,
                compute_input_ns,
                compute_infer_ns,
                compute_output_ns,
                end_ns,
                time.time_ns(),
            )
        )
        if len(pending) >= self._fold_every:
            self.fold()

    def fold(self) -> None:
        """Count every batch ``record_execution`` kept, as if each had been counted when it
        was recorded (Triton's rules, module docstring): per version, C-level sums over the
        batches' columns; ``batch_stats`` sizes keep the order they first ran in."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        by_key: dict[tuple[str, int], list[_Execution]] = {}
        for item in pending:
            runs = by_key.get(item[0])
            if runs is None:
                by_key[item[0]] = [item]
            else:
                runs.append(item)
        for key, runs in by_key.items():
            st = self._stats.get(key)
            if st is not None:
                _fold_into(st, runs)

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
        self.fold()  # NOTE: a hit sets last_inference_ms, as every batch before it did
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

    def snapshot(
        self, model: str = "", version: int = -1, *, since_load: bool = False
    ) -> tuple[ModelStats, ...]:
        """Copies of the stats of one model (all versions when ``version`` < 0) or of all.

        Args:
            since_load: count from when each version's current model loaded (Triton's
                statistics extension: a reload as a new model starts again at 0), not from
                when the version was first loaded (the Prometheus counters).
        """
        self.fold()
        base = self._baselines if since_load else {}
        return tuple(
            _copy(st) if (m, v) not in base else _since(st, base[(m, v)])
            for (m, v), st in sorted(self._stats.items())
            if (not model or m == model) and (version < 0 or v == version)
        )


def _fold_into(st: ModelStats, runs: list[_Execution]) -> None:
    """Add the batches ``runs`` of one version (in the order they ran) into ``st``: the same
    sums as ``record_execution``'s rules applied batch by batch."""
    _, oks, arrivals, dispatches, inferences, sizes, c_ins, c_infs, c_outs, ends, walls = zip(
        *runs, strict=True
    )
    n = sum(oks)
    if n:
        # NOTE: a batch none of whose requests succeeded adds to no request statistic.
        arrived = sum(compress(arrivals, oks))
        st.success.add(sum(map(mul, ends, oks)) - arrived, n)
        st.queue.add(sum(map(mul, dispatches, oks)) - arrived, n)
        st.inference_count += sum(compress(inferences, oks))
        st.compute_input.add(sum(map(mul, c_ins, oks)), n)
        st.compute_infer.add(sum(map(mul, c_infs, oks)), n)
        st.compute_output.add(sum(map(mul, c_outs, oks)), n)
    st.execution_count += len(runs)
    st.last_inference_ms = walls[-1] // 1_000_000
    per_size: dict[int, list[int]] = {}
    for size, c_in, c_infer, c_out in zip(sizes, c_ins, c_infs, c_outs, strict=True):
        acc = per_size.get(size)
        if acc is None:
            per_size[size] = [1, c_in, c_infer, c_out]
        else:
            acc[0] += 1
            acc[1] += c_in
            acc[2] += c_infer
            acc[3] += c_out
    for size, (count, c_in, c_infer, c_out) in per_size.items():
        bs = st.batch_stats.get(size)
        if bs is None:
            bs = st.batch_stats[size] = BatchStats(batch_size=size)
        bs.compute_input.add(c_in, count)
        bs.compute_infer.add(c_infer, count)
        bs.compute_output.add(c_out, count)


def _copy(st: ModelStats) -> ModelStats:
    """A deep copy, so a reply never changes after it was taken."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(st), type=ModelStats)


def _minus(a: StatDuration, b: StatDuration) -> StatDuration:
    return StatDuration(a.count - b.count, a.ns - b.ns)


def _since(st: ModelStats, base: ModelStats) -> ModelStats:
    """What ``st`` counted after ``base`` was taken from it (``last_inference_ms`` 0 when
    nothing ran and no cache hit was answered since; batch sizes and failure reasons not
    seen since left out)."""
    batches = {}
    for size, bs in st.batch_stats.items():
        was = base.batch_stats.get(size, BatchStats(batch_size=size))
        if bs.compute_infer.count > was.compute_infer.count:
            batches[size] = BatchStats(
                size,
                _minus(bs.compute_input, was.compute_input),
                _minus(bs.compute_infer, was.compute_infer),
                _minus(bs.compute_output, was.compute_output),
            )
    ran = st.execution_count > base.execution_count or st.cache_hit.count > base.cache_hit.count
    reasons = {r: n - base.fail_reasons.get(r, 0) for r, n in st.fail_reasons.items()}
    return ModelStats(
        name=st.name,
        version=st.version,
        last_inference_ms=st.last_inference_ms if ran else 0,
        inference_count=st.inference_count - base.inference_count,
        execution_count=st.execution_count - base.execution_count,
        success=_minus(st.success, base.success),
        fail=_minus(st.fail, base.fail),
        queue=_minus(st.queue, base.queue),
        compute_input=_minus(st.compute_input, base.compute_input),
        compute_infer=_minus(st.compute_infer, base.compute_infer),
        compute_output=_minus(st.compute_output, base.compute_output),
        batch_stats=batches,
        fail_reasons={r: n for r, n in reasons.items() if n},
        cache_hit=_minus(st.cache_hit, base.cache_hit),
        cache_miss=_minus(st.cache_miss, base.cache_miss),
    )
