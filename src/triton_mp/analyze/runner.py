"""``triton-mp analyze``'s run: the server, the search loop, the checkpoint, the progress bar.

``run(settings)`` starts a server (or uses ``--url``'s), reads the model's config as
shipped, then asks the search for points one by one: it loads each new variant through the
repository API (``load`` with a ``config``), checks the server serves it as asked, measures
the point (``measure``), appends the result to the checkpoint and tells the search. Points
the checkpoint holds already are replayed, not measured, so an interrupted run continues
where it stopped. On Ctrl-C it stops the load generator, keeps the checkpoint and stops the
server it started (a ``--url`` server gets its own config back). At the end ``report``
writes the recommendations.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from triton_mp.analyze import report
from triton_mp.analyze.probe import procs
from triton_mp.analyze.probe.client import ServerClient, ServerError
from triton_mp.analyze.probe.launch import LaunchedServer
from triton_mp.analyze.probe.loadgen import (
    BuiltinLoad,
    LoadGenerator,
    PerfAnalyzer,
    find_perf_analyzer,
)
from triton_mp.analyze.probe.measure import GpuReader, Target, failed, measure
from triton_mp.analyze.sweep import checkpoint
from triton_mp.analyze.sweep.results import Result
from triton_mp.analyze.sweep.search import BruteSearch, ChainSearch, QuickSearch, Search
from triton_mp.analyze.sweep.settings import Settings
from triton_mp.analyze.sweep.space import (
    Point,
    Variant,
    expected,
    served_variant,
    shipped_variant,
    variant_config,
    variants,
)

log = logging.getLogger(__name__)


def make_search(settings: Settings, base: dict[str, Any]) -> Search:
    """The shipped config first (at every concurrency), then the chosen search."""
    c = settings.constraints
    shipped = BruteSearch([shipped_variant(base)], settings.space.concurrencies, c)
    mbs = int(base.get("max_batch_size", 0))
    if settings.search == "quick":
        main: Search = QuickSearch(
            settings.space, mbs, c, settings.objectives, max_points=settings.max_points
        )
    else:
        main = BruteSearch(variants(settings.space, mbs), settings.space.concurrencies, c)
    return ChainSearch([shipped, main])


def make_load(
    settings: Settings, target: Target, grpc_url: str | None, base: dict[str, Any]
) -> LoadGenerator:
    """perf_analyzer when found (unless ``--load-generator builtin``), else the built-in one.

    Raises:
        ValueError: ``--load-generator perf_analyzer`` and none is installed.
    """
    found = (
        None if settings.load_generator == "builtin" else find_perf_analyzer(settings.perf_analyzer)
    )
    if found is None and settings.load_generator == "perf_analyzer":
        raise ValueError("perf_analyzer not found: pass --perf-analyzer or set $PERF_ANALYZER")
    if found is not None:
        url, protocol = (grpc_url, "grpc") if grpc_url else (target.http_url, "http")
        return PerfAnalyzer(
            *found, url=url, protocol=protocol, window_ms=settings.window_ms, shapes=settings.shapes
        )
    shapes = {}
    for s in settings.shapes:
        name, _, dims = s.rpartition(":")
        shapes[name] = [int(d) for d in dims.split(",")]
    return BuiltinLoad(target.http_url, base, window_s=settings.window_ms / 1000, shapes=shapes)


@contextmanager
def serving(settings: Settings, out: Path) -> Iterator[tuple[Target, str | None]]:
    """The target server and its gRPC URL: ``--url``'s, or one started for the run."""
    if settings.url:
        port = int(settings.url.rpartition(":")[2])
        pid = procs.listening_pid(port)
        root = procs.server_root(pid) if pid else None
        yield (
            Target(http_url=settings.url, metrics_url=settings.metrics_url, root_pid=root),
            settings.grpc_url,
        )
        return
    if not settings.repository:
        raise ValueError("give --model-repository (a server is started) or --url (a running one)")
    server = LaunchedServer(
        Path(settings.repository), settings.model, out / "server.log", *settings.server_flags
    )
    try:
        server.start()
        yield (
            Target(http_url=server.http_url, metrics_url=server.metrics_url, root_pid=server.pid),
            server.grpc_url,
        )
    finally:
        server.stop()


