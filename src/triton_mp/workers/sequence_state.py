"""The worker's side of the sequence batcher: batch rows, control tensors, implicit state.

Imported by worker processes only (``workers.worker`` and the backends). The scheduler decides
which sequence sits in which batch row (``BatchAssign.rows`` / ``slots``) and which sequences
were released as idle (``BatchAssign.released``); this module turns that into what a backend
sees, as Triton's sequence batcher does (shared/reference/triton.md §4.5):

- ``batch_rows`` / ``sequence_batch``: the rows of one execution (``backend.SequenceBatch``)
  and the first row of each request in it. Rows that hold no request are "null" rows: their
  READY control is false and their input data is garbage (a copy of some real request's).
- ``control_tensors``: one extra input per ``ControlSpec`` with one element per batch row
  (shape ``[rows, 1]`` when the model batches, ``[1]`` when it does not).
- ``SequenceStates``: implicit state (``sequence_batching.state``). Per correlation ID it keeps
  each state's last output and hands it back as that sequence's next state input; the
  initial state (zeros, or a data file) on START or when the sequence has none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from triton_mp.backends.base import BackendRequest, SequenceBatch
from triton_mp.common.datatypes import DataType, bytes_tensor_elements
from triton_mp.common.errors import ConfigError, ErrorCode, TritonMPError
from triton_mp.common.numpy_tensors import deserialize_bytes_tensor
from triton_mp.ipc.protocol.messages import SequenceFlags
from triton_mp.ipc.protocol.specs import ControlSpec, ModelVersionSpec, StateSpec

_U64_MASK = (1 << 64) - 1


def control_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a control tensor of protocol datatype ``ControlSpec.datatype``.

    Raises:
        TritonMPError (INTERNAL): a datatype with no numpy type (the config validation
            allows only INT32, FP32, BOOL for flags and UINT64, INT64, UINT32, INT32,
            BYTES for CORRID).
    """
    dtype = DataType.from_wire(datatype).numpy
    if dtype is None:
        raise TritonMPError(f"control tensor of data type {datatype} has no numpy type")
    return dtype


def batch_rows(
    requests: Sequence[BackendRequest], rows: int, slots: Sequence[int]
) -> tuple[int, tuple[int, ...]]:
    """Normalise a ``BatchAssign``'s ``rows``/``slots`` for these requests.

    Args:
        requests: the requests the backend will run, in batch order.
        rows: ``BatchAssign.rows``; 0 = one row per request row, in request order.
        slots: the row of each request (same length as ``requests``) when ``rows`` > 0.

    Returns:
        ``(rows, slots)`` with ``slots`` the first row of each request.

    Raises:
        TritonMPError (INTERNAL): ``slots`` does not have one row per request, or the
            requests' rows overlap or fall outside ``[0, rows)``.
    """
    if rows == 0:
        starts = []
        row = 0
        for r in requests:
            starts.append(row)
            row += r.batch_size
        return row, tuple(starts)
    if len(slots) != len(requests):
        raise TritonMPError(
            f"sequence batch of {len(requests)} requests came with {len(slots)} slots"
        )
    used = bytearray(rows)
    for r, s in zip(requests, slots, strict=True):
        if s < 0 or s + r.batch_size > rows or any(used[s : s + r.batch_size]):
            raise TritonMPError(
                f"sequence batch rows overlap or exceed the batch: a request of batch size "
                f"{r.batch_size} in row {s} of {rows}"
            )
        used[s : s + r.batch_size] = b"\x01" * r.batch_size
    return rows, tuple(slots)


def _corrid_value(sequence_id: int | str, dtype: np.dtype) -> object:
    """A correlation ID as one element of a CORRID tensor of ``dtype``.

    Integer IDs are cut to the type's width as Triton does for 32-bit CORRID types (two's
    complement for the signed ones); BYTES gets the UTF-8 text (decimal for an integer ID).
    A string ID in a numeric CORRID (which the frontend rejects) becomes 0.
    """
    if dtype.kind == "O":
        text = sequence_id if isinstance(sequence_id, str) else str(sequence_id)
        return text.encode("utf-8")
    if isinstance(sequence_id, str):
        return 0
    return np.array(sequence_id & _U64_MASK, dtype=np.uint64).astype(dtype)


