"""``StatsBook`` counts batches lazily (``scheduler.stats``): any sequence of recordings,
loads, unloads, cache outcomes and reads gives the same Triton statistics as counting each
batch when it ends.

The reference below is the eager book as it was before the lazy one (each
``record_execution`` adds into the ``ModelStats`` at once); both read one fake wall clock,
so ``last_inference_ms`` is compared too. Every field of every snapshot is compared: the
statistics extension's fields, and what the metrics and ``triton-mp stat`` are made of.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from triton_mp.ipc.protocol.messages import CacheOutcome
from triton_mp.ipc.protocol.reports import BatchStats, ModelStats
from triton_mp.scheduler.stats import StatsBook

KEYS = (("a", 1), ("a", 2), ("b", 1))


class EagerBook:
    """The eager reference: every call changes the ``ModelStats`` at once."""

    def __init__(self, keys: tuple[tuple[str, int], ...], clock: Callable[[], int]) -> None:
        self.stats = {k: ModelStats(name=k[0], version=k[1]) for k in keys}
        self.clock = clock

    def add(self, model: str, version: int) -> None:
        self.stats.setdefault((model, version), ModelStats(name=model, version=version))

    def remove(self, model: str, version: int) -> None:
        self.stats.pop((model, version), None)

    def record_execution(self, key: tuple[str, int], *args: int) -> None:
        n_ok, arrivals, dispatch, inferences, size, c_in, c_inf, c_out, end = args
        # NOTE: read once per call, counted or not, as the lazy book reads it: both books
        # then see the same fake times (the old code read it only for a counted batch).
        now_ms = self.clock() // 1_000_000
        st = self.stats.get(key)
        if st is None:
            return
        if n_ok:
            st.success.add(end * n_ok - arrivals, n_ok)
            st.queue.add(dispatch * n_ok - arrivals, n_ok)
            st.inference_count += inferences
            st.compute_input.add(c_in * n_ok, n_ok)
            st.compute_infer.add(c_inf * n_ok, n_ok)
            st.compute_output.add(c_out * n_ok, n_ok)
        st.execution_count += 1
        st.last_inference_ms = now_ms
        bs = st.batch_stats.setdefault(size, BatchStats(batch_size=size))
        bs.compute_input.add(c_in)
        bs.compute_infer.add(c_inf)
        bs.compute_output.add(c_out)

    def record_failure(self, model: str, version: int, arrival: int, end: int, why: str) -> None:
        st = self.stats.get((model, version))
        if st is not None:
            st.fail.add(end - arrival)
            st.fail_reasons[why] = st.fail_reasons.get(why, 0) + 1

    def record_cache(self, model: str, version: int, outcome: CacheOutcome) -> None:
        st = self.stats.get((model, version))
        if st is None:
            return
        if outcome.hit:
            st.success.add(outcome.request_ns)
            st.queue.add(outcome.queue_ns)
            st.cache_hit.add(outcome.cache_ns)
            st.last_inference_ms = self.clock() // 1_000_000
        else:
            st.success.ns += outcome.cache_ns
            st.cache_miss.add(outcome.cache_ns)

    def snapshot(self, model: str, version: int) -> list[ModelStats]:
        return [
            st
            for (m, v), st in sorted(self.stats.items())
            if (not model or m == model) and (version < 0 or v == version)
        ]


def wall_clock() -> Callable[[], int]:
    """A fake wall clock (ns): a new millisecond (almost) on every read. Each book reads
    its own, so both see the same times when they read it alike."""
    return itertools.count(1_700_000_000_000_000_000, 1_000_123).__next__


keys = st.sampled_from(KEYS + (("c", 1),))
small = st.integers(0, 10**9)
executions = st.tuples(
    st.just("exec"), keys, st.integers(0, 8), small, small, st.integers(0, 64),
    st.integers(1, 64), small, small, small, small,
)  # fmt: skip
failures = st.tuples(st.just("fail"), keys, small, small,
                     st.sampled_from(("BACKEND", "OTHER", "REJECTED", "CANCELED")))  # fmt: skip
caches = st.tuples(st.just("cache"), keys, st.booleans(), small, small, small)
loads = st.tuples(st.sampled_from(("add", "remove")), keys)
reads = st.tuples(st.just("snap"), st.sampled_from(("", "a", "b", "c")), st.integers(-1, 2))
operations = st.lists(st.one_of(executions, executions, failures, caches, loads, reads))


@settings(max_examples=400, deadline=None)
@given(ops=operations, fold_every=st.sampled_from((1, 2, 3, 7, 1024)))
def test_lazy_statistics_equal_eager_ones(ops: list[tuple], fold_every: int) -> None:
    eager = EagerBook(KEYS, wall_clock())
    lazy = StatsBook(KEYS, fold_every=fold_every)
    with mock.patch("triton_mp.scheduler.stats.time.time_ns", wall_clock()):
        for op in ops:
            kind, *args = op
            if kind == "exec":
                key, *nums = args
                eager.record_execution(key, *nums)
                lazy.record_execution(key, *nums)
            elif kind == "fail":
                (m, v), arrival, end, why = args
                eager.record_failure(m, v, arrival, end, why)
                lazy.record_failure(m, v, arrival, end, why)
            elif kind == "cache":
                (m, v), hit, request_ns, queue_ns, cache_ns = args
                outcome = CacheOutcome(
                    model=m, version=v, hit=hit, request_ns=request_ns, queue_ns=queue_ns,
                    cache_ns=cache_ns,
                )  # fmt: skip
                eager.record_cache(m, v, outcome)
                lazy.record_cache(m, v, outcome)
            elif kind in ("add", "remove"):
                getattr(eager, kind)(*args[0])
                getattr(lazy, kind)(*args[0])
            else:
                assert list(lazy.snapshot(*args)) == eager.snapshot(*args)
        assert list(lazy.snapshot()) == eager.snapshot("", -1)


def test_a_batch_is_counted_by_the_next_read_without_a_fold_threshold() -> None:
    """One batch, far below ``fold_every``: the next snapshot counts it."""
    book = StatsBook([("m", 1)], fold_every=1_000_000)
    book.record_execution(("m", 1), 2, 10, 30, 2, 2, 5, 7, 11, 100)
    (st_,) = book.snapshot("m", 1)
    assert (st_.execution_count, st_.inference_count) == (1, 2)
    assert (st_.success.count, st_.success.ns) == (2, 2 * 100 - 10)
    assert (st_.queue.count, st_.queue.ns) == (2, 2 * 30 - 10)
    assert st_.batch_stats[2].compute_infer.ns == 7


def test_a_batch_of_an_unloaded_version_is_not_counted_when_it_is_loaded_again() -> None:
    """Recorded while the version is not counted, a batch stays uncounted, as it was when
    batches were counted at once (the book folds before a version is added)."""
    book = StatsBook([], fold_every=1_000_000)
    book.record_execution(("m", 1), 1, 0, 0, 1, 1, 1, 1, 1, 1)
    book.add("m", 1)
    (st_,) = book.snapshot("m", 1)
    assert st_.execution_count == 0
