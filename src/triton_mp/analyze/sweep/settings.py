"""``triton-mp analyze``'s settings: what was asked, as one frozen struct (pure).

Built by ``options`` from the command line (or by tests directly); read by ``runner``,
``report`` and, for its fingerprint, ``checkpoint``.
"""

from __future__ import annotations

import msgspec

from triton_mp.analyze.sweep.pareto import Constraints
from triton_mp.analyze.sweep.space import SearchSpace


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``triton-mp analyze`` was asked (see ``cli.main``'s ``analyze`` flags)."""

    model: str
    output: str
    repository: str | None = None
    url: str | None = None
    grpc_url: str | None = None
    metrics_url: str | None = None
    search: str = "brute"
    space: SearchSpace = SearchSpace()
    constraints: Constraints = Constraints()
    objectives: dict[str, float] = msgspec.field(default_factory=lambda: {"throughput": 1.0})
    top: int = 3
    window_ms: int = 2000
    max_points: int = 16
    load_generator: str = "auto"
    perf_analyzer: str | None = None
    shapes: tuple[str, ...] = ()
    fresh: bool = False
    server_flags: tuple[str, ...] = ()

    def measured_by(self) -> dict[str, object]:
        """The settings that decide what is measured (the checkpoint's fingerprint)."""
        keep = ("model", "search", "space", "constraints", "objectives", "window_ms")
        data = msgspec.to_builtins(self)
        out = {k: data[k] for k in keep}
        out.update(
            load_generator=self.load_generator, max_points=self.max_points, shapes=list(self.shapes)
        )
        return out
