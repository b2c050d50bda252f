"""Model warmup (``model_warmup``): the samples an instance runs before it reports ready.

Imported by worker processes (``workers.main`` runs ``warm_up`` after the backend loaded
and before the instance's ``Ready``, so the scheduler sends it no work and the model is not
ready until every sample ran; a restarted instance warms up again). Triton's
``TritonModelInstance::GenerateWarmupData`` and ``WarmUp`` (core
``backend_model_instance.cc``), rule for rule and message for message:

- a sample with ``batch_size`` 0 is skipped; otherwise it is ``batch_size`` requests, each
  of batch 1 (shape ``[1] + dims`` when the model batches, ``dims`` when not), executed
  together as one batch ``max(count, 1)`` times, straight on the backend (no scheduler);
- every input needs concrete dims ("warmup setting expects all variable-size dimensions
  are specified for input '<i>'") and a data source: ``zero_data`` (zeros; empty strings for
  STRING), ``random_data`` (random bytes; empty strings for STRING) or ``input_data_file``
  (the file's raw bytes, little-endian and row-major; STRING elements length-prefixed). A
  file shorter than the tensor fails ("warmup setting expects N bytes, but the data
  provided from Fonly has M bytes": Triton's text, missing space included);
- a request needs the config's required inputs ("expected 1 inputs but got 0 inputs for
  model '<m>'. Got input(s) [], but missing required input(s) ['<i>']. ..."), and the inputs
  the config lists must match its data type and dims (Triton's normalisation messages);
  sequence control inputs (``sequence_batching.control_input`` names) may be given too and
  reach the backend as the batch's control tensors;
- decoupled models: a request ends with its final response, whichever thread sends it;
- any error response fails the sample ("failed to run warmup sample '<name>': <error>; ")
  and with it the instance's load. Outputs are discarded.

One DEBUG line (``--log-verbose 1``) per sample iteration, as Triton's LOG_VERBOSE(1).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from triton_mp.backends.base import Backend, BackendRequest, Responded, SequenceBatch
from triton_mp.common.datatypes import DataType, element_count
from triton_mp.common.errors import ErrorCode, TritonMPError, flatten_exception
from triton_mp.common.input_checks import count_message
from triton_mp.common.numpy_tensors import deserialize_bytes_tensor
from triton_mp.ipc.protocol.messages import ErrorInfo, WarmupRun
from triton_mp.ipc.protocol.specs import ModelVersionSpec, WarmupInputSpec

log = logging.getLogger(__name__)

__all__ = ["WarmupSample", "WarmupToken", "build_samples", "warm_up"]

_LOG_REQUEST = "[request id: <id_unknown>] "
"""Triton's ``LogRequest()`` prefix of a request without an id (every warmup request)."""


@dataclass
class WarmupSample:
    """One sample ready to run.

    Attributes:
        name: the sample's name.
        count: executions (at least 1).
        requests: per request, input name -> array (config inputs only).
        controls: per request, sequence control name -> array.
    """

    name: str
    count: int
    requests: list[dict[str, np.ndarray]]
    controls: list[dict[str, np.ndarray]]


@dataclass(eq=False)
class WarmupToken:
    """The handle of one warmup request (``BackendRequest.token``): the worker's
    ``respond`` records its responses here instead of sending them anywhere."""

    errors: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def record(self, result: object, final: bool) -> None:
        """One response of the request (outputs are dropped); ``final`` ends it."""
        if isinstance(result, ErrorInfo):
            self.errors.append(result.message)
        if final:
            self.done.set()


def _byte_size(datatype: DataType, dims: tuple[int, ...]) -> int:
    """Triton's GetByteSize: 4 bytes per STRING element, else elements x item size."""
    n = element_count(dims)
    return 4 * n if datatype is DataType.STRING else n * (datatype.item_size or 0)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TritonMPError(
            f"failed to open text file for read {path}: {os.strerror(e.errno or 0)}",
            ErrorCode.INVALID_ARG,
        ) from None


