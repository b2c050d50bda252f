"""Answers from the request's own input block (``workers/native/answer_writer.cc``
PlanAlias) attacked as a Triton user would, through tritonclient against running servers
(``--grpc-frontend native`` and ``python``), 256 KiB tensors, every answer checked byte for
byte against numpy:

- python models with dynamic batching (max_batch_size 8, one instance) called by 8 clients
  at once over gRPC and HTTP, returning: the input, a reshape, an INT32 view of the FP32
  input, the input after adding 1 in place, the same input as two outputs, another request's
  input of the same batch (each answer must be one whole client tensor), a BYTES input;
- a decoupled model that sends its input back twice;
- the response cache on (a cached answer read again after other calls reused the arena);
- an ensemble whose steps echo;
- system shared memory: the input there, the output there, both at the same offset, the
  output overlapping the input forwards and backwards, apart;
- unsent answers (clients with a small flow-control window) of which every other one is
  cancelled: the cancelled ones let go of their input blocks, the others read their bytes;
- a cached model that adds 1 to its input in place: the cache keys the request's bytes as
  sent (a key taken after the model ran would answer x + 1 for x + 1 from the cache).

Afterwards no input block stays LIVE and the log holds no traceback.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.e2e.test_answer_from_input import live_input_blocks
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory, wait_for
from triton_mp._proto import grpc_service_pb2 as pb

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

N = 1 << 16
"""FP32 elements per request: 256 KiB, past the 64 KiB an answer is named from its input."""
CLIENTS = 8
CALLS = 6

BATCHED = """
backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 }
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ %s ]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
OUT = '{ name: "%s", data_type: TYPE_%s, dims: [ %s ] }'
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        out = []
        for i, x in enumerate(xs):
            outs = %s
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(n, t) for n, t in outs.items()]))
        return out
"""


def _mutate(x: np.ndarray) -> np.ndarray:
    return x + 1


MODELS: dict[str, tuple[str, str, Callable[[np.ndarray], dict[str, np.ndarray]]]] = {
    # name -> (outputs' config, what execute returns of x, what the client expects)
    "own": (OUT % ("OUTPUT0", "FP32", "-1"), '{"OUTPUT0": x}', lambda x: {"OUTPUT0": x}),
    "shaped": (
        OUT % ("OUTPUT0", "FP32", "2, -1"),
        '{"OUTPUT0": x.reshape(1, 2, -1)}',
        lambda x: {"OUTPUT0": x.reshape(1, 2, -1)},
    ),
    "as_int": (
        OUT % ("OUTPUT0", "INT32", "-1"),
        '{"OUTPUT0": x.view(np.int32)}',
        lambda x: {"OUTPUT0": x.view(np.int32)},
    ),
    "in_place": (
        OUT % ("OUTPUT0", "FP32", "-1"),
        '{"OUTPUT0": np.add(x, 1, out=x) if x.flags.writeable else x + 1}',
        lambda x: {"OUTPUT0": x + 1},
    ),
    "twice": (
        OUT % ("OUTPUT0", "FP32", "-1") + ", " + OUT % ("OUTPUT1", "FP32", "-1"),
        '{"OUTPUT0": x, "OUTPUT1": x[:]}',
        lambda x: {"OUTPUT0": x, "OUTPUT1": x},
    ),
    "halves": (
        OUT % ("OUTPUT0", "FP32", "-1") + ", " + OUT % ("OUTPUT1", "FP32", "-1"),
        '{"OUTPUT0": x[:, x.size // 2:], "OUTPUT1": x[:, : x.size // 2]}',
        lambda x: {"OUTPUT0": x[:, x.size // 2 :], "OUTPUT1": x[:, : x.size // 2]},
    ),
}
OTHER = "other"
"""Answers every request with the input of the batch's next request (cyclic)."""

BYTES_CONFIG = """
backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 }
input [ { name: "INPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
DECOUPLED_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
DECOUPLED_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            s = r.get_response_sender()
            s.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            s.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]),
                   flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
CACHED_CONFIG = """
backend: "python"
max_batch_size: 0
response_cache { enable: true }
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "echo0" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "echo0" model_version: -1
    input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
