"""What ``triton-mp analyze`` sweeps: config variants, measurement points, and the JSON
config each variant is loaded with (pure; no process, no I/O).

A ``Variant`` is one model configuration: instance count, ``max_batch_size`` and the
dynamic batcher (on or off, ``preferred_batch_size``, ``max_queue_delay_microseconds``),
as Model Analyzer's ``model_config_parameters`` sweep them. A ``Point`` is a variant
measured at one client concurrency. ``variant_config`` applies a variant to the model's
effective config (Triton's JSON form, ``GET /v2/models/<m>/config``), which is what
``POST /v2/repository/models/<m>/load`` takes as its ``config`` parameter.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import msgspec


class Variant(msgspec.Struct, frozen=True, kw_only=True):
    """One model configuration to measure.

    Attributes:
        instance_count: ``instance_group[*].count`` (every group gets it).
        max_batch_size: ``max_batch_size`` (0: the model does not batch).
        dynamic_batching: whether ``dynamic_batching`` is set (off: the default scheduler).
        preferred_batch_sizes: ``dynamic_batching.preferred_batch_size``.
        max_queue_delay_us: ``dynamic_batching.max_queue_delay_microseconds``.
        shipped: the model's config as shipped, loaded unchanged (the other fields then
            describe it, for the report).
    """

    instance_count: int
    max_batch_size: int
    dynamic_batching: bool
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    shipped: bool = False

    def key(self) -> str:
        """A stable short name: ``i2_b8_dyn500_p8`` (``shipped`` for the shipped config)."""
        if self.shipped:
            return "shipped"
        dyn = f"dyn{self.max_queue_delay_us}" if self.dynamic_batching else "nodyn"
        pref = "_p" + "-".join(map(str, self.preferred_batch_sizes))
        return f"i{self.instance_count}_b{self.max_batch_size}_{dyn}" + (
            pref if self.preferred_batch_sizes else ""
        )

    def describe(self) -> str:
        """One line for tables: ``2 inst, mbs 8, dyn 500us pref [8]``."""
        dyn = "no dyn batching"
        if self.dynamic_batching:
            dyn = f"dyn {self.max_queue_delay_us}us"
            if self.preferred_batch_sizes:
                dyn += f" pref {list(self.preferred_batch_sizes)}"
        text = f"{self.instance_count} inst, mbs {self.max_batch_size}, {dyn}"
        return ("shipped: " + text) if self.shipped else text


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """A variant measured at one client concurrency (perf_analyzer's ``--concurrency-range``)."""

    variant: Variant
    concurrency: int

    def key(self) -> str:
        """``<variant key>@c<concurrency>``, the checkpoint's key."""
        return f"{self.variant.key()}@c{self.concurrency}"


class SearchSpace(msgspec.Struct, frozen=True, kw_only=True):
    """The values swept (Model Analyzer's run-config search bounds, as explicit lists).

    Attributes:
        instance_counts: instance counts per group.
        max_batch_sizes: ``max_batch_size`` values (ignored for a model that does not batch).
        dynamic_batching: ``True`` and/or ``False``.
        max_queue_delays_us: delays tried when dynamic batching is on.
        preferred: ``preferred_batch_size`` lists tried when dynamic batching is on; sizes
            above a variant's ``max_batch_size`` are dropped, and an empty list leaves the
            server's default (Triton's: ``[max_batch_size]``).
        concurrencies: client concurrencies, ascending.
    """

    instance_counts: tuple[int, ...] = (1, 2)
    max_batch_sizes: tuple[int, ...] = (1, 8, 32)
    dynamic_batching: tuple[bool, ...] = (True, False)
    max_queue_delays_us: tuple[int, ...] = (0, 500)
    preferred: tuple[tuple[int, ...], ...] = ((),)
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16)