def control_tensors(
    controls: Sequence[ControlSpec],
    requests: Sequence[BackendRequest],
    rows: int,
    slots: Sequence[int],
    batched: bool,
) -> dict[str, np.ndarray]:
    """The control inputs of one execution, one element per batch row.

    START (END) is ``true_value`` in the rows of a request with ``SequenceFlags.START``
    (``SequenceFlags.END``) and ``false_value`` elsewhere; READY is true in every request's rows
    and false in null rows; CORRID is the request's ``sequence_id`` (0, or ``b""`` for BYTES,
    in null rows).

    Args:
        controls: the model's ``SequenceSpec.controls``.
        requests: the requests, with ``sequence_id`` / ``sequence_flags`` / ``batch_size``.
        rows, slots: as in ``SequenceBatch`` (normalised by ``batch_rows``).
        batched: whether the model batches (max_batch_size > 0).

    Returns:
        name -> array of shape ``[rows, 1]`` (batched) or ``[1]``; dtype int32 (INT32),
        float32 (FP32), bool (BOOL), or the CORRID type (uint64, int64, uint32, int32, or
        ``object`` holding ``bytes`` for BYTES).

    Raises:
        TritonMPError (INTERNAL): a model that does not batch was given more than one row.
    """
    if not batched and rows != 1:
        raise TritonMPError(
            f"a model with max_batch_size 0 runs one sequence request at a time, got {rows} rows"
        )
    shape = (rows, 1) if batched else (1,)
    out: dict[str, np.ndarray] = {}
    for c in controls:
        dtype = control_dtype(c.datatype)
        if c.kind == "CORRID":
            arr = np.full(shape, b"" if dtype.kind == "O" else 0, dtype=dtype)
            for r, s in zip(requests, slots, strict=True):
                arr[s : s + r.batch_size] = _corrid_value(r.sequence_id, dtype)
        else:
            arr = np.full(shape, c.false_value, dtype=dtype)
            for r, s in zip(requests, slots, strict=True):
                if c.kind == "READY":
                    on = True
                elif c.kind == "START":
                    on = bool(r.sequence_flags & SequenceFlags.START)
                else:
                    on = bool(r.sequence_flags & SequenceFlags.END)
                if on:
                    arr[s : s + r.batch_size] = c.true_value
        out[c.name] = arr
    return out


def sequence_batch(
    model: ModelVersionSpec,
    requests: Sequence[BackendRequest],
    rows: int,
    slots: Sequence[int],
) -> SequenceBatch:
    """The ``SequenceBatch`` a backend gets with these requests (rows, slots and controls).

    Args:
        model: a sequence model (``model.sequence`` is set).
        requests: the requests the backend will run, in batch order.
        rows, slots: ``BatchAssign.rows`` and the slots of these requests (see ``batch_rows``).

    Raises:
        TritonMPError (INTERNAL): rows and slots that do not fit the requests, or more than
            one row for a model that does not batch.
    """
    assert model.sequence is not None
    rows, starts = batch_rows(requests, rows, slots)
    controls = control_tensors(
        model.sequence.controls, requests, rows, starts, model.max_batch_size > 0
    )
    return SequenceBatch(rows, starts, controls)


def initial_state(model: str, state: StateSpec, batched: bool) -> np.ndarray:
    """The state input a sequence starts with (read-only).

    Zeros (``b""`` for BYTES) of ``state.dims`` with -1 as 1 for ``none`` and ``zero``; the
    data file's raw bytes for ``file`` (little-endian elements in row-major order; for
    BYTES, Triton's length-prefixed serialisation). A file for dims with exactly one -1
    fixes that dimension from its size. A batch dimension of 1 leads when ``batched``.

    Raises:
        ConfigError: a datatype without a numpy type (BF16), or a data file that cannot be
            read or whose size does not fit the dims.
    """
    dtype = DataType.from_wire(state.datatype).numpy
    where = f"initial state of '{state.input_name}' of model '{model}'"
    if dtype is None:
        raise ConfigError(
            f"{where}: implicit state of data type {state.datatype} is not supported",
            ErrorCode.UNSUPPORTED,
        )
    dims = tuple(1 if d < 0 else d for d in state.dims)
    count = int(np.prod(dims, dtype=np.int64))
    if state.initial != "file":
        arr = np.full(dims, b"", dtype=dtype) if dtype.kind == "O" else np.zeros(dims, dtype)
    else:
        try:
            data = Path(state.data_file).read_bytes()
        except OSError as e:
            raise ConfigError(f"{where}: cannot read data file '{state.data_file}': {e}") from None
        if dtype.kind == "O":
            found = bytes_tensor_elements(data)
            shape = _file_shape(state.dims, dims, found if found is not None else -1)
            if found is None or shape is None:
                raise ConfigError(
                    f"{where}: data file '{state.data_file}' holds {found} serialised "
                    f"strings, expected {count} for dims {list(state.dims)}"
                )
            arr = deserialize_bytes_tensor(data, shape)
        else:
            found = len(data) // dtype.itemsize if len(data) % dtype.itemsize == 0 else -1
            shape = _file_shape(state.dims, dims, found)
            if shape is None:
                raise ConfigError(
                    f"{where}: data file '{state.data_file}' is {len(data)} bytes, expected "
                    f"{count * dtype.itemsize} ({count} {state.datatype} elements for dims "
                    f"{list(state.dims)})"
                )
            arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    if batched:
        arr = arr[None]
    arr.flags.writeable = False
    return arr