class Loop:
    """The measuring loop over one search (state shared by its steps)."""

    def __init__(
        self,
        settings: Settings,
        target: Target,
        load: LoadGenerator,
        base: dict[str, Any],
        ckpt: checkpoint.Checkpoint,
        path: Path,
    ) -> None:
        self.settings, self.target, self.load, self.base = settings, target, load, base
        self.ckpt, self.path = ckpt, path
        self.client = ServerClient(target.http_url)
        self.loaded: Variant | None = shipped_variant(base)
        self.groups = [g.get("name", "") for g in base.get("instance_group", [])]
        self.gpu = GpuReader()

    def load_variant(self, variant: Variant) -> str | None:
        """Load ``variant`` unless it is loaded; the error when it cannot be served as asked."""
        if variant == self.loaded:
            return None
        self.loaded = None
        try:
            self.client.load(self.settings.model, variant_config(self.base, variant))
            served = self.client.model_config(self.settings.model)
        except ServerError as e:
            return f"load failed: {e}"
        self.ckpt.configs[variant.key()] = served
        self.groups = [g.get("name", "") for g in served.get("instance_group", [])]
        want = expected(variant) if not variant.shipped else served_variant(self.base)
        got = served_variant(served)
        if got != want:
            return f"the server serves {got.describe()} instead of {want.describe()}"
        self.loaded = variant
        return None

    def measure(self, point: Point) -> Result:
        """Load the point's variant and measure it (or record why it could not be)."""
        error = self.load_variant(point.variant)
        if point.variant.shipped:
            self.ckpt.configs.setdefault("shipped", self.base)
        if error is not None:
            m = failed(error, self.load.name)
        else:
            m = measure(
                self.target,
                self.load,
                self.settings.model,
                point.concurrency,
                self.groups,
                self.gpu,
            )
        return Result(point=point, measurement=m)

    def restore(self) -> None:
        """Give a ``--url`` server the model's own config back: the config it served when the
        search began, as the load's ``config``. A load without one would keep the last
        variant's override serving (2.51 reloads only a model whose files changed)."""
        if self.settings.url and self.loaded != shipped_variant(self.base):
            try:
                self.client.load(self.settings.model, self.base)
            except ServerError as e:
                log.warning("could not restore '%s': %s", self.settings.model, e)


def _progress() -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    )


def drive(loop: Loop, search: Search) -> None:
    """Measure (or replay) every point the search asks for, checkpointing each one."""
    cached = {r.point.key(): r for r in loop.ckpt.results}
    with _progress() as bar:
        task = bar.add_task("starting", total=search.planned())
        done = 0
        while (point := search.next_point()) is not None:
            result = cached.get(point.key())
            if result is None:
                bar.update(
                    task, description=f"{point.variant.key()} @ concurrency {point.concurrency}"
                )
                result = loop.measure(point)
                loop.ckpt.results.append(result)
                checkpoint.save(loop.path, loop.ckpt)
            search.record(result)
            done += 1
            bar.update(task, completed=done, total=done + search.planned())
        bar.update(task, description="done")


def run(settings: Settings) -> int:
    """The whole analysis; 0 when it finished, 130 when interrupted (checkpoint kept).

    Raises:
        ServerError / ValueError / checkpoint.CheckpointError: with a message for the user.
    """
    out = Path(settings.output)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "checkpoint.json"
    if settings.fresh:
        path.unlink(missing_ok=True)
    ckpt = checkpoint.load(path, settings.measured_by())
    with serving(settings, out) as (target, grpc_url):
        base = ckpt.configs.get("shipped") or ServerClient(target.http_url).model_config(
            settings.model
        )
        ckpt.configs["shipped"] = base
        load = make_load(settings, target, grpc_url, base)
        loop = Loop(settings, target, load, base, ckpt, path)
        try:
            drive(loop, make_search(settings, base))
        except KeyboardInterrupt:
            stop = getattr(load, "stop", None)
            if stop:
                stop()
            checkpoint.save(path, ckpt)
            log.warning(
                "interrupted: %d points kept in %s; run again to resume", len(ckpt.results), path
            )
            return 130
        finally:
            loop.restore()
    report.write(settings, ckpt, out)
    return 0
