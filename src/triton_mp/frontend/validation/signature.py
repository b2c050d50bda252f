"""``SignatureCache``: the checks of a request that depend only on its signature, done once.

Imported by ``frontend.validation.request`` (and held by ``frontend.inference``). A request's
signature is its model, version, inputs' names, datatypes and shapes, and requested output
names. For requests whose tensors carry no parameters (no shared memory, no
classification), everything ``check_input_names``, the datatype / shape / batch-size
checks of ``read_inputs`` and ``read_outputs`` decide follows from the signature alone, so a
signature that passed them once passes them again; only the data checks (where the bytes
are, their size) run per request. An entry is stored only after a request passed every
check, and holds the ``Model`` it was checked against: a reload or config change makes a new
``Model`` in the frontend's model table, and an entry for another object is a miss (and is
dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

from triton_mp.frontend.model_table import Model
from triton_mp.frontend.request import InferenceRequest

SignatureKey = tuple[object, ...]
"""(model name, version, ((input name, datatype, shape), ...), (output name, ...))."""


@dataclass(frozen=True, slots=True)
class Signature:
    """What a request with this signature passed.

    Attributes:
        model: the model object the request was checked against (identity is the key's
            guard against a reload).
        shapes: each input's full shape, in request order.
        counts: each input's element count (product of its shape).
        batch_size: the request's batch size (1 for a non-batching model).
        outputs: the outputs to return, in order (``read_outputs``' first result).
    """

    model: Model
    shapes: tuple[tuple[int, ...], ...]
    counts: tuple[int, ...]
    batch_size: int
    outputs: tuple[str, ...]


class SignatureCache:
    """Passed signatures, at most ``capacity`` (cleared whole when full: signatures come
    from a few client programs, so a full cache means one sending ever-new shapes)."""

    def __init__(self, capacity: int = 512) -> None:
        self._entries: dict[SignatureKey, Signature] = {}
        self._capacity = capacity
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(req: InferenceRequest, version: int) -> SignatureKey | None:
        """The request's signature; None when the request cannot be cached (a tensor with
        parameters or typed contents, whose frontend checks the signature does not decide,
        or a dimension that is not a plain int)."""
        inputs = []
        for t in req.inputs:
            if t.parameters or t.contents:
                return None
            shape = tuple(t.shape)
            if not all(type(d) is int for d in shape):
                return None
            inputs.append((t.name, t.datatype, shape))
        outputs = []
        for o in req.outputs:
            if o.parameters:
                return None
            outputs.append(o.name)
        return (req.model_name, version, tuple(inputs), tuple(outputs))

    def get(self, key: SignatureKey, model: Model) -> Signature | None:
        """The entry for ``key`` if it was checked against this very ``model``."""
        entry = self._entries.get(key)
        if entry is not None and entry.model is model:
            self.hits += 1
            return entry
        if entry is not None:
            del self._entries[key]  # NOTE: the model was reloaded or changed since
        self.misses += 1
        return None

    def put(self, key: SignatureKey, entry: Signature) -> None:
        """Remember a signature whose request passed every check."""
        if len(self._entries) >= self._capacity:
            self._entries.clear()
        self._entries[key] = entry

    def __len__(self) -> int:
        return len(self._entries)
