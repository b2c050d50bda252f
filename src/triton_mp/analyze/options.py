"""``triton-mp analyze``'s flags and their conversion to ``runner.Settings``.

Imported by ``triton_mp.cli.main`` (which owns the command line); no I/O here.
"""

from __future__ import annotations

import argparse
import re

from triton_mp.analyze.sweep.pareto import Constraints, parse_objectives
from triton_mp.analyze.sweep.settings import Settings
from triton_mp.analyze.sweep.space import SearchSpace

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"2GiB"``, ``"512M"``, ``"1000000"`` -> bytes (binary units).

    Raises:
        argparse.ArgumentTypeError: not a size.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: '{text}' (e.g. 2GiB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def int_list(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``; ``""`` -> ``()``.

    Raises:
        argparse.ArgumentTypeError: an item is not a non-negative integer.
    """
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: '{text}'") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"negative value in '{text}'")
    return values


def on_off_list(text: str) -> tuple[bool, ...]:
    """``"on,off"`` -> ``(True, False)``.

    Raises:
        argparse.ArgumentTypeError: an item is neither on nor off.
    """
    table = {"on": True, "off": False}
    items = [v.strip().lower() for v in text.split(",") if v.strip()]
    if not items or any(v not in table for v in items):
        raise argparse.ArgumentTypeError(f"expected on and/or off, got '{text}'")
    return tuple(table[v] for v in items)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every ``analyze`` flag (Model Analyzer's names where there is one)."""
    p.add_argument("--model", required=True, help="the model to analyse")
    where = p.add_argument_group("server (one of)")
    where.add_argument("--model-repository", help="start a triton-mp server on this repository")
    where.add_argument("--url", help="HTTP/REST host:port of a running server")
    where.add_argument("--grpc-url", help="its gRPC host:port (perf_analyzer then uses gRPC)")
    where.add_argument("--metrics-url", help="its metrics host:port (memory of a remote server)")
    where.add_argument(
        "--server-flag", action="append", default=[], help="extra `triton-mp start` flag"
    )
    s = p.add_argument_group("search")
    s.add_argument("--search", choices=["brute", "quick"], default="brute")
    s.add_argument("--instance-counts", type=int_list, default=(1, 2))
    s.add_argument("--max-batch-sizes", type=int_list, default=(1, 8, 32))
    s.add_argument("--dynamic-batching", type=on_off_list, default=(True, False), help="on,off")
    s.add_argument("--max-queue-delays-us", type=int_list, default=(0, 500))
    s.add_argument(
        "--preferred-batch-sizes",
        type=int_list,
        action="append",
        help="a list per flag; '' for none (the server's default)",
    )
    s.add_argument("--concurrency", type=int_list, default=(1, 2, 4, 8, 16))
    s.add_argument(
        "--max-points", type=int, default=16, help="quick search: at most this many points"
    )
    g = p.add_argument_group("constraints and objectives")
    g.add_argument("--latency-budget-ms", type=float, help="p99 latency limit")
    g.add_argument("--min-throughput", type=float, help="inferences per second, at least")
    g.add_argument(
        "--max-memory", type=parse_bytes, help="server resident memory limit (e.g. 2GiB)"
    )
    g.add_argument(
        "--objectives", default="throughput", help="e.g. throughput:2,latency,memory,cpu"
    )
    g.add_argument("--top", type=int, default=3, help="configs to recommend")
    m = p.add_argument_group("measurement and output")
    m.add_argument("--measurement-interval-ms", type=int, default=2000)
    m.add_argument("--load-generator", choices=["auto", "perf_analyzer", "builtin"], default="auto")
    m.add_argument("--perf-analyzer", help="perf_analyzer's path")
    m.add_argument("--shape", action="append", default=[], help="NAME:D1,D2 for variable inputs")
    m.add_argument("--output", help="output folder (default ./analyze_<model>)")
    m.add_argument("--fresh", action="store_true", help="ignore the checkpoint, start over")


def settings_from_args(a: argparse.Namespace) -> Settings:
    """The parsed flags as ``Settings``.

    Raises:
        ValueError: a flag value or combination that cannot run (the message says which).
    """
    if bool(a.url) == bool(a.model_repository):
        raise ValueError("give exactly one of --model-repository and --url")
    if not a.concurrency or not a.instance_counts:
        raise ValueError("--concurrency and --instance-counts need at least one value")
    space = SearchSpace(
        instance_counts=tuple(v for v in a.instance_counts if v > 0),
        max_batch_sizes=a.max_batch_sizes,
        dynamic_batching=a.dynamic_batching,
        max_queue_delays_us=a.max_queue_delays_us or (0,),
        preferred=tuple(a.preferred_batch_sizes or [()]),
        concurrencies=tuple(sorted(v for v in a.concurrency if v > 0)),
    )
    return Settings(
        model=a.model,
        output=a.output or f"analyze_{a.model}",
        repository=a.model_repository,
        url=a.url,
        grpc_url=a.grpc_url,
        metrics_url=a.metrics_url,
        search=a.search,
        space=space,
        constraints=Constraints(
            latency_budget_ms=a.latency_budget_ms,
            min_throughput_per_s=a.min_throughput,
            max_memory_bytes=a.max_memory,
        ),
        objectives=parse_objectives(a.objectives),
        top=a.top,
        window_ms=a.measurement_interval_ms,
        max_points=a.max_points,
        load_generator=a.load_generator,
        perf_analyzer=a.perf_analyzer,
        shapes=tuple(a.shape),
        fresh=a.fresh,
        server_flags=tuple(a.server_flag),
    )
