"""``triton-mp analyze``'s pure pieces: the sweep space, the searches, constraints,
objectives, the Pareto front, the recommendation and the checkpoint. No process, no server:
results are made up here."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from triton_mp.analyze.sweep import checkpoint
from triton_mp.analyze.sweep.pareto import (
    Constraints,
    pareto_front,
    parse_objectives,
    recommend,
    scores,
)
from triton_mp.analyze.sweep.results import Measurement, ProcessMemory, Result
from triton_mp.analyze.sweep.search import BruteSearch, ChainSearch, QuickSearch
from triton_mp.analyze.sweep.space import (
    Point,
    SearchSpace,
    Variant,
    expected,
    served_variant,
    shipped_variant,
    variant_config,
    variants,
)

BASE = {
    "name": "m",
    "max_batch_size": 8,
    "instance_group": [{"name": "m_0", "count": 1, "kind": "KIND_CPU", "gpus": []}],
    "dynamic_batching": {
        "preferred_batch_size": [8],
        "max_queue_delay_microseconds": 100,
        "priority_levels": 2,
    },
}


def _m(tput: float, p99_ms: float, mem_mib: int = 100, error: str | None = None) -> Measurement:
    return Measurement(
        throughput_per_s=tput,
        p50_us=p99_ms * 500,
        p95_us=p99_ms * 900,
        p99_us=p99_ms * 1000,
        processes=(ProcessMemory(role="worker", name="m_0_0", pid=1, rss_bytes=mem_mib << 20),),
        error=error,
    )


def _v(count: int = 1, mbs: int = 8, dyn: bool = True, delay: int = 0) -> Variant:
    return Variant(
        instance_count=count, max_batch_size=mbs, dynamic_batching=dyn, max_queue_delay_us=delay
    )


# ------------------------------------------------------------------------- space
def test_variants_sweep_every_combination_once() -> None:
    space = SearchSpace(
        instance_counts=(1, 2),
        max_batch_sizes=(1, 8),
        dynamic_batching=(True, False),
        max_queue_delays_us=(0, 500),
        preferred=((), (4, 16)),
    )
    vs = variants(space, 8)
    assert len(vs) == len(set(vs))
    # per count: mbs 1 -> dyn (delay forced 0, no preferred) + off = 2; mbs 8 -> 2 delays x
    # 2 preferred + off = 5
    assert len(vs) == 2 * (2 + 5)
    assert (
        Variant(
            instance_count=2,
            max_batch_size=8,
            dynamic_batching=True,
            preferred_batch_sizes=(4,),
            max_queue_delay_us=500,
        )
        in vs
    )
    assert all(v.preferred_batch_sizes in ((), (4,)) for v in vs)


def test_a_model_that_does_not_batch_sweeps_instances_only() -> None:
    vs = variants(SearchSpace(instance_counts=(1, 2, 3)), 0)
    assert vs == [_v(c, 0, False) for c in (1, 2, 3)]


def test_variant_config_applies_the_variant_and_keeps_the_rest() -> None:
    v = Variant(
        instance_count=3,
        max_batch_size=4,
        dynamic_batching=True,
        preferred_batch_sizes=(2,),
        max_queue_delay_us=700,
    )
    cfg = variant_config(BASE, v)
    assert cfg["instance_group"] == [{"count": 3, "kind": "KIND_CPU", "gpus": []}]
    assert cfg["max_batch_size"] == 4
    assert cfg["dynamic_batching"] == {
        "preferred_batch_size": [2],
        "max_queue_delay_microseconds": 700,
        "priority_levels": 2,
    }
    assert "dynamic_batching" not in variant_config(BASE, _v(dyn=False))
    assert BASE["instance_group"][0]["count"] == 1  # the base is not changed
    assert variant_config(BASE, shipped_variant(BASE)) == BASE


def test_the_served_config_is_compared_with_triton_defaults_spelled_out() -> None:
    v = _v(2, 8, True, 300)
    served = variant_config(BASE, v)
    served["dynamic_batching"]["preferred_batch_size"] = [8]  # Triton's NormalizeModelConfig
    assert served_variant(served) == expected(v)
    assert served_variant(variant_config(BASE, _v(dyn=True))) != expected(_v(dyn=False))
    s = shipped_variant(BASE)
    assert (s.instance_count, s.max_batch_size, s.max_queue_delay_us, s.shipped) == (
        1,
        8,
        100,
        True,
    )
    assert s.key() == "shipped"
    assert Point(variant=v, concurrency=4).key() == "i2_b8_dyn300@c4"


# ------------------------------------------------------------------------- searches
def _drive(search, measure) -> list[Point]:
    seen = []
    while (p := search.next_point()) is not None:
        seen.append(p)
        search.record(Result(point=p, measurement=measure(p)))
    return seen


def test_brute_measures_every_variant_at_rising_concurrency() -> None:
    vs = [_v(1), _v(2)]
    seen = _drive(BruteSearch(vs, [4, 1, 2], Constraints()), lambda p: _m(100 * p.concurrency, 1))
    assert [(p.variant.instance_count, p.concurrency) for p in seen] == [
        (1, 1),
        (1, 2),
        (1, 4),
        (2, 1),
        (2, 2),
        (2, 4),
    ]


def test_brute_stops_a_variant_when_concurrency_stops_paying() -> None:
    tput = {1: 100, 2: 200, 4: 203, 8: 204, 16: 500}
    seen = _drive(
        BruteSearch([_v()], [1, 2, 4, 8, 16], Constraints()), lambda p: _m(tput[p.concurrency], 1)
    )
    assert [p.concurrency for p in seen] == [1, 2, 4, 8]  # 4 and 8 each gained < 5%


def test_brute_stops_a_variant_past_the_latency_budget_or_on_failure() -> None:
    budget = Constraints(latency_budget_ms=10)
    seen = _drive(
        BruteSearch([_v(1), _v(2)], [1, 2, 4], budget),
        lambda p: _m(
            100 * p.concurrency, 6 * p.concurrency if p.variant.instance_count == 1 else 1
        ),
    )
    assert [(p.variant.instance_count, p.concurrency) for p in seen] == [
        (1, 1),
        (1, 2),
        (2, 1),
        (2, 2),
        (2, 4),
    ]
    seen = _drive(
        BruteSearch([_v(1), _v(2)], [1, 2], Constraints()), lambda p: _m(0, 0, error="load failed")
    )
    assert [(p.variant.instance_count, p.concurrency) for p in seen] == [(1, 1), (2, 1)]


def test_brute_planned_counts_down() -> None:
    s = BruteSearch([_v(1), _v(2)], [1, 2], Constraints())
    assert s.planned() == 4
    p = s.next_point()
    s.record(Result(point=p, measurement=_m(1, 1)))
    assert s.planned() == 3


def test_quick_search_climbs_to_the_best_point_and_stops() -> None:
    space = SearchSpace(
        instance_counts=(1, 2, 3),
        max_batch_sizes=(1, 4, 16),
        max_queue_delays_us=(0,),
        concurrencies=(1, 2, 4, 8),
    )

    def measure(p: Point) -> Measurement:  # best at 2 instances, mbs 4, concurrency 4
        v = p.variant
        score = (
            1000
            - 100 * abs(v.instance_count - 2)
            - 100 * abs(v.max_batch_size - 4) ** 0.5
            - 50 * abs(p.concurrency - 4)
        )
        return _m(score, 1)

    search = QuickSearch(space, 16, Constraints(), {"throughput": 1.0}, max_points=50)
    seen = _drive(search, measure)
    best = max(seen, key=lambda p: measure(p).throughput_per_s)
    assert (best.variant.instance_count, best.variant.max_batch_size, best.concurrency) == (2, 4, 4)
    assert len(seen) == len(set(seen)) < 3 * 3 * 4  # fewer points than the brute grid
    assert seen[0] == search.point_at((0, 0, 0, 0))


def test_quick_search_respects_max_points_and_prefers_feasible() -> None:
    space = SearchSpace(
        instance_counts=(1, 2, 4),
        max_batch_sizes=(8,),
        max_queue_delays_us=(0,),
        concurrencies=(1, 2, 4, 8, 16),
    )
    budget = Constraints(latency_budget_ms=5)
    # throughput rises with concurrency, but only concurrency <= 2 is within the budget
    measure = lambda p: _m(100 * p.concurrency, 2 * p.concurrency)  # noqa: E731
    seen = _drive(QuickSearch(space, 8, budget, {"throughput": 1.0}, max_points=50), measure)
    assert max(p.concurrency for p in seen) == 4  # stepped once past the budget, then stopped
    seen = _drive(QuickSearch(space, 8, Constraints(), {"throughput": 1.0}, max_points=3), measure)
    assert len(seen) == 3


def test_chain_runs_searches_in_turn() -> None:
    chain = ChainSearch(
        [
            BruteSearch([shipped_variant(BASE)], [1], Constraints()),
            BruteSearch([_v()], [1, 2], Constraints()),
        ]
    )
    assert chain.planned() == 3
    seen = _drive(chain, lambda p: _m(100 * p.concurrency, 1))
    assert [p.key() for p in seen] == ["shipped@c1", "i1_b8_dyn0@c1", "i1_b8_dyn0@c2"]


# ------------------------------------------------------------------------- constraints
def test_constraints_name_each_violation() -> None:
    c = Constraints(latency_budget_ms=10, min_throughput_per_s=50, max_memory_bytes=64 << 20)
    assert c.feasible(_m(60, 9, 60))
    assert c.violations(_m(40, 11, 100)) == [
        "p99 11.0 ms > 10 ms",
        "40.0/s < 50/s",
        "memory 100 MiB > 64 MiB",
    ]
    assert not c.feasible(_m(0, 0, error="boom"))


def test_objectives_parse_and_weigh() -> None:
    assert parse_objectives("throughput:2, latency") == {"throughput": 2.0, "latency": 1.0}
    for bad in ("speed", "throughput:0", ""):
        with pytest.raises(ValueError, match="objective"):
            parse_objectives(bad)
    ms = [_m(100, 10), _m(50, 5)]
    assert scores(ms, {"throughput": 1}) == [1.0, 0.5]
    assert scores(ms, {"latency": 1}) == [0.5, 1.0]
    assert scores(ms, {"throughput": 3, "latency": 1}) == [3.5, 2.5]


def test_pareto_front_keeps_the_non_dominated() -> None:
    rs = [
        Result(point=Point(variant=_v(i), concurrency=1), measurement=m)
        for i, m in enumerate(
            [_m(100, 10), _m(50, 5), _m(40, 6), _m(100, 10, 200), _m(0, 0, error="x")], 1
        )
    ]
    assert [r.point.variant.instance_count for r in pareto_front(rs)] == [1, 2]


def test_recommend_ranks_variants_by_their_best_feasible_point() -> None:
    def r(v: Variant, c: int, tput: float, p99: float) -> Result:
        return Result(point=Point(variant=v, concurrency=c), measurement=_m(tput, p99))

    rs = [
        r(_v(1), 1, 100, 5),
        r(_v(1), 8, 400, 50),
        r(_v(2), 1, 150, 4),
        r(_v(2), 8, 300, 20),
        r(_v(3), 1, 10, 60),
    ]
    recs = recommend(rs, Constraints(latency_budget_ms=30), {"throughput": 1.0}, top=5)
    assert [(x.result.point.variant.instance_count, x.result.point.concurrency) for x in recs] == [
        (2, 8),
        (1, 1),
    ]
    assert all(x.result.measurement.p99_us <= 30_000 for x in recs)
    assert recommend(rs, Constraints(latency_budget_ms=1), {"throughput": 1.0}, top=3) == []
    assert len(recommend(rs, Constraints(), {"throughput": 1.0}, top=1)) == 1


# ------------------------------------------------------------------------- checkpoint
def test_checkpoint_round_trips_and_refuses_other_settings(tmp_path: Path) -> None:
    path = tmp_path / "ck.json"
    settings = {"model": "m", "window_ms": 500}
    ck = checkpoint.load(path, settings)
    assert ck.results == []
    res = Result(point=Point(variant=_v(2), concurrency=4), measurement=_m(10, 1))
    ck.results.append(res)
    ck.configs["i2_b8_dyn0"] = {"name": "m"}
    checkpoint.save(path, ck)
    again = checkpoint.load(path, settings)
    assert again.results == [res]
    assert again.configs == {"i2_b8_dyn0": {"name": "m"}}
    assert not (tmp_path / "ck.json.tmp").exists()
    with pytest.raises(checkpoint.CheckpointError, match="other settings"):
        checkpoint.load(path, {**settings, "window_ms": 600})
    path.write_text("{not json")
    with pytest.raises(checkpoint.CheckpointError, match="unreadable"):
        checkpoint.load(path, settings)


def test_a_resumed_search_asks_only_for_the_points_not_measured() -> None:
    """Replaying a checkpoint's results through a fresh search reaches the same points."""
    measure = lambda p: _m(100 * p.concurrency * p.variant.instance_count, 1)  # noqa: E731
    make = lambda: BruteSearch([_v(1), _v(2)], [1, 2, 4], Constraints())  # noqa: E731
    full = _drive(make(), measure)
    first = full[:2]
    cached = {p.key(): Result(point=p, measurement=measure(p)) for p in first}
    search, measured = make(), []
    while (p := search.next_point()) is not None:
        if p.key() not in cached:
            measured.append(p)
        search.record(cached.get(p.key()) or Result(point=p, measurement=measure(p)))
    assert measured == full[2:]
    encoded = msgspec.json.encode(list(cached.values()))
    assert msgspec.json.decode(encoded, type=list[Result]) == list(cached.values())
