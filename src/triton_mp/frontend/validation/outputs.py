"""A request's requested outputs: names, shared memory, the classification extension.

Imported by ``frontend.validation``. An output asked for twice is refused, as upstream core
main refuses it since PR #493 (Triton 2.51 returned it once); none asked for means every
output of the model; an output may be written into a client's registered
shared memory (``shared_memory_*`` parameters); a ``classification`` output is answered as its
top-k classes (``frontend.classification``, applied to the response). Messages follow core
``infer_request.cc`` and server ``infer_handler.cc``.
"""

from __future__ import annotations

from triton_mp.common.errors import InvalidRequest
from triton_mp.frontend.model_table import Model
from triton_mp.frontend.request import InferenceRequest
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.frontend.validation.shared_memory import shm_window, uses_shm
from triton_mp.ipc.protocol.messages import OutputRegion


def check_repeated_outputs(req: InferenceRequest, rid: str) -> None:
    """No output is requested twice: core ``AddOriginalRequestedOutput`` on upstream main
    (PR #493), called as the frontend adds each requested output, after the inputs and
    before any tensor's data or shared memory is read. Triton 2.51 returned such an output
    once; triton-mp follows main.

    Raises:
        InvalidRequest: "<rid>output '<name>' already exists in request".
    """
    if len(req.outputs) < 2:
        return
    seen: set[str] = set()
    for o in req.outputs:
        if o.name in seen:
            raise InvalidRequest(f"{rid}output '{o.name}' already exists in request")
        seen.add(o.name)


def check_output_names(req: InferenceRequest, model: Model) -> None:
    """Every requested output is one of the model's: core ``Normalize`` checks them before
    any input (``ValidateRequestInputs`` comes after), in the order of its
    ``std::set<std::string>`` of names (sorted bytewise: code points, as Python sorts).

    Raises:
        InvalidRequest: "unexpected inference output '<o>' for model '<m>'" (the model's
            own message: no request id).
    """
    for name in sorted({o.name for o in req.outputs}):
        if name not in model.outputs:
            raise InvalidRequest(unknown_output_message(name, model.name))


def unknown_output_message(output: str, model: str) -> str:
    """Core ``Model::GetOutput`` for a name the config lacks."""
    return f"unexpected inference output '{output}' for model '{model}'"


def read_outputs(
    req: InferenceRequest, model: Model, shm: SystemShmRegistry | None, rid: str
) -> tuple[tuple[str, ...], tuple[OutputRegion | None, ...]]:
    """The outputs to return, in order, and where each is written.

    Returns:
        The output names (the model's, in config order, when the request lists none), and
        one region per output (None: into the response), or ``()`` when no output goes to
        shared memory.

    ``check_repeated_outputs`` ran first: each output is named once.

    Raises:
        InvalidRequest: an unknown output; a
            malformed shared-memory window.
        TritonMPError: as ``shm_window``.
    """
    name = model.name
    outputs: list[str] = []
    regions: list[OutputRegion | None] = []
    for o in req.outputs:
        if o.name not in model.outputs:
            raise InvalidRequest(unknown_output_message(o.name, name))
        if uses_shm(o.parameters):
            w = shm_window(shm, o.parameters, o.name)
            regions.append(OutputRegion(w.key, w.region_id, w.offset, w.byte_size, w.name))
        else:
            regions.append(None)
        outputs.append(o.name)
    if not outputs:
        return tuple(model.outputs), ()
    return tuple(outputs), tuple(regions) if any(r is not None for r in regions) else ()
