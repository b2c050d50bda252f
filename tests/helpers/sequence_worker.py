"""The in-process sequence-worker harness of ``tests/integration/test_sequence_worker_inproc.py``
(not a test module): a tiny accumulator ONNX model built with ``onnx.helper`` (``OUTPUT = INPUT +
STATE_IN``, ``STATE_OUT = OUTPUT``, each control input echoed as an output), its specs, and a
``Client`` that plays the frontend (inputs in its own arena) and the scheduler (``BatchAssign``
with rows, slots and released IDs) around a real ``Worker``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import onnx
from onnx import TensorProto, helper

from triton_mp.backends.onnxruntime.backend import OnnxRuntimeBackend
from triton_mp.common.numpy_tensors import NUMPY_DTYPES, deserialize_bytes_tensor
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    BatchAssign,
    BatchDone,
    BlockRef,
    InferRequest,
    InferResponse,
    ReplyTo,
    Requester,
    TensorRef,
)
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    ChannelSpec,
    ControlSpec,
    InboxSpec,
    InstanceSpec,
    LogSpec,
    ModelVersionSpec,
    SequenceSpec,
    StateSpec,
    TensorSpec,
    WorkerSpec,
)
from triton_mp.ipc.tensor_pool import (
    BLOCK_HEADER_BYTES,
    ArenaAllocator,
    SegmentCache,
    SharedBlocks,
    free_block,
)
from triton_mp.workers.worker import Worker

PID = os.getpid()
"""Names the arenas and unused channels ``/triton_mp_<pid>_test_*``: unlinked by the tests."""

INSTANCE = InstanceSpec(instance_id=0, name="acc_0", model="acc", version=1)

_ONNX_TYPES = {
    "FP32": TensorProto.FLOAT,
    "INT32": TensorProto.INT32,
    "BOOL": TensorProto.BOOL,
    "UINT64": TensorProto.UINT64,
    "BYTES": TensorProto.STRING,
}
CONTROLS = {"START": "INT32", "END": "FP32", "READY": "BOOL"}
"""Control kind -> its data type in the accumulator model (CORRID's type is a parameter)."""


def accumulator_onnx(
    path: Path, *, batched: bool = True, corrid: str = "UINT64", leave_out: str = ""
) -> None:
    """Write the accumulator: ``OUTPUT = INPUT + STATE_IN``, ``STATE_OUT = OUTPUT`` and
    ``<KIND>_OUT = <KIND>`` for the controls START (INT32), END (FP32), READY (BOOL) and
    CORRID (``corrid``). Tensors are ``[batch, 1]`` (``[1]`` unbatched); ``leave_out`` names
    a graph input to omit (its identity output goes too)."""
    shape: list[int | str] = ["batch", 1] if batched else [1]
    types = {"INPUT": "FP32", "STATE_IN": "FP32", **CONTROLS, "CORRID": corrid}
    inputs = [
        helper.make_tensor_value_info(name, _ONNX_TYPES[t], shape)
        for name, t in types.items()
        if name != leave_out
    ]
    nodes = [
        helper.make_node(
            "Add", ["INPUT", "INPUT" if leave_out == "STATE_IN" else "STATE_IN"], ["OUTPUT"]
        ),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
    ]
    outputs = [
        helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, shape),
        helper.make_tensor_value_info("STATE_OUT", TensorProto.FLOAT, shape),
    ]
    for kind in ("START", "END", "READY", "CORRID"):
        if kind == leave_out:
            continue
        nodes.append(helper.make_node("Identity", [kind], [f"{kind}_OUT"]))
        outputs.append(
            helper.make_tensor_value_info(f"{kind}_OUT", _ONNX_TYPES[types[kind]], shape)
        )
    graph = helper.make_graph(nodes, "acc", inputs, outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def acc_spec(
    model_file: Path,
    *,
    batched: bool = True,
    corrid: str = "UINT64",
    initial: str = "zero",
    data_file: str = "",
    strategy: str = "direct",
) -> ModelVersionSpec:
    """The accumulator's spec: config outputs OUTPUT, STATE_OUT and the control echoes."""
    mbs = 4 if batched else 0
    controls = tuple(
        ControlSpec(name=kind, kind=kind, datatype=t)  # type: ignore[arg-type]
        for kind, t in {**CONTROLS, "CORRID": corrid}.items()
    )
    state = StateSpec(
        input_name="STATE_IN",
        output_name="STATE_OUT",
        datatype="FP32",
        dims=(1,),
        initial=initial,  # type: ignore[arg-type]
        data_file=data_file,
    )
    out_types = {"OUTPUT": "FP32", "STATE_OUT": "FP32"}
    out_types |= {f"{k}_OUT": t for k, t in {**CONTROLS, "CORRID": corrid}.items()}
    return ModelVersionSpec(
        model="acc",
        version=1,
        backend="onnxruntime",
        model_file=str(model_file),
        max_batch_size=mbs,
        batching=BatchingSpec(kind="sequence", max_batch_size=mbs),
        inputs=(TensorSpec(name="INPUT", datatype="FP32", dims=(1,)),),
        outputs=tuple(TensorSpec(name=n, datatype=t, dims=(1,)) for n, t in out_types.items()),
        instance_ids=(0,),
        sequence=SequenceSpec(
            strategy=strategy,  # type: ignore[arg-type]
            controls=controls,
            states=(state,),
        ),
    )


def worker_spec(model: ModelVersionSpec) -> WorkerSpec:
    return WorkerSpec(
        instance=INSTANCE,
        model=model,
        # NOTE: Worker never touches its channels; run_worker does. These names are never opened.
        inbox=InboxSpec(f"/triton_mp_{PID}_test_unused_sem", ()),
        to_scheduler=ChannelSpec(f"/triton_mp_{PID}_test_unused_ring", "unused"),
        to_frontends={},
        arena_prefix=f"/triton_mp_{PID}_test_seqworker",
        arena_bytes=1 << 16,
        arena_budget_bytes=1 << 20,
        log=LogSpec(),
    )


@dataclass
class Client:
    """This test as frontend and scheduler: writes requests, runs batches, reads answers."""

    arena: ArenaAllocator
    cache: SegmentCache
    worker: Worker
    batched: bool
    responses: list[InferResponse] = field(default_factory=list)
    shared: SharedBlocks = field(default_factory=SharedBlocks)
    done: list[BatchDone] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def request(
        self,
        sequence_id: int | str,
        value: float,
        flags: int = 0,
        outputs: Sequence[str] = ("OUTPUT",),
    ) -> InferRequest:
        arr = np.array([[value]] if self.batched else [value], np.float32)
        seg, block = self.arena.alloc(arr.nbytes)
        pos = block + BLOCK_HEADER_BYTES
        seg.buf[pos : pos + arr.nbytes] = arr.tobytes()
        rid = next(self.ids)
        return InferRequest(
            request_id=rid,
            reply_to=ReplyTo(Requester.FRONTEND, 0),
            model="acc",
            version=1,
            batch_size=1,
            inputs=(TensorRef("INPUT", "FP32", arr.shape, seg.name, pos, arr.nbytes),),
            outputs=tuple(outputs),
            block=BlockRef(seg.name, block),
            arrival_ns=0,
            sequence_id=sequence_id,
            sequence_flags=flags,
        )

    def run(
        self,
        requests: Sequence[InferRequest],
        rows: int = 0,
        slots: Sequence[int] = (),
        released: Sequence[int | str] = (),
    ) -> list[dict[str, Any]]:
        """Run one batch; each request's outputs by name (an ErrorInfo's message under
        ``"error"``). Frees the request and response blocks as a frontend would."""
        n = len(self.responses)
        self.worker.run_batch(
            BatchAssign(
                batch_id=next(self.ids),
                requests=tuple(requests),
                dispatch_ns=0,
                rows=rows,
                slots=tuple(slots),
                released=tuple(released),
            )
        )
        answers = []
        for req, resp in zip(requests, self.responses[n:], strict=True):
            assert resp.request_id == req.request_id
            if resp.error is not None:
                answers.append({"error": resp.error.message})
            else:
                answers.append({ref.name: self.read(ref) for ref in resp.outputs})
            for b in self.shared.released(resp):
                free_block(self.cache.get(b.segment), b)
            free_block(self.cache.get(req.block.segment), req.block)
        return answers

    def read(self, ref: TensorRef) -> np.ndarray:
        seg = self.cache.get(ref.segment)
        if ref.datatype == "BYTES":
            return deserialize_bytes_tensor(
                memoryview(seg.buf)[ref.offset : ref.offset + ref.nbytes], ref.shape
            )
        dtype = NUMPY_DTYPES[ref.datatype]
        count = ref.nbytes // dtype.itemsize
        view = np.frombuffer(seg.buf, dtype, count=count, offset=ref.offset)
        return view.reshape(ref.shape).copy()

    def to_frontend(self, reply_to: ReplyTo, msg: object) -> None:
        if isinstance(msg, AnswerBatch):  # several requests of a batch, one block
            assert self.shared.arrived(msg) == []
            self.responses += msg.responses
            return
        assert isinstance(msg, InferResponse)
        self.responses.append(msg)

    def to_scheduler(self, msg: object) -> None:
        assert isinstance(msg, BatchDone)
        self.done.append(msg)


class RecordingSession:
    """Wraps an ``InferenceSession``: keeps a copy of every feed dict it is run with."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.feeds: list[dict[str, np.ndarray]] = []

    def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> Any:
        self.feeds.append({k: np.array(v, copy=True) for k, v in feeds.items()})
        return self.session.run(names, feeds)


def make_client(
    arenas: tuple[ArenaAllocator, ArenaAllocator, SegmentCache],
    model: ModelVersionSpec,
    backend: object | None = None,
) -> tuple[Client, OnnxRuntimeBackend, RecordingSession]:
    front, back, cache = arenas
    ort_backend = OnnxRuntimeBackend(model, INSTANCE)
    recorder = RecordingSession(ort_backend._session)
    ort_backend._session = recorder
    client = Client(front, cache, None, model.max_batch_size > 0)  # type: ignore[arg-type]
    client.worker = Worker(
        worker_spec(model),
        backend or ort_backend,  # type: ignore[arg-type]
        back,
        cache,
        client.to_frontend,
        client.to_scheduler,
    )
    return client, ort_backend, recorder


def msgspec_replace(obj: Any, **changes: Any) -> Any:
    """A frozen msgspec struct with some fields changed."""
    return msgspec.structs.replace(obj, **changes)