"""
ECHO0_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [{ count: 1, kind: KIND_CPU }]
"""
ECHO0_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

MUTATE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            y = np.add(x, 1, out=x) if x.flags.writeable else x + 1
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return out
"""
"""Adds 1 to its input in place (the input is writable here) and returns it."""


@pytest.fixture(scope="module", params=["native", "python"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("r18_from_input") / "repo"
    for name, (outs, returned, _) in MODELS.items():
        write_python_model(repo, name, BATCHED % outs, MODEL % returned)
    write_python_model(
        repo,
        OTHER,
        BATCHED % (OUT % ("OUTPUT0", "FP32", "-1")),
        MODEL % '{"OUTPUT0": xs[(i + 1) % len(xs)]}',
    )
    write_python_model(repo, "bytes", BYTES_CONFIG, MODEL % '{"OUTPUT0": x}')
    write_python_model(repo, "decoupled", DECOUPLED_CONFIG, DECOUPLED_MODEL)
    write_python_model(repo, "cached", CACHED_CONFIG, ECHO0_MODEL)
    write_python_model(repo, "echo0", ECHO0_CONFIG, ECHO0_MODEL)
    write_python_model(repo, "mutate_cached", CACHED_CONFIG, MUTATE_MODEL)
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(
            repo,
            "--grpc-frontend",
            request.param,
            "--cache-config=local,size=16777216",
            "--allow-client-shm=true",
        )


def _x(client: int, call: int) -> np.ndarray:
    """A tensor whose every element tells who sent it: arange plus a per-call seed."""
    return np.arange(N, dtype=np.float32) + np.float32(1_000_000 * (client + 1) + 1000 * call)


def _infer_grpc(c: Any, model: str, x: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = c.infer(model, [inp], outputs=[grpcclient.InferRequestedOutput(n) for n in names])
    return {n: got.as_numpy(n) for n in names}


def _infer_http(c: Any, model: str, x: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    outs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in names]
    got = c.infer(model, [inp], outputs=outs)
    return {n: got.as_numpy(n) for n in names}


def _many(
    server: ServerProcess, check: Callable[[Any, Callable[..., Any], int, int], None]
) -> None:
    """``check(client, infer, client_index, call)`` from CLIENTS threads at once, half over
    gRPC and half over HTTP; every failure is raised here."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        grpc_side = k % 2 == 0
        c: Any = (
            grpcclient.InferenceServerClient(server.url)
            if grpc_side
            else httpclient.InferenceServerClient(
                server.http_url, connection_timeout=60, network_timeout=60
            )
        )
        try:
            for call in range(CALLS):
                check(c, _infer_grpc if grpc_side else _infer_http, k, call)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    if errors:
        raise errors[0]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_batched_answers_from_the_input_are_each_clients_own_bytes(
    server: ServerProcess, model: str
) -> None:
    _, _, expect = MODELS[model]

    def check(c: Any, infer: Callable[..., Any], k: int, call: int) -> None:
        x = _x(k, call)[None]
        want = expect(x.copy())
        got = infer(c, model, x, sorted(want))
        for name, value in want.items():
            assert got[name].dtype == value.dtype, (model, name)
            np.testing.assert_array_equal(got[name], value, err_msg=f"{model} {name} {k}/{call}")

    _many(server, check)
    wait_for(lambda: live_input_blocks(server) == 0, 10, "the input blocks freed")
    assert "Traceback" not in server.log()


def test_another_requests_input_is_one_whole_client_tensor(server: ServerProcess) -> None:
    def check(c: Any, infer: Callable[..., Any], k: int, call: int) -> None:
        x = _x(k, call)[None]
        got = infer(c, OTHER, x, ["OUTPUT0"])["OUTPUT0"]
        seed = got[0, 0]
        np.testing.assert_array_equal(got[0], np.arange(N, dtype=np.float32) + seed)
        assert seed % 1000 == 0, seed
        assert seed >= 1_000_000, seed

    _many(server, check)
    wait_for(lambda: live_input_blocks(server) == 0, 10, "the input blocks freed")
    assert "Traceback" not in server.log()


