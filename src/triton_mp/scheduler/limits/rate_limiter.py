"""The rate limiter (``--rate-limit execution_count``): which formed batch may start now.

Imported by ``scheduler.core`` (and by the supervisor's load checks, ``check_resources``);
pure, no I/O, no clock. Triton's rules (core ``rate_limiter.cc``, the rate limiter doc):

- Each instance group may name resources (``rate_limiter { resources [{ name, global,
  count }] }``). A resource is either global (one pool for the server) or per device (one
  pool per device; a CPU instance draws from device 0's).
- A pool's size is the ``--rate-limit-resource <name>:<count>[:<device>]`` given for it
  (no device: every device; for a global resource the device is ignored); without any
  ``--rate-limit-resource`` it is the largest count any instance asks for. Once any is given,
  a resource not given has 0, so an instance that needs it can never run: that is an error
  (``Resource count for "<r>" is limited to <n> which will prevent scheduling of one or
  more model instances, the minimum required count is <m>``), as is a name used both
  globally and per device (``Resource "<r>" is present as both global and device-specific
  resource in the model configuration.``).
- A batch formed for an instance waits (staged) until every resource its instance needs is
  free, holds them while it runs, and gives them back when it ends. Among the staged
  instances the one with the lowest ``executions x max(priority, 1)`` goes first (ties: the
  one staged first); when it does not fit, no later one is started before it (Triton's
  strict head of the queue), which is what gives priority 2 half the executions of
  priority 1 under contention.

Triton starts at most one staged instance per event; this starts every one that fits, in
order, so a freed resource never idles while a staged batch could use it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import NamedTuple

GLOBAL = -1
"""The pool key of a global resource (devices are >= 0)."""
PER_DEVICE = -1
"""``--rate-limit-resource`` device meaning every device."""

PoolKey = tuple[int, str]
"""(device, or ``GLOBAL``; resource name)."""


class Limits(NamedTuple):
    """One instance's ``rate_limiter`` (``ipc.protocol.specs.RateLimitSpec`` without ipc)."""

    resources: tuple[tuple[str, bool, int], ...] = ()
    """(name, global, count) per resource."""
    priority: int = 0
    device: int = 0
    """Whose per-device pools it draws from."""


def needs(limits: Limits) -> dict[PoolKey, int]:
    """What one instance holds while it runs, per pool."""
    out: dict[PoolKey, int] = {}
    for name, is_global, count in limits.resources:
        out[(GLOBAL if is_global else limits.device, name)] = count
    return out


def pool_sizes(
    demands: Iterable[dict[PoolKey, int]], explicit: Iterable[tuple[str, int, int]]
) -> dict[PoolKey, int]:
    """Each pool's size for these instances' needs and the explicit counts.

    Args:
        demands: each instance's ``needs``.
        explicit: ``--rate-limit-resource`` as (name, count, device or ``PER_DEVICE``).

    Raises:
        ValueError: Triton's message for a name both global and per device, or for a count
            below what an instance needs.
    """
    sizes: dict[PoolKey, int] = {}
    for d in demands:
        for key, count in d.items():
            sizes[key] = max(sizes.get(key, 0), count)
    global_names = {name for dev, name in sizes if dev == GLOBAL}
    for dev, name in sizes:
        if dev != GLOBAL and name in global_names:
            raise ValueError(
                f'Resource "{name}" is present as both global and device-specific resource '
                "in the model configuration."
            )
    given = list(explicit)
    if not given:
        return sizes
    for (dev, name), needed in sizes.items():
        counts = [c for n, c, d in given if n == name and (dev == GLOBAL or d in (dev, PER_DEVICE))]
        count = max(counts, default=0)
        if count < needed:
            raise ValueError(
                f'Resource count for "{name}" is limited to {count} which will prevent '
                "scheduling of one or more model instances, the minimum required count is "
                f"{needed}"
            )
        sizes[(dev, name)] = count
    return sizes


def check_resources(
    specs: Iterable[Limits], explicit: Iterable[tuple[str, int, int]]
) -> str | None:
    """Triton's load-time error for these instances' resources, or None when they can run."""
    try:
        pool_sizes((needs(s) for s in specs), explicit)
    except ValueError as e:
        return str(e)
    return None


