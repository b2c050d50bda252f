"""Triton's system shared memory extension, driven by tritonclient.utils.shared_memory.

Inputs named by ``shared_memory_region`` are read by the worker straight from the client's
object; outputs named that way are written straight into it. Every error case gets Triton's
status and message, and the server keeps serving. Client objects are created under the
``triton_mp_<pid>_test_`` prefix so the suite's leak check sees any that a test leaves.
"""

from __future__ import annotations

import mmap
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BYTES_16 = 16 * 4


def _identity_model(path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity_fp32",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _repo(base: Path) -> Path:
    repo = base / "repo"
    repo.mkdir()
    shutil.copytree(PROJECT_REPOSITORY / "add_sub", repo / "add_sub")
    _identity_model(repo / "identity_fp32" / "1" / "model.onnx")
    (repo / "identity_fp32" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [-1] }]\n'
        'output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [-1] }]\n'
        "instance_group [{ count: 1, kind: KIND_CPU }]\n"
    )
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(_repo(tmp_path_factory.mktemp("shm")), "--allow-client-shm=true")


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = server.client()
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def regions() -> Iterator[Callable[[str, int], shm.SharedMemoryRegion]]:
    """Factory for client shm objects named under the test prefix; destroyed at teardown."""
    made: list[shm.SharedMemoryRegion] = []

    def make(tag: str, byte_size: int) -> shm.SharedMemoryRegion:
        key = f"/triton_mp_{os.getpid()}_test_{tag}"
        handle = shm.create_shared_memory_region(tag, key, byte_size, create_only=True)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _key(tag: str) -> str:
    return f"/triton_mp_{os.getpid()}_test_{tag}"


def _add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    out = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        i = grpcclient.InferInput(name, list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        out.append(i)
    return out


def test_inputs_and_outputs_through_shm_equal_the_plain_path(
    client: grpcclient.InferenceServerClient, regions: Callable[..., shm.SharedMemoryRegion]
) -> None:
    a = np.arange(16, dtype=np.float32)[None]
    b = np.full((1, 16), 3, np.float32)
    in_region = regions("in", 2 * BYTES_16)
    out_region = regions("out", 2 * BYTES_16)
    shm.set_shared_memory_region(in_region, [a, b])
    client.register_system_shared_memory("in", _key("in"), 2 * BYTES_16)
    client.register_system_shared_memory("out", _key("out"), 2 * BYTES_16)
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory("in", BYTES_16)
    inputs[1].set_shared_memory("in", BYTES_16, offset=BYTES_16)
    outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    outputs[0].set_shared_memory("out", BYTES_16)
    outputs[1].set_shared_memory("out", BYTES_16, offset=BYTES_16)
    res = client.infer("add_sub", inputs, outputs=outputs)
    response = res.get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert [list(o.shape) for o in response.outputs] == [[1, 16], [1, 16]]
    assert list(response.raw_output_contents) == [b"", b""]
    got0 = shm.get_contents_as_numpy(out_region, np.float32, [1, 16])
    got1 = shm.get_contents_as_numpy(out_region, np.float32, [1, 16], offset=BYTES_16)
    plain = client.infer("add_sub", _add_sub_inputs(a, b))
    np.testing.assert_array_equal(got0, plain.as_numpy("OUTPUT0"))
    np.testing.assert_array_equal(got1, plain.as_numpy("OUTPUT1"))


def test_shm_input_with_a_raw_input_and_outputs_in_the_response(
    client: grpcclient.InferenceServerClient, regions: Callable[..., shm.SharedMemoryRegion]
) -> None:
    a = np.linspace(0, 1, 32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), np.float32)
    region = regions("mixed", 2 * BYTES_16)
    shm.set_shared_memory_region(region, [a])
    client.register_system_shared_memory("mixed", _key("mixed"), 2 * BYTES_16)
    i0 = grpcclient.InferInput("INPUT0", [2, 16], "FP32")
    i0.set_shared_memory("mixed", 2 * BYTES_16)
    i1 = grpcclient.InferInput("INPUT1", [2, 16], "FP32")
    i1.set_data_from_numpy(b)
    res = client.infer("add_sub", [i0, i1])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def test_one_mib_identity_through_shm(
    client: grpcclient.InferenceServerClient, regions: Callable[..., shm.SharedMemoryRegion]
) -> None:
    n = 1 << 18  # 1 MiB of FP32
    x = np.random.default_rng(1).standard_normal(n, dtype=np.float32)
    region_in = regions("big_in", x.nbytes)
    region_out = regions("big_out", x.nbytes)
    shm.set_shared_memory_region(region_in, [x])
    client.register_system_shared_memory("big_in", _key("big_in"), x.nbytes)
    client.register_system_shared_memory("big_out", _key("big_out"), x.nbytes)
    i = grpcclient.InferInput("INPUT0", [n], "FP32")
    i.set_shared_memory("big_in", x.nbytes)
    o = grpcclient.InferRequestedOutput("OUTPUT0")
    o.set_shared_memory("big_out", x.nbytes)
    client.infer("identity_fp32", [i], outputs=[o])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(region_out, np.float32, [n]), x)


