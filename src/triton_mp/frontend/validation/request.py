"""``validate_request``: one inference request checked against its model's effective config.

Imported by ``frontend.inference``. Applies the request rules in Triton's order (parameters,
repeated inputs and outputs, forwarded headers, each tensor's shared-memory parameters and
data source, output names, input names, inputs, batch size, outputs) and returns a
``ValidRequest``: what the frontend writes into its arena and sends to the scheduler.
Nothing is written to shared memory here.
"""

from __future__ import annotations

from dataclasses import dataclass

from triton_mp.common.datatypes import element_count
from triton_mp.frontend.header_forward import check_forwarded, merge_forwarded
from triton_mp.frontend.model_table import Model
from triton_mp.frontend.request import InferenceRequest
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.frontend.validation.frontend_tensors import check_frontend_tensors
from triton_mp.frontend.validation.inputs import (
    ValidInput,
    check_input_names,
    check_repeated_inputs,
    read_inputs,
    read_known_inputs,
)
from triton_mp.frontend.validation.outputs import (
    check_output_names,
    check_repeated_outputs,
    read_outputs,
)
from triton_mp.frontend.validation.parameters import check_correlation_id_type, read_parameters
from triton_mp.frontend.validation.signature import Signature, SignatureCache
from triton_mp.ipc.protocol.messages import OutputRegion


@dataclass(frozen=True, slots=True)
class ValidRequest:
    """A request that passed validation (nothing written to shared memory yet)."""

    model: Model
    version: int
    batch_size: int
    """The leading dimension of every input when the model batches, else 1."""
    inputs: tuple[ValidInput, ...]
    outputs: tuple[str, ...]
    """The outputs to return, in order."""
    priority: int
    timeout_us: int
    output_regions: tuple[OutputRegion | None, ...] = ()
    """One per output when any output goes to a client's shared memory, else empty."""
    parameters_json: str = "{}"
    """Custom (non-reserved) request parameters, as JSON, for backends."""
    sequence_id: int | str = 0
    """``sequence_id``: the correlation ID (0 / "" = none)."""
    sequence_flags: int = 0
    """``SequenceFlags`` bits from ``sequence_start`` / ``sequence_end``."""


def request_prefix(request_id: str) -> str:
    """``"[request id: <id>] "``, the prefix of Triton's request errors (``<id_unknown>``
    when the client sent no id)."""
    return f"[request id: {request_id or '<id_unknown>'}] "


def validate_request(
    req: InferenceRequest,
    model: Model,
    version: int,
    shm: SystemShmRegistry | None = None,
    cache: SignatureCache | None = None,
) -> ValidRequest:
    """Check a request against the model's effective config.

    Args:
        req: the request (any transport).
        model: the model it addresses; ``version``: the concrete version resolved.
        shm: the frontend's registered client shared-memory regions.
        cache: signatures that passed before; with one, a known signature skips the
            checks its signature decides, and a request that passes adds its own.

    Returns:
        The validated request: inputs with full shapes and their bytes (raw bytes as sent,
        typed contents converted to raw little-endian form).

    Raises:
        InvalidRequest (INVALID_ARGUMENT) with Triton's message for: unknown input or
        output, missing required input, wrong datatype, wrong shape, batch over
        max_batch_size, batch mismatch between inputs, wrong byte size, missing data, typed
        contents together with raw_input_contents, shared-memory parameters for an
        unregistered region or a window outside it, reserved or malformed parameters, a
        forwarded header with a reserved name (``header_forward.check_forwarded``).
        TritonMPError (UNSUPPORTED) when client shared memory is disabled, or for the
        classification extension.
    """
    rid = request_prefix(req.id)
    options = read_parameters(req.parameters, rid)
    key = cache.key(req, version) if cache is not None else None
    known = cache.get(key, model) if cache is not None and key is not None else None
    if known is None:
        # NOTE: Triton's frontend adds the inputs, then the requested outputs (repeats of
        # either refused), then forwards the headers, then reads each tensor's
        # shared-memory parameters and contents, before the core checks the rest.
        check_repeated_inputs(req, rid)
        check_repeated_outputs(req, rid)
    parameters_json = options.parameters_json
    if req.headers:
        check_forwarded(req.headers)
        parameters_json = merge_forwarded(parameters_json, req.headers)
    if known is not None:
        inputs = read_known_inputs(req, model, known.shapes, known.counts, rid)
        regions: tuple[OutputRegion | None, ...] = ()
        batch_size, outputs = known.batch_size, known.outputs
    else:
        check_frontend_tensors(req, shm)
        check_output_names(req, model)
        check_input_names(req, model, rid)
        inputs, batch_size = read_inputs(req, model, shm, rid)
        outputs, regions = read_outputs(req, model, shm, rid)
    check_correlation_id_type(options.sequence_id, model.config, model.name, rid)
    if cache is not None and key is not None and known is None:
        shapes = tuple(i.shape for i in inputs)
        counts = tuple(element_count(s) for s in shapes)
        cache.put(key, Signature(model, shapes, counts, batch_size, outputs))
    return ValidRequest(
        model=model,
        version=version,
        batch_size=batch_size,
        inputs=inputs,
        outputs=outputs,
        priority=options.priority,
        timeout_us=options.timeout_us,
        output_regions=regions,
        parameters_json=parameters_json,
        sequence_id=options.sequence_id,
        sequence_flags=options.sequence_flags,
    )
