"""A version reloaded as a new model: Triton's statistics start again, its Prometheus
counters go on (``scheduler.model_reloads``, ``StatsBook.restart``; core
``ModelLifeCycle::AsyncLoad`` / ``ConfigChangeRequiresReload``)."""

from __future__ import annotations

import json

from triton_mp.ipc.protocol.messages import CacheOutcome
from triton_mp.scheduler.model_reloads import is_new_model
from triton_mp.scheduler.stats import StatsBook

BASE = {"name": "m", "max_batch_size": 8, "instance_group": [{"count": 1}]}


def _is_new(**changes: object) -> bool:
    return is_new_model(json.dumps(BASE), json.dumps({**BASE, **changes}))


def test_an_instance_group_or_version_policy_change_is_an_update_in_place() -> None:
    assert not _is_new(instance_group=[{"count": 2}])
    assert not _is_new(version_policy={"all": {}})
    assert not _is_new(instance_group=[{"count": 3}], version_policy={"latest": {}})


def test_any_other_change_or_none_is_a_new_model() -> None:
    assert _is_new(max_batch_size=4)
    assert _is_new(parameters={"note": {"string_value": "x"}}, instance_group=[{"count": 2}])
    assert _is_new()  # same config replaced: its files changed
    ensemble = {**BASE, "platform": "ensemble"}
    assert is_new_model(json.dumps(ensemble), json.dumps({**ensemble, "version_policy": {}}))


def _book() -> StatsBook:
    book = StatsBook((("m", 1), ("n", 1)))
    # key, requests, arrivals, dispatch, inferences, batch size, c_in, c_infer, c_out, end
    book.record_execution(("m", 1), 2, 10, 20, 3, 3, 1, 5, 1, 40)
    book.record_failure("m", 1, 0, 7, "BACKEND")
    book.record_execution(("n", 1), 1, 0, 1, 1, 1, 1, 1, 1, 2)
    return book


def test_a_restart_starts_the_statistics_again_and_keeps_the_totals() -> None:
    book = _book()
    book.restart("m", 1)
    (since,) = book.snapshot("m", 1, since_load=True)
    assert (since.inference_count, since.execution_count, since.last_inference_ms) == (0, 0, 0)
    assert (since.success.count, since.fail.count, since.batch_stats, since.fail_reasons) == (
        0,
        0,
        {},
        {},
    )
    (total,) = book.snapshot("m", 1)
    assert (total.inference_count, total.success.count, total.fail_reasons) == (
        3,
        2,
        {"BACKEND": 1},
    )
    assert book.snapshot("n", 1, since_load=True) == book.snapshot("n", 1)


def test_what_runs_after_a_restart_counts_from_it() -> None:
    book = _book()
    book.restart("m", 1)
    book.record_execution(("m", 1), 1, 100, 110, 1, 1, 2, 3, 4, 150)
    book.record_cache(
        "m", 1, CacheOutcome(model="m", version=1, hit=False, request_ns=0, queue_ns=0, cache_ns=5)
    )
    (since,) = book.snapshot("m", 1, since_load=True)
    assert (since.inference_count, since.execution_count) == (1, 1)
    assert (since.success.count, since.success.ns) == (1, 50 + 5)
    assert (since.queue.count, since.queue.ns) == (1, 10)
    assert list(since.batch_stats) == [1]
    assert since.batch_stats[1].compute_infer.ns == 3
    assert since.last_inference_ms > 0
    assert since.cache_miss.count == 1
    (total,) = book.snapshot("m", 1)
    assert (total.inference_count, total.execution_count, sorted(total.batch_stats)) == (
        4,
        2,
        [1, 3],
    )


def test_an_unload_forgets_the_restart() -> None:
    book = _book()
    book.restart("m", 1)
    book.remove("m", 1)
    book.add("m", 1)
    book.record_execution(("m", 1), 1, 0, 1, 1, 1, 1, 1, 1, 2)
    assert book.snapshot("m", 1, since_load=True) == book.snapshot("m", 1)