def test_status_and_unregister(
    client: grpcclient.InferenceServerClient, regions: Callable[..., shm.SharedMemoryRegion]
) -> None:
    regions("s1", 128)
    regions("s2", 2 * mmap.PAGESIZE)
    client.register_system_shared_memory("s1", _key("s1"), 128)
    # NOTE: a window's offset is a multiple of the page size: Triton mmaps it.
    client.register_system_shared_memory("s2", _key("s2"), 64, offset=mmap.PAGESIZE)
    status = client.get_system_shared_memory_status()
    by_name = {r.name: r for r in status.regions.values()}
    assert by_name["s2"].key == _key("s2")
    assert (by_name["s2"].offset, by_name["s2"].byte_size) == (mmap.PAGESIZE, 64)
    one = client.get_system_shared_memory_status("s1")
    assert list(one.regions) == ["s1"]
    client.unregister_system_shared_memory("s1")
    with pytest.raises(InferenceServerException) as e:
        client.get_system_shared_memory_status("s1")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert "Unable to find system shared memory region: 's1'" in e.value.message()
    client.unregister_system_shared_memory()
    assert not client.get_system_shared_memory_status().regions


def test_registration_errors(
    client: grpcclient.InferenceServerClient, regions: Callable[..., shm.SharedMemoryRegion]
) -> None:
    regions("reg", 128)
    client.register_system_shared_memory("reg", _key("reg"), 128)
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("reg", _key("reg"), 128)
    assert e.value.status() == "StatusCode.ALREADY_EXISTS"
    assert "shared memory region 'reg' already in manager" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("nokey", _key("does_not_exist"), 128)
    # server shared_memory_manager.cc: INTERNAL, naming the key
    assert e.value.status() == "StatusCode.INTERNAL"
    assert e.value.message() == f"Unable to open shared memory region: '{_key('does_not_exist')}'"
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("toobig", _key("reg"), 129)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message() == "failed to register shared memory region 'toobig': invalid args"
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("past_end", _key("reg"), 64, offset=100)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message() == "failed to register shared memory region 'past_end': invalid args"


def test_request_errors_and_the_server_keeps_serving(
    client: grpcclient.InferenceServerClient, regions: Callable[..., shm.SharedMemoryRegion]
) -> None:
    regions("small", BYTES_16)
    client.register_system_shared_memory("small", _key("small"), BYTES_16)

    def infer_with(
        region: str, byte_size: int, offset: int = 0, status: str = "INVALID_ARGUMENT"
    ) -> InferenceServerException:
        i0 = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        i0.set_shared_memory(region, byte_size, offset=offset)
        i1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        i1.set_data_from_numpy(np.ones((1, 16), np.float32))
        with pytest.raises(InferenceServerException) as e:
            client.infer("add_sub", [i0, i1])
        assert e.value.status() == f"StatusCode.{status}"
        return e.value

    unknown = infer_with("nope", BYTES_16, status="NOT_FOUND")
    assert "Unable to find shared memory region: 'nope'" in unknown.message()
    assert "Invalid offset + byte size for shared memory region: 'small'" in (
        infer_with("small", BYTES_16, offset=4).message()
    )
    assert "Invalid offset for shared memory region: 'small'" in (
        infer_with("small", BYTES_16, offset=BYTES_16).message()
    )
    assert "input byte size mismatch for input 'INPUT0'" in infer_with("small", 32).message()

    a = np.ones((1, 16), np.float32)
    o = grpcclient.InferRequestedOutput("OUTPUT0")
    o.set_shared_memory("small", 32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", _add_sub_inputs(a, a), outputs=[o])
    assert e.value.status() == "StatusCode.INTERNAL"  # NOTE: Triton's (2.51 and main)
    assert "should be at least 64 bytes to hold the results" in e.value.message()
    assert e.value.message().startswith("shared memory size specified")  # no class name

    res = client.infer("add_sub", _add_sub_inputs(a, a))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + a)


