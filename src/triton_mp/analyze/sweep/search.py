"""Which point to measure next: Model Analyzer's brute and quick searches (pure).

A search is asked ``next_point()`` and told each ``record(result)`` in turn; it never
measures anything, so tests drive it with made-up results and a resumed run replays the
checkpoint's results through it and reaches the same points.

- ``BruteSearch``: every variant, each at ascending concurrencies until more clients stop
  paying (throughput gains under ``min_gain`` for ``patience`` tries in a row, Model
  Analyzer's rule), the latency budget is exceeded (more clients only queue longer) or a
  point fails.
- ``QuickSearch``: a hill climb over the coordinates (instance count, max_batch_size,
  queue delay, concurrency) from the smallest values, as Model Analyzer's quick search
  walks its neighbourhood: measure every neighbour one step away, move to the best one
  while it beats the current point, stop at a local optimum or after ``max_points``.
- ``ChainSearch``: one search after another (the shipped config first).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

from triton_mp.analyze.sweep.pareto import Constraints, scores
from triton_mp.analyze.sweep.results import Result
from triton_mp.analyze.sweep.space import Point, SearchSpace, Variant

MIN_GAIN = 0.05
"""Model Analyzer's ``THROUGHPUT_MINIMUM_GAIN``: a concurrency step must add 5%."""


class Search(Protocol):
    """What the runner drives."""

    def next_point(self) -> Point | None:
        """The next point to measure, or None when the search is over."""
        ...

    def record(self, result: Result) -> None:
        """The result of the point ``next_point`` returned last."""
        ...

    def planned(self) -> int:
        """An upper bound of the points still to come (for the progress bar)."""
        ...


class BruteSearch:
    """Every variant in order, each at ``concurrencies`` ascending with early stops."""

    def __init__(
        self,
        variants: Sequence[Variant],
        concurrencies: Sequence[int],
        constraints: Constraints,
        *,
        min_gain: float = MIN_GAIN,
        patience: int = 2,
    ) -> None:
        self._variants = list(variants)
        self._concurrencies = sorted(concurrencies)
        self._constraints = constraints
        self._min_gain = min_gain
        self._patience = patience
        self._vi = 0
        self._ci = 0
        self._history: list[float] = []

    def next_point(self) -> Point | None:
        if self._vi >= len(self._variants):
            return None
        return Point(variant=self._variants[self._vi], concurrency=self._concurrencies[self._ci])

    def record(self, result: Result) -> None:
        assert result.point == self.next_point(), (result.point, self.next_point())
        m = result.measurement
        self._history.append(m.throughput_per_s)
        budget = self._constraints.latency_budget_ms
        over_budget = budget is not None and m.ok and m.p99_us > budget * 1000
        self._ci += 1
        if not m.ok or over_budget or self._stalled() or self._ci >= len(self._concurrencies):
            self._vi += 1
            self._ci = 0
            self._history = []

    def _stalled(self) -> bool:
        """The last ``patience`` points each added less than ``min_gain`` over the best before."""
        h = self._history
        if len(h) <= self._patience:
            return False
        for i in range(len(h) - self._patience, len(h)):
            if h[i] > max(h[:i]) * (1 + self._min_gain):
                return False
        return True

    def planned(self) -> int:
        left = len(self._variants) - self._vi
        return max(0, left * len(self._concurrencies) - self._ci)


Coord = tuple[int, ...]


class QuickSearch:
    """Hill climb over (instance count, max_batch_size, queue delay, concurrency) indices.

    Dynamic batching is on throughout (as in Model Analyzer's quick search) unless the
    model cannot batch; preferred sizes follow ``space.preferred[0]``.
    """

    def __init__(
        self,
        space: SearchSpace,
        model_max_batch_size: int,
        constraints: Constraints,
        objectives: dict[str, float],
        *,
        max_points: int = 16,
    ) -> None:
        batches = model_max_batch_size > 0
        self._dims: list[tuple[int, ...]] = [
            space.instance_counts,
            space.max_batch_sizes if batches else (0,),
            space.max_queue_delays_us if batches else (0,),
            tuple(sorted(space.concurrencies)),
        ]
        self._preferred = space.preferred[0] if space.preferred else ()
        self._constraints = constraints
        self._objectives = objectives
        self._max_points = max_points
        self._measured: dict[Coord, Result] = {}
        self._current: Coord = (0, 0, 0, 0)
        self._pending: list[Coord] = [self._current]
        self._visited: set[Coord] = set()
        self._done = False

    def point_at(self, coord: Coord) -> Point:
        """The point at index ``coord`` of the dimensions."""
        count, mbs, delay, conc = (d[i] for d, i in zip(self._dims, coord, strict=True))
        variant = Variant(
            instance_count=count,
            max_batch_size=mbs,
            dynamic_batching=mbs > 0,
            preferred_batch_sizes=tuple(s for s in self._preferred if 0 < s <= mbs),
            max_queue_delay_us=delay if mbs > 1 else 0,
        )
        return Point(variant=variant, concurrency=conc)

    def next_point(self) -> Point | None:
        while not self._done and not self._pending:
            self._step()
        if self._done:
            return None
        return self.point_at(self._pending[0])

    def record(self, result: Result) -> None:
        coord = self._pending.pop(0)
        assert result.point == self.point_at(coord), (result.point, self.point_at(coord))
        self._measured[coord] = result
        if len(self._measured) >= self._max_points:
            self._done = True

    def _neighbours(self, coord: Coord) -> list[Coord]:
        out = []
        for axis, delta in itertools.product(range(len(coord)), (1, -1)):
            c = list(coord)
            c[axis] += delta
            if 0 <= c[axis] < len(self._dims[axis]):
                out.append(tuple(c))
        return out

    def _step(self) -> None:
        """Every neighbour of the current point is measured: move to the best, or stop
        (the best is a point the climb stood on already: a local optimum, or a cycle)."""
        around = [
            self._current,
            *(n for n in self._neighbours(self._current) if n in self._measured),
        ]
        best = self._best(around)
        if best in self._visited:
            self._done = True
            return
        self._visited.add(best)
        self._current = best
        self._pending = [n for n in self._neighbours(best) if n not in self._measured]

    def _best(self, coords: list[Coord]) -> Coord:
        """Feasible beats infeasible; then the objectives' score among these points."""
        results = [self._measured[c] for c in coords]
        score = scores([r.measurement for r in results], self._objectives)
        keyed = [
            (self._constraints.feasible(r.measurement) and r.measurement.ok, s, -i)
            for i, (r, s) in enumerate(zip(results, score, strict=True))
        ]
        return coords[-max(keyed)[2]]

    def planned(self) -> int:
        return 0 if self._done else max(1, self._max_points - len(self._measured))


class ChainSearch:
    """Several searches, one after the other."""

    def __init__(self, searches: Sequence[Search]) -> None:
        self._searches = list(searches)

    def next_point(self) -> Point | None:
        while self._searches:
            point = self._searches[0].next_point()
            if point is not None:
                return point
            self._searches.pop(0)
        return None

    def record(self, result: Result) -> None:
        self._searches[0].record(result)

    def planned(self) -> int:
        return sum(s.planned() for s in self._searches)
