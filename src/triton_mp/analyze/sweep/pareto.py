"""Constraints, objectives, the Pareto front and the recommendation (pure).

Constraints are Model Analyzer's (``perf_latency_p99``, ``perf_throughput``, memory): a
point is feasible when its p99 latency is within ``latency_budget_ms``, its throughput at
least ``min_throughput_per_s`` and the whole server's resident memory at most
``max_memory_bytes``. Objectives are weighted as Model Analyzer's ``objectives`` are: each
point's score is the weighted sum of its figures relative to the best among the points
compared (``1.0`` for the best, less for the others), so weights trade one figure for
another without caring about units.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from triton_mp.analyze.sweep.results import Measurement, Result

OBJECTIVES: dict[str, tuple[Callable[[Measurement], float], bool]] = {
    "throughput": (lambda m: m.throughput_per_s, True),
    "latency": (lambda m: m.p99_us, False),
    "memory": (lambda m: float(m.total_rss_bytes), False),
    "cpu": (lambda m: m.cpu_ms_per_inference or 0.0, False),
}
"""Objective name -> (the figure it reads, whether more is better)."""


class Constraints(msgspec.Struct, frozen=True, kw_only=True):
    """Limits a recommended point must meet (None: no limit).

    Attributes:
        latency_budget_ms: p99 latency at most this many milliseconds.
        min_throughput_per_s: throughput at least this many inferences per second.
        max_memory_bytes: the whole server's resident memory at most this many bytes.
    """

    latency_budget_ms: float | None = None
    min_throughput_per_s: float | None = None
    max_memory_bytes: int | None = None

    def violations(self, m: Measurement) -> list[str]:
        """Why ``m`` is not feasible (empty when it is)."""
        if not m.ok:
            return [f"not measured: {m.error}"]
        out = []
        if self.latency_budget_ms is not None and m.p99_us > self.latency_budget_ms * 1000:
            out.append(f"p99 {m.p99_us / 1000:.1f} ms > {self.latency_budget_ms:g} ms")
        if self.min_throughput_per_s is not None and m.throughput_per_s < self.min_throughput_per_s:
            out.append(f"{m.throughput_per_s:.1f}/s < {self.min_throughput_per_s:g}/s")
        if self.max_memory_bytes is not None and m.total_rss_bytes > self.max_memory_bytes:
            out.append(f"memory {m.total_rss_bytes >> 20} MiB > {self.max_memory_bytes >> 20} MiB")
        return out

    def feasible(self, m: Measurement) -> bool:
        """Whether ``m`` meets every constraint."""
        return not self.violations(m)


def parse_objectives(text: str) -> dict[str, float]:
    """``"throughput:2,latency"`` -> ``{"throughput": 2.0, "latency": 1.0}``.

    Raises:
        ValueError: an unknown objective or a weight that is not a positive number.
    """
    out: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight = item.partition(":")
        if name not in OBJECTIVES:
            raise ValueError(f"unknown objective '{name}' (one of {', '.join(OBJECTIVES)})")
        value = float(weight) if weight else 1.0
        if value <= 0:
            raise ValueError(f"objective '{name}' needs a positive weight, got {weight}")
        out[name] = value
    if not out:
        raise ValueError("no objective given")
    return out


def scores(measurements: Sequence[Measurement], objectives: dict[str, float]) -> list[float]:
    """The weighted score of each measurement against the others (higher is better).

    For a figure where more is better the term is ``value / best``; where less is better,
    ``best / value``; a zero figure counts as the best possible one.
    """
    out = [0.0] * len(measurements)
    for name, weight in objectives.items():
        read, more_is_better = OBJECTIVES[name]
        values = [read(m) for m in measurements]
        if not values:
            break
        if more_is_better:
            best = max(values)
            terms = [v / best if best > 0 else 1.0 for v in values]
        else:
            positive = [v for v in values if v > 0]
            best = min(positive) if positive else 0.0
            terms = [best / v if v > 0 else 1.0 for v in values]
        out = [s + weight * t for s, t in zip(out, terms, strict=True)]
    return out


def _dominates(a: Measurement, b: Measurement) -> bool:
    """``a`` is no worse than ``b`` on throughput, p99 latency and memory, better on one."""
    ga = (a.throughput_per_s, -a.p99_us, -a.total_rss_bytes)
    gb = (b.throughput_per_s, -b.p99_us, -b.total_rss_bytes)
    return all(x >= y for x, y in zip(ga, gb, strict=True)) and ga != gb


def pareto_front(results: Sequence[Result]) -> list[Result]:
    """The measured results no other measured result dominates (throughput up, p99 latency
    and server memory down), in the order given."""
    ok = [r for r in results if r.measurement.ok]
    return [
        r for r in ok if not any(_dominates(o.measurement, r.measurement) for o in ok if o is not r)
    ]


class Recommendation(msgspec.Struct, frozen=True, kw_only=True):
    """One recommended config: its best feasible point and that point's score."""

    result: Result
    score: float


def recommend(
    results: Sequence[Result],
    constraints: Constraints,
    objectives: dict[str, float],
    top: int,
) -> list[Recommendation]:
    """The ``top`` best variants: each variant is represented by its best feasible point
    (concurrency is the client's choice, not the config's), variants ranked by that score.

    The shipped config takes part like any other variant; scores are relative to every
    feasible point, so they compare across variants.
    """
    feasible = [r for r in results if constraints.feasible(r.measurement)]
    if not feasible:
        return []
    scored = scores([r.measurement for r in feasible], objectives)
    best: dict[str, Recommendation] = {}
    for result, score in zip(feasible, scored, strict=True):
        key = result.point.variant.key()
        if key not in best or score > best[key].score:
            best[key] = Recommendation(result=result, score=score)
    ranked = sorted(best.values(), key=lambda r: (-r.score, r.result.point.key()))
    return ranked[:top]
