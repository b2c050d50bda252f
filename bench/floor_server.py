#!/usr/bin/env python3
"""The smallest KServe v2 gRPC server that perf_analyzer can drive: one Python
process, model add_sub_py computed inline in the gRPC handler (no queue, no
batching, no worker processes). It bounds what a Python gRPC frontend reaches
when the C++ perf_analyzer is the client.

Usage: floor_server.py --port 18200 [--impl aio|sync]
Needs grpcio, numpy and tritonclient[grpc] (for the generated KServe protos).
Listens on 127.0.0.1 only. No shared memory, no other models.
"""

import argparse
import asyncio
import time

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

NAME = "add_sub_py"
CONFIG = mc.ModelConfig(
    name=NAME,
    backend="python",
    max_batch_size=64,
    input=[mc.ModelInput(name=n, data_type=mc.TYPE_FP32, dims=[16]) for n in ("INPUT0", "INPUT1")],
    output=[
        mc.ModelOutput(name=n, data_type=mc.TYPE_FP32, dims=[16]) for n in ("OUTPUT0", "OUTPUT1")
    ],
)
METADATA = pb.ModelMetadataResponse(
    name=NAME,
    versions=["1"],
    platform="python",
    inputs=[
        pb.ModelMetadataResponse.TensorMetadata(name=n, datatype="FP32", shape=[-1, 16])
        for n in ("INPUT0", "INPUT1")
    ],
    outputs=[
        pb.ModelMetadataResponse.TensorMetadata(name=n, datatype="FP32", shape=[-1, 16])
        for n in ("OUTPUT0", "OUTPUT1")
    ],
)
STATS = {"n": 0, "ns": 0}


def infer(req):
    t0 = time.perf_counter_ns()
    a = np.frombuffer(req.raw_input_contents[0], dtype=np.float32)
    b = np.frombuffer(req.raw_input_contents[1], dtype=np.float32)
    resp = pb.ModelInferResponse(model_name=NAME, model_version="1", id=req.id)
    for n in ("OUTPUT0", "OUTPUT1"):
        o = resp.outputs.add(name=n, datatype="FP32")
        o.shape.extend(req.inputs[0].shape)
    resp.raw_output_contents.extend([(a + b).tobytes(), (a - b).tobytes()])
    STATS["n"] += 1
    STATS["ns"] += time.perf_counter_ns() - t0
    return resp


def statistics():
    n, ns = STATS["n"], STATS["ns"]

    def d(c, t):
        return pb.StatisticDuration(count=c, ns=t)

    s = pb.InferStatistics(
        success=d(n, ns),
        fail=d(0, 0),
        queue=d(n, 0),
        compute_input=d(n, 0),
        compute_infer=d(n, ns),
        compute_output=d(n, 0),
    )
    return pb.ModelStatisticsResponse(
        model_stats=[
            pb.ModelStatistics(
                name=NAME, version="1", inference_count=n, execution_count=n, inference_stats=s
            )
        ]
    )


class Sync(pbg.GRPCInferenceServiceServicer):
    def ServerLive(self, r, c):
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, r, c):
        return pb.ServerReadyResponse(ready=True)

    def ModelReady(self, r, c):
        return pb.ModelReadyResponse(ready=r.name == NAME)

    def ServerMetadata(self, r, c):
        return pb.ServerMetadataResponse(name="kserve-min", version="0")

    def ModelMetadata(self, r, c):
        return METADATA

    def ModelConfig(self, r, c):
        return pb.ModelConfigResponse(config=CONFIG)

    def ModelStatistics(self, r, c):
        return statistics()

    def ModelInfer(self, r, c):
        return infer(r)


class Aio(pbg.GRPCInferenceServiceServicer):
    async def ServerLive(self, r, c):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, r, c):
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, r, c):
        return pb.ModelReadyResponse(ready=r.name == NAME)

    async def ServerMetadata(self, r, c):
        return pb.ServerMetadataResponse(name="kserve-min", version="0")

    async def ModelMetadata(self, r, c):
        return METADATA

    async def ModelConfig(self, r, c):
        return pb.ModelConfigResponse(config=CONFIG)

    async def ModelStatistics(self, r, c):
        return statistics()

    async def ModelInfer(self, r, c):
        return infer(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=18200)
    ap.add_argument("--impl", choices=["aio", "sync"], default="aio")
    a = ap.parse_args()
    addr = f"127.0.0.1:{a.port}"
    if a.impl == "sync":
        from concurrent.futures import ThreadPoolExecutor

        server = grpc.server(ThreadPoolExecutor(max_workers=16))
        pbg.add_GRPCInferenceServiceServicer_to_server(Sync(), server)
        server.add_insecure_port(addr)
        server.start()
        server.wait_for_termination()
    else:

        async def run():
            server = grpc.aio.server()
            pbg.add_GRPCInferenceServiceServicer_to_server(Aio(), server)
            server.add_insecure_port(addr)
            await server.start()
            await server.wait_for_termination()

        asyncio.run(run())


if __name__ == "__main__":
    main()