def _file_shape(
    wild: tuple[int, ...], dims: tuple[int, ...], elements: int
) -> tuple[int, ...] | None:
    """The shape a data file of ``elements`` elements fills, or None when it fits none."""
    if elements == int(np.prod(dims, dtype=np.int64)):
        return dims
    if wild.count(-1) == 1 and elements >= 0:
        known = int(np.prod([d for d in wild if d >= 0], dtype=np.int64))
        if known > 0 and elements % known == 0:
            return tuple(elements // known if d < 0 else d for d in wild)
    return None


class SequenceStates:
    """Implicit state of one model instance, per correlation ID.

    For each ``StateSpec`` the input ``input_name`` of a sequence's request is that
    sequence's last ``output_name`` output; the initial state on START and when the sequence
    has none yet. Arrays have the request's shape: ``[1, *dims]`` when the model batches,
    ``dims`` when it does not.

    Args:
        model: a model whose ``sequence.states`` is not empty.

    Raises (from the constructor):
        ConfigError: an initial state cannot be made (see ``initial_state``).
    """

    def __init__(self, model: ModelVersionSpec) -> None:
        assert model.sequence is not None
        batched = model.max_batch_size > 0
        specs = model.sequence.states
        self._pairs = tuple((s.input_name, s.output_name) for s in specs)
        self._initial = {s.input_name: initial_state(model.model, s, batched) for s in specs}
        self._model = model.model
        self._store: dict[int | str, dict[str, np.ndarray]] = {}
        self.output_names: tuple[str, ...] = tuple(s.output_name for s in specs)
        """The state outputs the backend must produce for every request."""

    @classmethod
    def for_model(cls, model: ModelVersionSpec) -> SequenceStates | None:
        """The store for a model with implicit state; None for any other model.

        Raises:
            ConfigError: an initial state cannot be made (see ``initial_state``).
        """
        if model.sequence is None or not model.sequence.states:
            return None
        return cls(model)

    def inputs(self, sequence_id: int | str, flags: int) -> Mapping[str, np.ndarray]:
        """The state inputs of a sequence's next request (read-only: do not modify).

        A request with ``SequenceFlags.START`` gets the initial state and the sequence's old state
        is forgotten (so a START that then fails leaves no stale state behind).
        """
        if flags & SequenceFlags.START:
            self._store.pop(sequence_id, None)
            return self._initial
        stored = self._store.get(sequence_id)
        return self._initial if stored is None else stored

    def update(self, sequence_id: int | str, outputs: Mapping[str, np.ndarray]) -> None:
        """Keep a request's state outputs (copied) as the sequence's next state inputs.

        Raises:
            TritonMPError (INTERNAL): a state output is missing from ``outputs``.
        """
        kept = {}
        for input_name, output_name in self._pairs:
            arr = outputs.get(output_name)
            if arr is None:
                raise TritonMPError(
                    f"model '{self._model}' did not produce state output '{output_name}'"
                )
            kept[input_name] = np.array(arr, copy=True)
        self._store[sequence_id] = kept

    def drop(self, sequence_ids: Iterable[int | str]) -> None:
        """Forget the state of these sequences (ended or released); unknown IDs are fine."""
        for sid in sequence_ids:
            self._store.pop(sid, None)

    def __len__(self) -> int:
        """How many sequences have state kept."""
        return len(self._store)

    def __contains__(self, sequence_id: object) -> bool:
        """Whether the sequence has state kept."""
        return sequence_id in self._store
