"""Python models' custom metrics (``pb_utils.MetricFamily``) on ``GET /metrics``.

Imported by the frontend that serves metrics (``frontend.metrics.endpoint``, and
``frontend.metrics.render`` for ``render``). At each scrape ``BoardReader`` copies every
worker's board (``ipc.memory.metric_board``), ``merge`` turns them into one set of families as
Triton's single registry would hold them, and ``render`` writes those in the text format
Triton's prometheus-cpp writes (after the built-in families).

Triton keeps one registry per server: a family name is one family whatever model or
instance made it, and a label set is one series shared by every instance that asks for it.
Here each instance is a process with its own board, so the merge rebuilds that:

- a family's kind and description are those of its earliest creation (by CLOCK_MONOTONIC,
  which every process shares); a board that gave the name another kind (Triton would have
  refused that creation) has its series of that family left out, with a warning;
- counters: the series of every board with the same family and labels add up, as their
  increments would on one shared counter;
- histograms: likewise bucket by bucket and their sums, when the buckets are the same (Triton
  keeps the first creator's buckets); a board with other buckets for that series is left out,
  with a warning;
- gauges: increments add up; a ``set`` wins over what came before it: the value is that of
  the board that set it last (its set plus its own later increments) plus the whole of
  every board that never set it. That is exact unless two instances both set and increment
  the same series, where increments one made before another's later set still count.

Differences that remain: ``metric.value()`` in a model is its own instance's part, not the
shared total; and a series ends with the instance that made it (Triton's would lose that
instance's part too, when its python objects go). Families whose names are taken by the
server's own metrics (``nv_*``, ``triton_mp_*``) are left out, with a warning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import posix_ipc

from triton_mp.ipc.memory.metric_board import BoardMetric, BoardSnapshot, read_board
from triton_mp.ipc.memory.metric_board import Kind as MetricKind
from triton_mp.ipc.memory.shm import Segment, list_objects
from triton_mp.ipc.memory.topology import Kind, Topology

log = logging.getLogger(__name__)


@dataclass
class Series:
    """One merged series of a family."""

    labels: tuple[tuple[str, str], ...]
    """Sorted by name, as prometheus-cpp keeps them."""
    value: float = 0.0
    """Counter and gauge value; a histogram's sum."""
    buckets: tuple[float, ...] = ()
    """A histogram's bucket upper bounds (+Inf not included)."""
    counts: list[float] = field(default_factory=list)
    """A histogram's observations per bucket, +Inf last (not cumulative)."""


@dataclass
class Family:
    """One merged family."""

    name: str
    kind: MetricKind
    description: str
    created_ns: int
    series: dict[tuple[tuple[str, str], ...], Series] = field(default_factory=dict)


class BoardReader:
    """Finds the server's boards and copies them (one reader per metrics endpoint).

    Attachments are kept between scrapes and closed when their board is gone.

    Args:
        server_id: whose boards (``ipc.memory.topology`` kind ``METRIC_BOARD``).
    """

    def __init__(self, server_id: str) -> None:
        self._topology = Topology(server_id)
        self._server_id = server_id
        self._attached: dict[str, Segment] = {}

    def boards(self) -> dict[tuple[int, int], list[str]]:
        """Per worker process (instance id, pid) or frontend process (-1 - frontend id,
        pid), the names of its boards, newest generation first."""
        found: dict[tuple[int, int], list[tuple[int, str]]] = {}
        for entry in list_objects(self._server_id):
            obj = self._topology.parse(entry)
            if obj is not None and obj.kind is Kind.METRIC_BOARD:
                owner = (obj.fields["instance"], obj.fields["pid"])
            elif obj is not None and obj.kind is Kind.FRONTEND_METRIC_BOARD:
                # NOTE: a frontend's latency histograms (``frontend.metrics.latency``)
                owner = (-1 - obj.fields["frontend"], obj.fields["pid"])
            else:
                continue
            found.setdefault(owner, []).append((obj.fields["generation"], "/" + entry))
        return {owner: [n for _, n in sorted(gens, reverse=True)] for owner, gens in found.items()}

    def read(self) -> list[BoardSnapshot]:
        """A copy of each owner's newest readable board."""
        boards = self.boards()
        live = {n for names in boards.values() for n in names}
        for name in [n for n in self._attached if n not in live]:
            self._attached.pop(name).close()
        out = []
        for names in boards.values():
            for name in names:
                snapshot = self._read(name)
                if snapshot is not None:
                    out.append(snapshot)
                    break
        return out

    def _read(self, name: str) -> BoardSnapshot | None:
        segment = self._attached.get(name)
        if segment is None:
            try:
                segment = Segment.attach(name)
            except (posix_ipc.ExistentialError, OSError, ValueError):
                return None  # NOTE: gone since the listing (its worker grew or stopped)
            self._attached[name] = segment
        return read_board(segment.buf)

    def close(self) -> None:
        """Unmap every board."""
        for segment in self._attached.values():
            segment.close()
        self._attached.clear()


_warned: set[tuple[str, ...]] = set()


