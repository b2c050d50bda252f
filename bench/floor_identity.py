#!/usr/bin/env python3
"""The Python floor for large tensors: the leanest KServe v2 gRPC server we know how to write
in Python for ``identity_py`` (one FP32 input ``INPUT0`` of any length, echoed as ``OUTPUT0``),
to bound what any Python server, ours included, can reach with perf_analyzer as the client.

``bench/floor_server.py`` is the floor for tiny requests (add_sub_py); it parses and builds
messages with protobuf, which copies a tensor's bytes four times. This one answers ModelInfer
with the same wire handling triton-mp's frontend uses (``triton_mp.frontend.grpc.wire``): the
request's tensor is a view into the received message and the response is joined once, so each
MiB is copied once in Python (into the response) besides what grpc itself copies, and malloc is
tuned as in every triton-mp process (``triton_mp.common.process.platform``). One process, one
grpc.aio event loop, no queue, no batching, no validation. With system shared memory (perf_analyzer
``--shared-memory system``) it maps the client's regions itself and copies the input region
into the output region once, in the handler.

Usage: floor_identity.py --port 18201   (listens on 127.0.0.1 only; SIGTERM stops it)
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import os
import sys
from pathlib import Path
from typing import Any

import grpc

# NOTE: this checkout's triton_mp (its wire handling), whatever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.process.platform import tune_malloc
from triton_mp.frontend.grpc.wire import infer_response_bytes, split_infer_request

NAME = "identity_py"
SERVICE = "inference.GRPCInferenceService"
CONFIG = mc.ModelConfig(
    name=NAME,
    backend="python",
    max_batch_size=0,
    input=[mc.ModelInput(name="INPUT0", data_type=mc.TYPE_FP32, dims=[-1])],
    output=[mc.ModelOutput(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[-1])],
)
METADATA = pb.ModelMetadataResponse(
    name=NAME,
    versions=["1"],
    platform="python",
    inputs=[pb.ModelMetadataResponse.TensorMetadata(name="INPUT0", datatype="FP32", shape=[-1])],
    outputs=[pb.ModelMetadataResponse.TensorMetadata(name="OUTPUT0", datatype="FP32", shape=[-1])],
)
COUNT = [0]


REGIONS: dict[str, memoryview] = {}
"""Registered system shared-memory regions: name -> a writable view of the region."""


def _region(params: Any) -> memoryview | None:
    """The window a tensor's ``shared_memory_*`` parameters name, or None."""
    if "shared_memory_region" not in params:
        return None
    region = REGIONS[params["shared_memory_region"].string_param]
    offset = params["shared_memory_offset"].int64_param if "shared_memory_offset" in params else 0
    return region[offset : offset + params["shared_memory_byte_size"].int64_param]


async def model_infer(data: bytes, _context: grpc.aio.ServicerContext) -> bytes:
    """Echo INPUT0 as OUTPUT0: the request's raw bytes go straight into the response, or
    from the client's input region into its output region (one copy) with system shared
    memory, answered with an empty output entry as Triton does."""
    wire = split_infer_request(data)
    req = wire.request
    head = pb.ModelInferResponse(model_name=NAME, model_version="1", id=req.id)
    out = head.outputs.add(name="OUTPUT0", datatype="FP32")
    out.shape.extend(req.inputs[0].shape)
    COUNT[0] += 1
    src = _region(req.inputs[0].parameters) if not wire.raw else wire.raw[0]
    dest = _region(req.outputs[0].parameters) if req.outputs else None
    if dest is None:
        return infer_response_bytes(head, [src])
    dest[: len(src)] = src
    return infer_response_bytes(head, [None])


def _register(r: pb.SystemSharedMemoryRegisterRequest) -> pb.SystemSharedMemoryRegisterResponse:
    fd = os.open("/dev/shm/" + r.key.lstrip("/"), os.O_RDWR)
    try:
        mapped = mmap.mmap(fd, r.offset + r.byte_size)
    finally:
        os.close(fd)
    REGIONS[r.name] = memoryview(mapped)[r.offset : r.offset + r.byte_size]
    return pb.SystemSharedMemoryRegisterResponse()


def _unregister(
    r: pb.SystemSharedMemoryUnregisterRequest,
) -> pb.SystemSharedMemoryUnregisterResponse:
    # NOTE: the mappings are left to the garbage collector (a view may still be in use).
    for name in [r.name] if r.name else list(REGIONS):
        REGIONS.pop(name, None)
    return pb.SystemSharedMemoryUnregisterResponse()


def _unary(fn, request_type):  # type: ignore[no-untyped-def]
    async def handler(request, _context):  # type: ignore[no-untyped-def]
        return fn(request)

    return grpc.unary_unary_rpc_method_handler(
        handler,
        request_deserializer=request_type.FromString,
        response_serializer=lambda m: m.SerializeToString(),
    )


def _statistics(_request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
    n = COUNT[0]
    d = pb.StatisticDuration(count=n, ns=0)
    stats = pb.InferStatistics(
        success=d,
        fail=pb.StatisticDuration(),
        queue=d,
        compute_input=d,
        compute_infer=d,
        compute_output=d,
    )
    return pb.ModelStatisticsResponse(
        model_stats=[
            pb.ModelStatistics(
                name=NAME,
                version="1",
                inference_count=n,
                execution_count=n,
                inference_stats=stats,
            )
        ]
    )


HANDLERS = {
    "ServerLive": _unary(lambda r: pb.ServerLiveResponse(live=True), pb.ServerLiveRequest),
    "ServerReady": _unary(lambda r: pb.ServerReadyResponse(ready=True), pb.ServerReadyRequest),
    "ModelReady": _unary(
        lambda r: pb.ModelReadyResponse(ready=r.name == NAME), pb.ModelReadyRequest
    ),
    "ServerMetadata": _unary(
        lambda r: pb.ServerMetadataResponse(name="floor-identity"), pb.ServerMetadataRequest
    ),
    "ModelMetadata": _unary(lambda r: METADATA, pb.ModelMetadataRequest),
    "ModelConfig": _unary(lambda r: pb.ModelConfigResponse(config=CONFIG), pb.ModelConfigRequest),
    "ModelStatistics": _unary(_statistics, pb.ModelStatisticsRequest),
    "SystemSharedMemoryRegister": _unary(_register, pb.SystemSharedMemoryRegisterRequest),
    "SystemSharedMemoryUnregister": _unary(_unregister, pb.SystemSharedMemoryUnregisterRequest),
    "SystemSharedMemoryStatus": _unary(
        lambda r: pb.SystemSharedMemoryStatusResponse(), pb.SystemSharedMemoryStatusRequest
    ),
    # NOTE: no deserializer or serializer: the handler gets and returns the wire bytes.
    "ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer),
}


async def serve(port: int) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
        ]
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, HANDLERS),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=18201)
    tune_malloc()  # NOTE: as every triton-mp process does: no page faults per large message
    asyncio.run(serve(ap.parse_args().port))


if __name__ == "__main__":
    main()
