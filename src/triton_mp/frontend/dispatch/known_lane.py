"""The known requests' lane of ``frontend.inference``: which keys it takes, which request may
take it now, and the record a request on it is sent as.

Imported by ``frontend.inference`` only; no transport. The one place that decides that a key
is known (``remember``: ``dispatch.known_requests.known_request``'s rules) and that drops it
(``entry``: its model changed, the registered client regions changed under a request that
names one) or declines a request for now (draining, ordering, byte sizes). A native producer
that serves known calls itself must be taught and un-taught here, on these same events
(``/work/notes/cpp-known-path.md`` piece 3).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable

from triton_mp.frontend.classification import Classify
from triton_mp.frontend.dispatch import known_records
from triton_mp.frontend.dispatch.known_requests import (
    KnownRequest,
    KnownRequests,
    Raw,
    known_request,
)
from triton_mp.frontend.model_table import ModelTable
from triton_mp.frontend.request import InferenceRequest
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.frontend.validation.request import ValidRequest
from triton_mp.ipc import BlockRef, TensorRef


class KnownLane:
    """Known requests by key, and the checks a request makes before it takes their lane.

    Args:
        models: the model table (a key whose model is no longer current is dropped).
        shm: the registered client regions (a key naming one is dropped when they change).
    """

    __slots__ = ("_known", "_models", "_shm")

    def __init__(self, models: ModelTable, shm: SystemShmRegistry) -> None:
        self._models = models
        self._shm = shm
        self._known = KnownRequests()

    def on_forget(self, forget: Callable[[], None]) -> None:
        """``forget`` is called whenever a key is dropped or the table cleared (a producer
        taught from this lane un-learns: ``Inference.teach_with``)."""
        self._known.on_forget = forget

    @property
    def keys(self) -> Container[Hashable]:
        """The keys ``entry`` may take requests for (it may still decline one)."""
        return self._known

    def remember(
        self,
        key: Hashable,
        request: InferenceRequest,
        valid: ValidRequest,
        classify: Classify | None,
        held: tuple[int, ...],
    ) -> None:
        """Keep a request that passed as known if it qualifies: no classification, and
        ``known_request``'s rules (``held``: the client regions it names)."""
        if classify is None and key not in self._known:
            known = known_request(request, valid, held, self._shm.generation)
            if known is not None:
                self._known.put(key, known)

    def entry(self, key: Hashable, raw: Raw, in_task: bool, draining: bool) -> KnownRequest | None:
        """The known request ``key`` names, if ``raw`` may take its lane now: not while
        ``draining``, not for a model that preserves ordering unless ``in_task``
        (``Inference.submit_known``), and only with the byte sizes it was kept with. A key
        whose model changed, or that names a client region after the regions changed, is
        dropped."""
        known = self._known.get(key)
        if known is None or draining or not in_task and known.model.preserve_ordering:
            return None
        if not self._models.is_current(known.model):
            self._known.drop(key)
            return None
        if known.held and known.generation != self._shm.generation:
            self._known.drop(key)  # NOTE: a region it names may have changed
            return None
        if not known.matches(raw):
            return None
        return known


def patched_record(
    known: KnownRequest,
    rid: int,
    client_id: str,
    arrival_ns: int,
    block: BlockRef,
    refs: tuple[TensorRef, ...],
) -> tuple[bytes, int] | None:
    """Request ``rid``'s REQUEST record and quiet-word bit, patched from the template of its
    form (``dispatch.known_records``), or None when the form has none yet or the request
    holds client regions (``Inference._enqueue`` holds them)."""
    template = known.templates.get((block.segment, client_id))
    if template is None or known.held:
        return None
    return known_records.patched(template[0], rid, arrival_ns, block, refs), template[1]