def _warn_once(key: tuple[str, ...], message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def merge(snapshots: Iterable[BoardSnapshot]) -> list[Family]:
    """The families of every board as one registry holds them (rules in the module doc),
    earliest created first; families without series are left out, as prometheus-cpp
    leaves them out."""
    snapshots = list(snapshots)
    first: dict[str, Family] = {}
    for snap in snapshots:
        for fam in snap.catalog.families:
            have = first.get(fam.name)
            if have is None or fam.created_ns < have.created_ns:
                first[fam.name] = Family(fam.name, fam.kind, fam.description, fam.created_ns)
    gauges: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    histograms: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[BoardMetric, list[float]]]]
    histograms = {}
    for snap in snapshots:
        cat, values = snap.catalog, snap.values
        for fam in cat.families:
            merged = first[fam.name]
            if fam.kind != merged.kind:
                _warn_once(
                    ("kind", fam.name, cat.instance),
                    "custom metric family '%s' of instance %s is a %s, but it was created as "
                    "a %s first; its series are not reported",
                    fam.name,
                    cat.instance,
                    fam.kind,
                    merged.kind,
                )
                continue
            for m in fam.metrics:
                if m.slot < 0 or m.slot + 2 + len(m.buckets or ()) > len(values):
                    continue
                key = (fam.name, m.labels)
                if fam.kind == "counter":
                    merged.series.setdefault(m.labels, Series(m.labels)).value += values[m.slot]
                elif fam.kind == "gauge":
                    gauges.setdefault(key, []).append((values[m.slot], values[m.slot + 1]))
                else:
                    n = len(m.buckets or ()) + 1
                    histograms.setdefault(key, []).append(
                        (m, list(values[m.slot : m.slot + 1 + n]))
                    )
    for (name, labels), entries in gauges.items():
        first[name].series[labels] = Series(labels, merge_gauge(entries))
    for (name, labels), hists in histograms.items():
        first[name].series[labels] = _merge_histogram(name, labels, hists)
    families = [f for f in first.values() if f.series]
    families.sort(key=lambda f: (f.created_ns, f.name))
    return families


def merge_gauge(entries: Iterable[tuple[float, float]]) -> float:
    """One gauge series from each board's ``(value, set_ns)`` (rule in the module doc)."""
    entries = list(entries)
    setters = [e for e in entries if e[1] > 0.0]
    if not setters:
        return sum(v for v, _ in entries)
    last = max(setters, key=lambda e: e[1])
    return last[0] + sum(v for v, set_ns in entries if set_ns <= 0.0)


def _merge_histogram(
    name: str,
    labels: tuple[tuple[str, str], ...],
    hists: list[tuple[BoardMetric, list[float]]],
) -> Series:
    """One histogram series from each board's metric and ``[sum, n_0, ..., n_inf]``."""
    reference = min(hists, key=lambda h: h[0].created_ns)[0].buckets or ()
    series = Series(labels, 0.0, reference, [0.0] * (len(reference) + 1))
    for metric, slots in hists:
        if (metric.buckets or ()) != reference:
            _warn_once(
                ("buckets", name, repr(labels), repr(metric.buckets)),
                "custom histogram '%s' %s: an instance made it with buckets %s, the first "
                "with %s; its observations are not reported",
                name,
                dict(labels),
                list(metric.buckets or ()),
                list(reference),
            )
            continue
        series.value += slots[0]
        for i, n in enumerate(slots[1:]):
            series.counts[i] += n
    return series


def format_value(value: float) -> str:
    """A number as Triton 2.51's prometheus-cpp writes it: ``snprintf("%.*g",
    max_digits10 - 1)``, i.e. ``%.16g`` (its text serializer's branch for a library without
    floating-point ``std::to_chars``; checked against 2.51): ``3``, ``100000``, ``0.05``,
    ``0.3`` for 0.1 + 0.2, ``1e+16``, ``1e-05``; ``Nan``, ``+Inf``, ``-Inf``."""
    if math.isnan(value):
        return "Nan"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return "%.16g" % value


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def sample_line(name: str, labels: Iterable[tuple[str, str]], value: str) -> str:
    """One sample line of the text format: ``name{k="v",...} value`` and a newline, label
    values escaped (backslash, newline, double quote)."""
    pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
    return f"{name}{{{pairs}}} {value}\n" if pairs else f"{name} {value}\n"


def render(families: Iterable[Family], taken: AbstractSet[str] = frozenset()) -> str:
    """The families in Prometheus text format, as Triton writes custom metrics: ``# HELP``,
    ``# TYPE``, then one line per series with its labels in name order (a histogram:
    ``_count``, ``_sum``, cumulative ``_bucket`` lines with ``le``, ``+Inf`` last).

    Args:
        taken: names of the server's own metric families and samples; a custom family that
            would reuse one is left out (with a warning), since a name may appear once.
    """
    return "".join(_render(families, taken))


def _render(families: Iterable[Family], taken: AbstractSet[str]) -> Iterator[str]:
    for fam in families:
        names = {fam.name}
        if fam.kind == "histogram":
            names |= {f"{fam.name}_count", f"{fam.name}_sum", f"{fam.name}_bucket"}
        if names & taken:
            _warn_once(
                ("taken", fam.name),
                "custom metric family '%s' is not reported: the server's own metrics use that name",
                fam.name,
            )
            continue
        yield f"# HELP {fam.name} {_escape_help(fam.description)}\n"
        yield f"# TYPE {fam.name} {fam.kind}\n"
        for labels in sorted(fam.series):
            s = fam.series[labels]
            if fam.kind != "histogram":
                yield sample_line(fam.name, labels, format_value(s.value))
                continue
            total = sum(s.counts)
            yield sample_line(f"{fam.name}_count", labels, format_value(total))
            yield sample_line(f"{fam.name}_sum", labels, format_value(s.value))
            cumulative = 0.0
            for bound, n in zip((*s.buckets, math.inf), s.counts, strict=True):
                cumulative += n
                le = (*labels, ("le", format_value(bound)))
                yield sample_line(f"{fam.name}_bucket", le, format_value(cumulative))