def _array(inp: WarmupInputSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """One request's tensor of ``inp`` (already checked: concrete dims, a source).

    Raises:
        TritonMPError (INVALID_ARG): a data file that cannot be read, is too short, or (for
            STRING) does not hold the tensor's elements.
    """
    datatype = DataType.from_wire(inp.datatype)
    if datatype is DataType.INVALID:
        # NOTE: no data type: Triton takes no bytes for it, and the data type check of a
        # config input refuses it next; a control input reaches the backend as bytes.
        return np.zeros(shape, dtype=np.uint8)
    # NOTE: BF16 has no numpy type: raw 16-bit words stand in.
    dtype = datatype.numpy or np.dtype(np.uint16)
    n = element_count(shape)
    if inp.source == "file":
        data = _read(inp.data_file)
        if datatype is DataType.STRING:
            try:
                return deserialize_bytes_tensor(data, shape)
            except ValueError as e:
                raise TritonMPError(
                    f"{_LOG_REQUEST}warmup data for input '{inp.name}' from {inp.file_name}: {e}",
                    ErrorCode.INVALID_ARG,
                ) from None
        need = _byte_size(datatype, inp.dims)
        if need > len(data):
            raise TritonMPError(
                f"{_LOG_REQUEST}warmup setting expects {need} bytes, but the data provided "
                f"from {inp.file_name}only has {len(data)} bytes",
                ErrorCode.INVALID_ARG,
            )
        return np.frombuffer(data[: n * dtype.itemsize], dtype=dtype).reshape(shape).copy()
    if datatype is DataType.STRING:
        return np.array([b""] * n, dtype=np.object_).reshape(shape)
    if inp.source == "zero":
        return np.zeros(shape, dtype=dtype)
    raw = rng.bytes(n * dtype.itemsize)
    arr = np.frombuffer(raw, dtype=np.uint8).reshape(-1)
    if dtype == np.bool_:
        return arr.astype(np.bool_).reshape(shape)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
    "to be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def _dims(dims: tuple[int, ...]) -> str:
    """Triton's DimsListToString: ``[-1,3]``."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def _check_input(model: ModelVersionSpec, inp: WarmupInputSpec) -> None:
    """Triton's normalisation of an original input: the config's data type, and dims that
    the config's dims (-1 matching any) accept."""
    for t in model.inputs:
        if t.name != inp.name:
            continue
        if t.datatype != inp.datatype:
            raise TritonMPError(
                f"{_LOG_REQUEST}inference input '{inp.name}' data-type is '{inp.datatype}', "
                f"but model '{model.model}' expects '{t.datatype}'",
                ErrorCode.INVALID_ARG,
            )
        if len(t.dims) != len(inp.dims) or any(
            c not in (-1, d) for c, d in zip(t.dims, inp.dims, strict=True)
        ):
            batched = model.max_batch_size > 0
            full = ((-1,) if batched else ()) + t.dims
            got = ((1,) if batched else ()) + inp.dims
            raise TritonMPError(
                f"{_LOG_REQUEST}unexpected shape for input '{inp.name}' for model "
                f"'{model.model}'. Expected {_dims(full)}, got {_dims(got)}. "
                + (_BATCH_NOTE if batched else ""),
                ErrorCode.INVALID_ARG,
            )


def _check_request(
    model: ModelVersionSpec, inputs: Sequence[WarmupInputSpec], feeds: dict[str, np.ndarray]
) -> None:
    """Core ``PrepareForInference`` of one warmup request, whose original inputs are the
    sample's inputs the config lists (the others reach the backend as override inputs):
    first the input count (``ValidateRequestInputs``), then each input's data type and dims.

    Raises:
        TritonMPError (INVALID_ARG): Triton's words.
    """
    given = [n for n in feeds if any(t.name == n for t in model.inputs)]
    required = [t.name for t in model.inputs if not t.optional]
    if len(given) > len(model.inputs) or len(given) < len(required):
        raise TritonMPError(
            count_message(_LOG_REQUEST, model.model, given, required, len(model.inputs)),
            ErrorCode.INVALID_ARG,
        )
    for inp in inputs:
        if inp.name in given:
            _check_input(model, inp)


def build_samples(model: ModelVersionSpec, seed: int | None = None) -> list[WarmupSample]:
    """The data of every sample of ``model.warmup`` with a non-zero ``batch_size``.

    Args:
        model: the version's spec (its ``warmup``, inputs, sequence controls).
        seed: seeds ``random_data`` (None: fresh entropy, as Triton's ``rand()``).

    Raises:
        TritonMPError (INVALID_ARG): Triton's warmup setting errors (see the module).
    """
    rng = np.random.default_rng(seed)
    config_inputs = {t.name for t in model.inputs}
    controls = {c.name for c in model.sequence.controls} if model.sequence else set()
    batched = model.max_batch_size > 0
    out = []
    for sample in model.warmup:
        if sample.batch_size == 0:
            log.debug("Skipping batch 0 warmup sample '%s'", sample.name)
            continue
        log.debug("Generating warmup sample data for '%s'", sample.name)
        for inp in sample.inputs:
            if -1 in inp.dims:
                raise TritonMPError(
                    "warmup setting expects all variable-size dimensions are specified for "
                    f"input '{inp.name}'",
                    ErrorCode.INVALID_ARG,
                )
        requests: list[dict[str, np.ndarray]] = []
        control_rows: list[dict[str, np.ndarray]] = []
        for _ in range(sample.batch_size):
            feeds: dict[str, np.ndarray] = {}
            ctl: dict[str, np.ndarray] = {}
            for inp in sample.inputs:
                if not inp.source:
                    raise TritonMPError(
                        f"{_LOG_REQUEST}warmup setting expects input '{inp.name}' to have "
                        "input_data_type set",
                        ErrorCode.INVALID_ARG,
                    )
                original = inp.name in config_inputs
                shape = ((1,) if batched and original else ()) + inp.dims
                if inp.name in controls and not original:
                    ctl[inp.name] = _array(inp, ((1,) if batched else ()) + inp.dims, rng)
                    continue
                feeds[inp.name] = _array(inp, shape, rng)
            _check_request(model, sample.inputs, feeds)
            requests.append(feeds)
            control_rows.append(ctl)
        out.append(WarmupSample(sample.name, max(1, sample.count), requests, control_rows))
    return out


def _sequence_batch(sample: WarmupSample) -> SequenceBatch:
    """The requests of a sample side by side, one row each, with their control tensors."""
    rows = len(sample.requests)
    names = sorted({n for c in sample.controls for n in c})
    controls = {n: np.concatenate([c[n] for c in sample.controls if n in c], axis=0) for n in names}
    return SequenceBatch(rows, tuple(range(rows)), controls)


def _run_once(
    backend: Backend, model: ModelVersionSpec, sample: WarmupSample, outputs: tuple[str, ...]
) -> tuple[list[str], WarmupRun]:
    """One execution of a sample: the error messages of its responses, and the run as the
    scheduler counts it (``WarmupRun``)."""
    tokens = [WarmupToken() for _ in sample.requests]
    reqs = [
        BackendRequest(feeds, outputs, 1, token=token)
        for feeds, token in zip(sample.requests, tokens, strict=True)
    ]
    start = time.monotonic_ns()
    try:
        if model.sequence is None:
            results, phases = backend.execute(reqs)
        else:
            results, phases = backend.execute(reqs, _sequence_batch(sample))
    except Exception as exc:  # noqa: BLE001 - a failing sample fails the load, with the reason
        return [flatten_exception(exc)], (len(reqs), start, 0, 0, time.monotonic_ns())
    errors: list[str] = []
    for token, res in zip(tokens, results, strict=False):
        if isinstance(res, Responded):
            # NOTE: decoupled: the final response may come from a model thread later.
            token.done.wait()
            errors.extend(token.errors)
        elif isinstance(res, ErrorInfo):
            errors.append(res.message)
    if len(results) != len(reqs):
        errors.append(f"backend returned {len(results)} results for {len(reqs)} requests")
    run = (len(reqs), start, phases.compute_input_ns, phases.compute_infer_ns)
    return errors, (*run, time.monotonic_ns())


def warm_up(
    backend: Backend,
    model: ModelVersionSpec,
    instance_name: str,
    samples: list[WarmupSample],
) -> tuple[WarmupRun, ...]:
    """Run every sample on ``backend``, ``count`` times each, in order; returns each
    execution as the scheduler counts it in the model's statistics, as Triton does.

    Raises:
        TritonMPError (INVALID_ARG): "failed to run warmup sample '<name>': <errors>" at
            the first sample with an error response; later samples do not run.
    """
    outputs = tuple(t.name for t in model.outputs)
    runs: list[WarmupRun] = []
    for sample in samples:
        for iteration in range(1, sample.count + 1):
            log.debug(
                "model '%s' instance %s is running warmup sample '%s' for iteration %d",
                model.model,
                instance_name,
                sample.name,
                iteration,
            )
            errors, run = _run_once(backend, model, sample, outputs)
            runs.append(run)
            if errors:
                log.debug(
                    "model '%s' instance %s failed to run warmup sample '%s'",
                    model.model,
                    instance_name,
                    sample.name,
                )
                raise TritonMPError(
                    f"failed to run warmup sample '{sample.name}': "
                    + "".join(f"{e}; " for e in errors),
                    ErrorCode.INVALID_ARG,
                )
    return tuple(runs)