def test_a_client_that_unlinks_its_object_gets_an_error_not_a_crash(
    client: grpcclient.InferenceServerClient,
) -> None:
    key = _key("gone")
    handle = shm.create_shared_memory_region("gone", key, BYTES_16, create_only=True)
    client.register_system_shared_memory("gone", key, BYTES_16)
    shm.destroy_shared_memory_region(handle)  # unlinks while still registered
    i0 = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    i0.set_shared_memory("gone", BYTES_16)
    i1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
    i1.set_data_from_numpy(np.ones((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", [i0, i1])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"Unable to map shared memory object '{key}'" in e.value.message()
    a = np.ones((1, 16), np.float32)
    np.testing.assert_array_equal(
        client.infer("add_sub", _add_sub_inputs(a, a)).as_numpy("OUTPUT1"), a - a
    )


@pytest.mark.parametrize("flags", [(), ("--allow-client-shm", "false")])
def test_client_shm_is_off_by_default_and_with_false(
    tmp_path: Path,
    start_server: Callable[..., ServerProcess],
    regions: Callable[..., shm.SharedMemoryRegion],
    flags: tuple[str, ...],
) -> None:
    # Triton since server PR #8721 (26.04): client shared memory is off unless
    # --allow-client-shm=true; a register call is refused UNSUPPORTED with this message.
    server = start_server(_repo(tmp_path), *flags)
    regions("off", 64)
    c = server.client()
    with pytest.raises(InferenceServerException) as e:
        c.register_system_shared_memory("off", _key("off"), 64)
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    assert e.value.message() == (
        "Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
        "to enable."
    )
    hc = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as e:
        hc.register_system_shared_memory("off", _key("off"), 64)
    assert "Client shared memory is disabled" in e.value.message()
    c.close()


def test_regions_reach_every_frontend(
    tmp_path: Path,
    start_server: Callable[..., ServerProcess],
    regions: Callable[..., shm.SharedMemoryRegion],
) -> None:
    server = start_server(
        _repo(tmp_path),
        "--allow-client-shm=true",
        "--frontend-processes",
        "2",
        "--log-verbose",
        "1",
    )
    a = np.arange(16, dtype=np.float32)[None]
    region = regions("shared", BYTES_16)
    shm.set_shared_memory_region(region, [a])
    registrar = server.client()
    registrar.register_system_shared_memory("shared", _key("shared"), BYTES_16)
    # NOTE: 16 connections land on both frontends (see test_frontends.py); each must know
    # the region registered through the first connection.
    for _ in range(16):
        c = server.client()
        deadline = time.monotonic() + 10
        # NOTE: the message between frontends is asynchronous; wait until this frontend
        # reports the region, as a client of a multi-frontend server would.
        while "shared" not in c.get_system_shared_memory_status().regions:
            assert time.monotonic() < deadline, "region never reached this frontend"
            time.sleep(0.01)
        i0 = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        i0.set_shared_memory("shared", BYTES_16)
        i1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        i1.set_data_from_numpy(a)
        np.testing.assert_array_equal(c.infer("add_sub", [i0, i1]).as_numpy("OUTPUT0"), a + a)
        c.close()
    registrar.unregister_system_shared_memory()
    registrar.close()


def test_a_client_that_truncates_its_object_gets_an_error_and_the_worker_lives(
    server: ServerProcess,
    client: grpcclient.InferenceServerClient,
    regions: Callable[..., shm.SharedMemoryRegion],
) -> None:
    import posix_ipc

    region = regions("shrinks", 2 * BYTES_16)
    a = np.ones((1, 16), np.float32)
    shm.set_shared_memory_region(region, [a, a])
    client.register_system_shared_memory("shrinks", _key("shrinks"), 2 * BYTES_16)

    def infer() -> grpcclient.InferResult:
        i0 = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        i0.set_shared_memory("shrinks", BYTES_16, offset=BYTES_16)
        i1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        i1.set_data_from_numpy(a)
        return client.infer("add_sub", [i0, i1])

    np.testing.assert_array_equal(infer().as_numpy("OUTPUT0"), a + a)  # mapped by the worker
    obj = posix_ipc.SharedMemory(_key("shrinks"))
    os.ftruncate(obj.fd, BYTES_16)  # the client shrinks it under the registration
    obj.close_fd()
    with pytest.raises(InferenceServerException) as e:
        infer()
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "smaller than the registered window" in e.value.message()
    # The same worker still serves (a SIGBUS would have killed it).
    assert "died" not in server.log()
    np.testing.assert_array_equal(
        client.infer("add_sub", _add_sub_inputs(a, a)).as_numpy("OUTPUT0"), a + a
    )