def shipped_variant(config: dict[str, Any]) -> Variant:
    """The ``shipped`` variant describing ``config`` (Triton's JSON form)."""
    groups = config.get("instance_group") or [{"count": 1}]
    dyn = config.get("dynamic_batching")
    return Variant(
        instance_count=int(groups[0].get("count", 1)),
        max_batch_size=int(config.get("max_batch_size", 0)),
        dynamic_batching=dyn is not None,
        preferred_batch_sizes=tuple(int(v) for v in (dyn or {}).get("preferred_batch_size", [])),
        max_queue_delay_us=int((dyn or {}).get("max_queue_delay_microseconds", 0)),
        shipped=True,
    )


def _preferred(sizes: tuple[int, ...], max_batch_size: int) -> tuple[int, ...]:
    return tuple(s for s in sizes if 0 < s <= max_batch_size)


def variants(space: SearchSpace, model_max_batch_size: int) -> list[Variant]:
    """Every variant of ``space``, deduplicated, in sweep order (brute search).

    A model whose config has ``max_batch_size: 0`` cannot batch (Triton refuses a batcher
    on it): only its instance count is swept. ``max_batch_size: 1`` makes preferred sizes
    and delays meaningless, so they collapse to one variant.
    """
    out: list[Variant] = []
    batch_sizes = space.max_batch_sizes if model_max_batch_size > 0 else (0,)
    for count, mbs in itertools.product(space.instance_counts, batch_sizes):
        for dyn in space.dynamic_batching if mbs > 0 else (False,):
            if not dyn:
                out.append(
                    Variant(instance_count=count, max_batch_size=mbs, dynamic_batching=False)
                )
                continue
            for delay, sizes in itertools.product(space.max_queue_delays_us, space.preferred):
                out.append(
                    Variant(
                        instance_count=count,
                        max_batch_size=mbs,
                        dynamic_batching=True,
                        preferred_batch_sizes=_preferred(sizes, mbs),
                        max_queue_delay_us=delay if mbs > 1 else 0,
                    )
                )
    return list(dict.fromkeys(out))


def served_variant(config: dict[str, Any]) -> Variant:
    """The variant ``config`` (the effective config the server serves) amounts to, with
    Triton's defaults spelled out, to compare with ``expected(variant)``."""
    return msgspec.structs.replace(shipped_variant(config), shipped=False)


def expected(variant: Variant) -> Variant:
    """``variant`` as the server will report it: an empty ``preferred_batch_size`` becomes
    ``[max_batch_size]`` (Triton's NormalizeModelConfig); the shipped flag dropped."""
    pref = variant.preferred_batch_sizes
    if variant.dynamic_batching and not pref and variant.max_batch_size > 0:
        pref = (variant.max_batch_size,)
    return msgspec.structs.replace(variant, preferred_batch_sizes=pref, shipped=False)


def variant_config(base: dict[str, Any], variant: Variant) -> dict[str, Any]:
    """``base`` (Triton's JSON form of the model's config) with ``variant`` applied.

    Every instance group keeps its kind and devices and gets ``instance_count``; group names
    are dropped so the server names them again. The dynamic batcher keeps the base's other
    fields (priority levels, queue policy) when it stays on. The shipped variant returns
    ``base`` unchanged.
    """
    config = copy.deepcopy(base)
    if variant.shipped:
        return config
    groups = config.get("instance_group") or [{"kind": "KIND_CPU"}]
    config["instance_group"] = [
        {**{k: v for k, v in g.items() if k != "name"}, "count": variant.instance_count}
        for g in groups
    ]
    config["max_batch_size"] = variant.max_batch_size
    if variant.dynamic_batching:
        dyn = dict(config.get("dynamic_batching") or {})
        dyn["preferred_batch_size"] = list(variant.preferred_batch_sizes)
        dyn["max_queue_delay_microseconds"] = variant.max_queue_delay_us
        config["dynamic_batching"] = dyn
    else:
        config.pop("dynamic_batching", None)
    return config
