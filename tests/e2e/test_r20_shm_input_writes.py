"""A python model writing its client-shared-memory inputs in ways 2.51 allows, side by side
with the real Triton 2.51 (``.peers/``; where it is not installed, triton-mp alone is held to
2.51's answers, pinned here).

2.51's python backend copies every input into the stub's own shared memory, so whatever a
model does with an input array is its own: the next request reads the client's bytes and the
client's region stays as the client wrote it. triton-mp maps a client's region copy-on-write
(``workers.tensors.private_pages``) and gives the written pages back; these tests write from
places a batch's own end does not see:

1. A model keeping its last input and writing it while it runs the next request (a buffer
   reused across calls), the next request reading another region: the request after that
   reads the first region again and must see the client's bytes.
2. A model whose thread writes its input after ``execute`` returned (not decoupled): the next
   request on the same window must see the client's bytes.
3. Many clients of a batching model writing 1 MiB inputs in place, at offsets inside their
   regions that are not page-aligned, some sharing one region: every answer is its input + 1
   and every region stays as its client wrote it.
4. A cached model writing its input in place: the cache keys the client's bytes. A BLS
   caller passing its shm input on to a callee that writes it: each callee and the caller
   read the client's bytes.

And one documented difference: a model keeping its input's array and writing it while the
next request reads the same window sees its write in that request's input (one mapping per
registration here; 2.51: each request's own copy).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import Models, PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ONE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

KEEP_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kept = None

    def execute(self, requests):
        out = []
        for r in requests:
            if self.kept is not None:
                self.kept[...] = -1
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.copy())]))
            self.kept = x
        return out
"""
"""r20_keep_py: a copy of INPUT0; keeps INPUT0's array and fills it with -1 at the start of
the next request."""

THREAD_MODEL = """
import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.copy())]))
            threading.Thread(target=self._later, args=(x,)).start()
        return out

    def _later(self, x):
        time.sleep(0.2)
        x += 100
"""
"""r20_thread_py: a copy of INPUT0; a thread adds 100 to INPUT0 in place 0.2 s after
``execute`` returned."""

INC_BATCH_CONFIG = """
backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
INC_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            x += 1
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""
"""r20_inc_batch_py: INPUT0 + 1, written into INPUT0 in place; batches of up to 8."""

CACHED_INC_CONFIG = """
backend: "python"
max_batch_size: 0
response_cache { enable: true }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
"""r20_cached_inc_py: INPUT0 + 1 written into INPUT0 in place; the response cache keeps it."""

BLS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            a = pb_utils.InferenceRequest(
                model_name="r20_one_inc_py", requested_output_names=["OUTPUT0"], inputs=[t]
            ).exec()
            b = pb_utils.InferenceRequest(
                model_name="r20_one_inc_py", requested_output_names=["OUTPUT0"], inputs=[t]
            ).exec()
            x = t.as_numpy()
            got = [pb_utils.get_output_tensor_by_name(c, "OUTPUT0").as_numpy() for c in (a, b)]
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x.copy()),
                pb_utils.Tensor("A", got[0]),
                pb_utils.Tensor("B", got[1]),
            ]))
        return out
"""
"""r20_bls_py: passes its INPUT0 tensor on to r20_one_inc_py twice (BLS), answers its own
INPUT0 as read after both calls, and both callees' outputs."""

BLS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "A" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ -1 ] }
]
"""

TWO_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] }
]
"""
TWO_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            y = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            x += 1
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("OUTPUT1", y.copy())]))
        return out