class RateLimiter:
    """The pools, the staged instances and who holds what.

    Args:
        explicit: ``--rate-limit-resource`` as (name, count, device or ``PER_DEVICE``).
    """

    def __init__(self, explicit: Iterable[tuple[str, int, int]] = ()) -> None:
        self._explicit = tuple(explicit)
        self._needs: dict[int, dict[PoolKey, int]] = {}
        self._priority: dict[int, int] = {}
        self.executions: dict[int, int] = {}
        """Per instance: batches it finished under the limiter (``release``)."""
        self._sizes: dict[PoolKey, int] = {}
        self._used: dict[PoolKey, int] = {}
        self._staged: dict[int, int] = {}
        """Staged instance -> its staging sequence number (the tie-break)."""
        self._holding: set[int] = set()
        self._seq = itertools.count()
        self.error: str | None = None
        """The last registration's resource error (logged by the core), if any."""

    # ---------------------------------------------------------------- instances
    def register(self, instance_id: int, spec: Limits) -> None:
        """Know an instance's needs and priority (again: replaced)."""
        self._needs[instance_id] = needs(spec)
        self._priority[instance_id] = max(spec.priority, 1)
        self.executions.setdefault(instance_id, 0)
        self._resize()

    def known(self, instance_id: int) -> bool:
        """Whether ``register`` saw the instance."""
        return instance_id in self._needs

    def remove(self, instance_id: int) -> None:
        """Forget an instance that is gone for good."""
        self.forget(instance_id)
        self._needs.pop(instance_id, None)
        self._priority.pop(instance_id, None)
        self.executions.pop(instance_id, None)
        self._resize()

    def forget(self, instance_id: int) -> None:
        """Drop the instance's staged batch and give back what it holds (its worker
        died: the core fails that batch)."""
        self._staged.pop(instance_id, None)
        if instance_id in self._holding:
            self._give_back(instance_id)

    def _resize(self) -> None:
        try:
            self._sizes = pool_sizes(self._needs.values(), self._explicit)
            self.error = None
        except ValueError as e:
            # NOTE: the supervisor refuses such models at load (check_resources); pools
            # keep their previous sizes if one slips through (a conflict across models).
            self.error = str(e)

    # ------------------------------------------------------------------ batches
    def stage(self, instance_id: int) -> None:
        """A batch was formed for the instance: it waits for its resources."""
        self._staged[instance_id] = next(self._seq)

    def staged(self, instance_id: int) -> bool:
        """Whether the instance's batch waits for resources."""
        return instance_id in self._staged

    def allocate(self) -> list[int]:
        """Start every staged instance that fits, lowest executions x priority first,
        stopping at the first that does not fit; returns them in that order (each now
        holds its resources)."""
        started = []
        while self._staged:
            top = min(self._staged, key=self._rank)
            need = self._needs.get(top, {})
            if any(self._used.get(k, 0) + c > self._sizes.get(k, 0) for k, c in need.items()):
                break
            del self._staged[top]
            for k, c in need.items():
                self._used[k] = self._used.get(k, 0) + c
            self._holding.add(top)
            started.append(top)
        return started

    def _rank(self, instance_id: int) -> tuple[int, int]:
        scaled = self.executions.get(instance_id, 0) * self._priority.get(instance_id, 1)
        return (scaled, self._staged[instance_id])

    def release(self, instance_id: int) -> None:
        """The instance's batch ended: its resources are free, its execution counted."""
        if instance_id in self._holding:
            self._give_back(instance_id)
            self.executions[instance_id] = self.executions.get(instance_id, 0) + 1

    def _give_back(self, instance_id: int) -> None:
        self._holding.discard(instance_id)
        for k, c in self._needs.get(instance_id, {}).items():
            self._used[k] = self._used.get(k, 0) - c

    def in_use(self) -> dict[PoolKey, int]:
        """Units held now, per pool (tests, status)."""
        return {k: v for k, v in self._used.items() if v}
