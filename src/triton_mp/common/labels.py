"""Unique labels for instances that share a name: the ``instance`` label of ``/metrics``'
``triton_mp_instance_*`` and ``triton_mp_process_resident_memory_bytes`` series and the
instance rows of ``triton-mp stat``.

Imported by ``scheduler.status`` (per model version, in the version's instance order) and
``frontend.metrics.host`` (per process role, in pid order). Triton 2.51 names an instance
``<group>_<c>`` when it creates it and lets a kept instance keep its name, so after an in-place
count change 2 -> 1 -> 2 two live instances of one version are both ``<group>_1``
(core ``TritonModel::PrepareInstances``); the versions of one model also share their
instances' names. The model reads the name 2.51 gives (``args['model_instance_name']``);
our own outputs must not show two series or rows with the same labels (Prometheus rejects
them), so ``unique_labels`` keeps the first of each name as it is and gives the k-th
(k >= 2) ``<name>#<k>`` (docs/metrics.md, "Instance labels").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

__all__ = ["unique_labels"]


def unique_labels(names: Iterable[str]) -> list[str]:
    """One label per name, in order, no two equal: a name seen for the first time is its own
    label; its k-th occurrence is ``<name>#<k>``, or ``<name>#<k+1>`` and so on when that is
    itself one of ``names`` or already given."""
    names = list(names)
    taken = set(names)
    seen: Counter[str] = Counter()
    out: list[str] = []
    for name in names:
        seen[name] += 1
        if seen[name] == 1:
            out.append(name)
            continue
        k = seen[name]
        while f"{name}#{k}" in taken:
            k += 1
        label = f"{name}#{k}"
        taken.add(label)
        out.append(label)
    return out