def test_bytes_decoupled_cache_and_ensemble_answer_their_inputs(server: ServerProcess) -> None:
    g = grpcclient.InferenceServerClient(server.url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        words = np.array([b"w%d" % i * 5000 for i in range(40)], dtype=np.object_)
        for c, mod in ((g, grpcclient), (h, httpclient)):
            inp = mod.InferInput("INPUT0", [1, len(words)], "BYTES")
            inp.set_data_from_numpy(words[None])
            got = c.infer("bytes", [inp]).as_numpy("OUTPUT0")
            assert list(got[0]) == list(words)
        for model in ("cached", "chain", "cached"):
            for call in range(CALLS):
                for c, infer in ((g, _infer_grpc), (h, _infer_http)):
                    x = _x(call % 2, call % 2)  # NOTE: repeated inputs: cache hits
                    got = infer(c, model, x, ["OUTPUT0"])["OUTPUT0"]
                    np.testing.assert_array_equal(got, x, err_msg=f"{model} {call}")
            for call in range(CALLS):  # NOTE: other calls reuse the freed input room
                x = _x(7, 100 + call)[None]
                got = _infer_grpc(g, "own", x, ["OUTPUT0"])["OUTPUT0"]
                np.testing.assert_array_equal(got, x)
        results: list[Any] = []
        done = threading.Event()

        def on(result: Any, error: Any) -> None:
            results.append(error if error is not None else result.as_numpy("OUTPUT0"))
            if len(results) == 2 * CALLS:
                done.set()

        g.start_stream(callback=on)
        for call in range(CALLS):
            inp = grpcclient.InferInput("INPUT0", [N], "FP32")
            inp.set_data_from_numpy(_x(3, call))
            g.async_stream_infer("decoupled", [inp], request_id=str(call))
        assert done.wait(60), results
        g.stop_stream()
        for i, r in enumerate(results):
            assert isinstance(r, np.ndarray), r
            np.testing.assert_array_equal(r, _x(3, i // 2))
    finally:
        g.close()
        h.close()
    wait_for(lambda: live_input_blocks(server) == 0, 10, "the input blocks freed")
    assert "Traceback" not in server.log()


SHM_CASES = {
    "same": (0, 0),
    "output_overlaps_forwards": (0, 2 * N),
    "output_overlaps_backwards": (2 * N, 0),
    "apart": (0, 4 * N),
    "input_only": (0, None),
    "output_only": (None, 0),
}
"""case -> (input offset, output offset) in a region of 12 N bytes; None: not in it."""


def test_client_shared_memory_inputs_and_outputs(server: ServerProcess) -> None:
    size = 4 * N
    key = f"/r18_from_input_{os.getpid()}"
    region = shm.create_shared_memory_region("r18", key, 3 * size)
    g = grpcclient.InferenceServerClient(server.url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        for c, mod in ((g, grpcclient), (h, httpclient)):
            c.register_system_shared_memory("r18", key, 3 * size)
            for case, (in_off, out_off) in SHM_CASES.items():
                for call in range(5):
                    x = _x(9, call)
                    inp = mod.InferInput("INPUT0", [N], "FP32")
                    if in_off is None:
                        inp.set_data_from_numpy(x)
                    else:
                        shm.set_shared_memory_region(region, [x], offset=in_off)
                        inp.set_shared_memory("r18", size, offset=in_off)
                    out = mod.InferRequestedOutput("OUTPUT0")
                    if out_off is not None:
                        out.set_shared_memory("r18", size, offset=out_off)
                    got = c.infer("echo0", [inp], outputs=[out])
                    if out_off is None:
                        value = got.as_numpy("OUTPUT0")
                    else:
                        value = shm.get_contents_as_numpy(region, np.float32, [N], offset=out_off)
                    np.testing.assert_array_equal(value, x, err_msg=f"{mod.__name__} {case}")
            c.unregister_system_shared_memory("r18")
    finally:
        g.close()
        h.close()
        shm.destroy_shared_memory_region(region)
    wait_for(lambda: live_input_blocks(server) == 0, 10, "the input blocks freed")
    assert "Traceback" not in server.log()


STUCK_OPTS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.use_local_subchannel_pool", 1),  # NOTE: a connection of its own per channel
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 1024),
]
"""A client whose flow-control window stays small: the server cannot finish sending."""
STUCK = 6


def _big(i: int) -> np.ndarray:
    """1 MiB: past what the socket buffers take, so an unread answer stays unsent."""
    return np.arange(4 * N, dtype=np.float32) + np.float32(1000 * i)


async def _cancel_half(server: ServerProcess, held: list[int]) -> list[object]:
    """STUCK echo0 calls on connections of their own that read nothing for 2 s; then every
    other one is cancelled (``held``: LIVE input blocks before and after), and the rest read:
    True for an answer holding its own bytes, else what came."""
    chans = [grpc.aio.insecure_channel(server.url, options=STUCK_OPTS) for _ in range(STUCK)]
    try:
        calls = []
        for i, ch in enumerate(chans):
            req = pb.ModelInferRequest(model_name="echo0", id=f"stuck{i}")
            t = req.inputs.add()
            t.name, t.datatype = "INPUT0", "FP32"
            t.shape.append(4 * N)
            req.raw_input_contents.append(_big(i).tobytes())
            c = ch.stream_stream("/inference.GRPCInferenceService/ModelInfer")()
            await c.write(req.SerializeToString())
            await c.done_writing()
            calls.append(c)
        await asyncio.sleep(2)
        held.append(live_input_blocks(server))
        for c in calls[::2]:
            c.cancel()
        await asyncio.sleep(1)
        held.append(live_input_blocks(server))
        got: list[object] = []
        for i, c in enumerate(calls):
            if i % 2 == 0:
                continue
            try:
                r = await asyncio.wait_for(c.read(), 30)
                out = pb.ModelInferResponse.FromString(r).raw_output_contents[0]
                got.append(np.array_equal(np.frombuffer(out, np.float32), _big(i)))
            except grpc.aio.AioRpcError as e:
                got.append(e.code().name)
        return got
    finally:
        for ch in chans:
            await ch.close()


def test_cancelled_unsent_answers_free_their_input_blocks(server: ServerProcess) -> None:
    g = grpcclient.InferenceServerClient(server.url)
    try:
        for call in range(8):  # NOTE: the first calls of a form teach the native thread
            x = _x(21, call)
            np.testing.assert_array_equal(_infer_grpc(g, "echo0", x, ["OUTPUT0"])["OUTPUT0"], x)
    finally:
        g.close()
    held: list[int] = []
    got = asyncio.run(_cancel_half(server, held))
    assert got == [True] * (STUCK // 2), got
    if "(native)" in server.log():  # NOTE: the native frontend holds unsent answers' inputs
        assert held[0] >= 1, held
        assert held[1] < held[0], held
        if held[0] == STUCK:
            assert held[1] == STUCK // 2, held
    wait_for(lambda: live_input_blocks(server) == 0, 20, "the input blocks freed")
    assert "Traceback" not in server.log()


def test_an_input_changed_in_place_keeps_its_cache_key(server: ServerProcess) -> None:
    g = grpcclient.InferenceServerClient(server.url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        for size in (16, N):
            for seed, (c, infer) in enumerate(((g, _infer_grpc), (h, _infer_http))):
                base = np.arange(size, dtype=np.float32) + np.float32(10_000 * seed + size)
                for x in (base, base, base + 1, base + 1, base):  # NOTE: misses, then hits
                    got = infer(c, "mutate_cached", x, ["OUTPUT0"])["OUTPUT0"]
                    np.testing.assert_array_equal(got, x + 1)
        stats = g.get_inference_statistics("mutate_cached", as_json=True)
        hits = int(stats["model_stats"][0]["inference_stats"]["cache_hit"].get("count", 0))
        assert hits == 3 * 2 * 2, stats  # NOTE: the 2nd, 4th and 5th call of each series
    finally:
        g.close()
        h.close()
    assert "Traceback" not in server.log()