"""
"""r20_two_py: OUTPUT0 = INPUT0 + 1 (written into INPUT0 in place), OUTPUT1 = INPUT1."""

SIDE_BY_SIDE_MODELS: Models = {
    "r20_two_py": PythonModel(TWO_CONFIG, TWO_MODEL),
    "r20_cached_inc_py": PythonModel(CACHED_INC_CONFIG, INC_MODEL),
    "r20_one_inc_py": PythonModel(ONE_CONFIG, INC_MODEL),
    "r20_bls_py": PythonModel(BLS_CONFIG, BLS_MODEL),
    "r20_keep_py": PythonModel(ONE_CONFIG, KEEP_MODEL),
    "r20_thread_py": PythonModel(ONE_CONFIG, THREAD_MODEL),
    "r20_inc_batch_py": PythonModel(INC_BATCH_CONFIG, INC_MODEL),
}
"""tests/e2e/conftest.py's ``shared_side_by_side`` serves them (client shared memory on)."""


@pytest.fixture(scope="module")
def servers(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> dict[str, ServerProcess]:
    """``triton-mp`` always, ``triton`` when the real Triton is installed."""
    return shared_side_by_side  # type: ignore[return-value]  # NOTE: same url fields


def _ordered(servers: dict[str, ServerProcess]) -> list[tuple[str, ServerProcess]]:
    """Triton first: where only triton-mp differs, Triton's half passes before it fails."""
    return sorted(servers.items(), key=lambda kv: kv[0] != "triton")


def _key(what: str, server: ServerProcess) -> str:
    return f"/r20_{what}_{os.getpid()}_{server.url.rsplit(':', 1)[1]}"


X = np.arange(4, dtype=np.float32)[None].reshape(4)
"""[0, 1, 2, 3]"""


def test_an_input_kept_and_written_at_the_next_request_leaves_the_client_bytes(
    servers: dict[str, ServerProcess],
) -> None:
    for name, server in _ordered(servers):
        keys = {"a": _key("keep_a", server), "b": _key("keep_b", server)}
        data = {"a": X, "b": X * 10}
        regions = {k: shm.create_shared_memory_region(f"r20_{k}", keys[k], X.nbytes) for k in keys}
        answers = []
        try:
            for k, region in regions.items():
                shm.set_shared_memory_region(region, [data[k]])
            with grpcclient.InferenceServerClient(server.url) as client:
                for k in keys:
                    client.register_system_shared_memory(f"r20_{k}", keys[k], X.nbytes)
                try:
                    for k in "ababa":
                        inp = grpcclient.InferInput("INPUT0", [4], "FP32")
                        inp.set_shared_memory(f"r20_{k}", X.nbytes)
                        answers.append(
                            client.infer("r20_keep_py", [inp]).as_numpy("OUTPUT0").tolist()
                        )
                finally:
                    for k in keys:
                        client.unregister_system_shared_memory(f"r20_{k}")
            seen = [
                shm.get_contents_as_numpy(r, np.float32, [4]).tolist() for r in regions.values()
            ]
        finally:
            for region in regions.values():
                shm.destroy_shared_memory_region(region)
        a, b = X.tolist(), (X * 10).tolist()
        assert (answers, seen) == ([a, b, a, b, a], [a, b]), name


def test_an_input_kept_and_written_while_the_next_request_reads_its_window_differs(
    servers: dict[str, ServerProcess],
) -> None:
    """docs/differences.md: the kept array and the next request's input are one mapping's
    pages here, so each later request on the window reads the -1s the model wrote into the
    kept array at its start (after the previous write was given back); the client's region
    stays as written."""
    expected = {"triton": [X.tolist()] * 3, "triton-mp": [X.tolist(), [-1.0] * 4, [-1.0] * 4]}
    for name, server in _ordered(servers):
        answers, seen = _one_region(server, "alias", "r20_keep_py", [X, X, X], ("OUTPUT0",))
        assert ([a[0] for a in answers], seen) == (expected[name], X.tolist()), name


def test_an_input_written_by_a_thread_after_execute_leaves_the_client_bytes(
    servers: dict[str, ServerProcess],
) -> None:
    for name, server in _ordered(servers):
        key = _key("thread", server)
        region = shm.create_shared_memory_region("r20_thread", key, X.nbytes)
        answers = []
        try:
            shm.set_shared_memory_region(region, [X])
            with grpcclient.InferenceServerClient(server.url) as client:
                client.register_system_shared_memory("r20_thread", key, X.nbytes)
                try:
                    inp = grpcclient.InferInput("INPUT0", [4], "FP32")
                    inp.set_shared_memory("r20_thread", X.nbytes)
                    for _ in range(3):
                        answers.append(
                            client.infer("r20_thread_py", [inp]).as_numpy("OUTPUT0").tolist()
                        )
                        time.sleep(0.5)  # NOTE: the model's thread writes 0.2 s after execute
                finally:
                    client.unregister_system_shared_memory("r20_thread")
            seen = shm.get_contents_as_numpy(region, np.float32, [4]).tolist()
        finally:
            shm.destroy_shared_memory_region(region)
        assert (answers, seen) == ([X.tolist()] * 3, X.tolist()), name


MIB_FLOATS = 1 << 18
"""A 1 MiB FP32 input's element count."""


def test_many_clients_of_a_batching_model_writing_1mib_inputs_in_place(
    servers: dict[str, ServerProcess],
) -> None:
    """Eight clients, each with its own region (its input at a float offset that is not
    page-aligned), and four more reading one shared region; each call rewrites the client's
    bytes first, and every answer must be them + 1."""
    nbytes = MIB_FLOATS * 4
    offset = 4 * 37

    def client_loop(url: str, region: Any, name: str, seed: int, rewrite: bool) -> list[str]:
        bad = []
        rng = np.random.default_rng(seed)
        base = rng.standard_normal(MIB_FLOATS).astype(np.float32)
        with grpcclient.InferenceServerClient(url) as client:
            for i in range(8):
                data = base + i if rewrite else base
                if rewrite:
                    shm.set_shared_memory_region(region, [data], offset=offset)
                inp = grpcclient.InferInput("INPUT0", [1, MIB_FLOATS], "FP32")
                inp.set_shared_memory(name, nbytes, offset=offset)
                got = client.infer("r20_inc_batch_py", [inp]).as_numpy("OUTPUT0")
                if not np.array_equal(got[0], data + 1):
                    bad.append(f"{name} call {i}: {np.count_nonzero(got[0] != data + 1)} differ")
                now = shm.get_contents_as_numpy(region, np.float32, [MIB_FLOATS], offset=offset)
                if not np.array_equal(now, data):
                    bad.append(f"{name} call {i}: the region changed")
        return bad

    for name, server in _ordered(servers):
        regions = []
        try:
            jobs = []
            for i in range(9):
                key = _key(f"many{i}", server)
                region = shm.create_shared_memory_region(f"r20_many{i}", key, offset + nbytes + 100)
                regions.append((f"r20_many{i}", key, region))
            shared = regions[8]
            shm.set_shared_memory_region(
                shared[2],
                [np.random.default_rng(99).standard_normal(MIB_FLOATS).astype(np.float32)],
                offset=offset,
            )
            for i in range(8):
                jobs.append((regions[i][2], regions[i][0], i, True))
            jobs += [(shared[2], shared[0], 99, False)] * 4
            with grpcclient.InferenceServerClient(server.url) as client:
                for rname, key, _ in regions:
                    client.register_system_shared_memory(rname, key, offset + nbytes + 100)
                try:
                    with ThreadPoolExecutor(len(jobs)) as pool:
                        bad = [
                            b
                            for found in pool.map(lambda j, u=server.url: client_loop(u, *j), jobs)
                            for b in found
                        ]
                finally:
                    for rname, _, _ in regions:
                        client.unregister_system_shared_memory(rname)
        finally:
            for _, _, region in regions:
                shm.destroy_shared_memory_region(region)
        assert bad == [], name


def _one_region(
    server: ServerProcess, what: str, model: str, datas: list[np.ndarray], outputs: tuple[str, ...]
) -> tuple[list[list[list[float]]], list[float]]:
    """Each of ``datas`` written into one registered region and ``model`` called on it:
    the ``outputs`` of each call, and the region's bytes at the end."""
    key = _key(what, server)
    region = shm.create_shared_memory_region(f"r20_{what}", key, X.nbytes)
    answers = []
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            client.register_system_shared_memory(f"r20_{what}", key, X.nbytes)
            try:
                for data in datas:
                    shm.set_shared_memory_region(region, [data])
                    inp = grpcclient.InferInput("INPUT0", [4], "FP32")
                    inp.set_shared_memory(f"r20_{what}", X.nbytes)
                    r = client.infer(model, [inp])
                    answers.append([r.as_numpy(o).tolist() for o in outputs])
            finally:
                client.unregister_system_shared_memory(f"r20_{what}")
        seen = shm.get_contents_as_numpy(region, np.float32, [4]).tolist()
    finally:
        shm.destroy_shared_memory_region(region)
    return answers, seen


def test_a_cached_model_writing_its_shm_input_caches_the_clients_bytes(
    servers: dict[str, ServerProcess],
) -> None:
    """The cache key is the client's input, not the model's write: X twice (the second from
    the cache), then X + 1 (a miss, not X's answer), then X again (a hit)."""
    for name, server in _ordered(servers):
        answers, seen = _one_region(
            server, "cached", "r20_cached_inc_py", [X, X, X + 1, X], ("OUTPUT0",)
        )
        one, two = (X + 1).tolist(), (X + 2).tolist()
        assert (answers, seen) == ([[one], [one], [two], [one]], X.tolist()), name


def test_an_shm_input_passed_on_by_bls_is_each_callees_own(
    servers: dict[str, ServerProcess],
) -> None:
    """A BLS caller passes its shm input on to a callee that writes it in place, twice: each
    callee reads the client's bytes, and the caller's input stays as the client wrote it."""
    for name, server in _ordered(servers):
        answers, seen = _one_region(server, "bls", "r20_bls_py", [X, X * 10], ("OUTPUT0", "A", "B"))
        assert (answers, seen) == (
            [
                [X.tolist(), (X + 1).tolist(), (X + 1).tolist()],
                [(X * 10).tolist(), (X * 10 + 1).tolist(), (X * 10 + 1).tolist()],
            ],
            (X * 10).tolist(),
        ), name


def test_two_inputs_in_one_page_of_one_region_one_written_in_place(
    servers: dict[str, ServerProcess],
) -> None:
    """INPUT0 at byte 8 and INPUT1 at byte 40 of one region (one page): the model writes
    INPUT0 in place; INPUT1 reads the client's bytes, and each call (the client rewriting
    both first) reads the client's current bytes in both."""
    for name, server in _ordered(servers):
        key = _key("two", server)
        region = shm.create_shared_memory_region("r20_two", key, 64)
        answers = []
        try:
            with grpcclient.InferenceServerClient(server.url) as client:
                client.register_system_shared_memory("r20_two", key, 64)
                try:
                    for n in range(3):
                        shm.set_shared_memory_region(region, [X + n], offset=8)
                        shm.set_shared_memory_region(region, [X * 10 + n], offset=40)
                        inputs = [grpcclient.InferInput(f"INPUT{i}", [4], "FP32") for i in (0, 1)]
                        inputs[0].set_shared_memory("r20_two", X.nbytes, offset=8)
                        inputs[1].set_shared_memory("r20_two", X.nbytes, offset=40)
                        r = client.infer("r20_two_py", inputs)
                        answers.append([r.as_numpy(f"OUTPUT{i}").tolist() for i in (0, 1)])
                finally:
                    client.unregister_system_shared_memory("r20_two")
            seen = [
                shm.get_contents_as_numpy(region, np.float32, [4], offset=o).tolist()
                for o in (8, 40)
            ]
        finally:
            shm.destroy_shared_memory_region(region)
        assert (answers, seen) == (
            [[(X + n + 1).tolist(), (X * 10 + n).tolist()] for n in range(3)],
            [(X + 2).tolist(), (X * 10 + 2).tolist()],
        ), name
