"""Inference with system shared memory, side by side: every case runs against triton-mp and,
where ``.peers/`` has it, the real Triton 2.51 on the same python model, through
tritonclient (gRPC and HTTP), and both must give the same answers: the same status and
message for a bad window or an unknown region, the same bytes at the same offsets of the
client's output region, a region registered over HTTP used over gRPC, and Triton's refusal
to unregister a region that a request in flight uses (server ``shared_memory_manager.cc``,
``grpc/infer_handler.cc``, ``http_server.cc``).
"""

from __future__ import annotations

import mmap
import os
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, peers_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
name: "twice_py"
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }]
"""
MODEL = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            if x.size and x[0] < 0:
                time.sleep(-float(x[0]))  # a request that stays in flight that long
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return out
"""
SAME_CONFIG = """
name: "same_py"
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }]
"""
SAME_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""
"""Returns its input array itself (a view of the input where the server gives one)."""
BATCHED_CONFIG = """
name: "twice_batched_py"
backend: "python"
max_batch_size: 4
dynamic_batching { max_queue_delay_microseconds: 100 }
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }]
"""
BATCHED_MODEL = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            if x.size and x.flat[0] < 0:
                time.sleep(-float(x.flat[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return out
"""
"""twice_py with a batcher: a version the direct handoff does not serve, so triton-mp's
native gRPC thread submits and answers its known calls itself (``known_regions.h``)."""
REGION_BYTES = 256
SLOW_S = 2.0
"""How long the slow request runs; the unregistration comes ``SLOW_S / 4`` after it."""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shm_messages")
    write_python_model(root / "repo", "twice_py", CONFIG, MODEL)
    write_python_model(root / "repo", "same_py", SAME_CONFIG, SAME_MODEL)
    write_python_model(root / "repo", "twice_batched_py", BATCHED_CONFIG, BATCHED_MODEL)
    return root / "repo"


@pytest.fixture(scope="module")
def ours(repo: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(repo, repo.parent / "ours.log", "--allow-client-shm=true")
    try:
        server.wait_live()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def servers(ours: ServerProcess, repo: Path) -> Iterator[dict[str, tuple[str, str]]]:
    """(gRPC, HTTP) URLs: ``triton-mp`` always, ``triton`` when the real Triton is installed."""
    urls = {"triton-mp": (ours.url, ours.http_url)}
    theirs: RealTriton | None = None
    try:
        env = peers_env()
        if env is not None:
            theirs = RealTriton(env, repo.parent / "triton.log", f"--model-repository={repo}")
            theirs.wait_live()
            urls["triton"] = (theirs.url, theirs.http_url)
        yield urls
    finally:
        if theirs is not None:
            theirs.stop(wait=False)


class Client:
    """One server's gRPC and HTTP clients with two fresh regions, ``in`` and ``out``, of
    ``REGION_BYTES`` each (``in`` holds 0, 1, 2, ... as FP32)."""

    def __init__(self, side: str, urls: tuple[str, str]) -> None:
        self.grpc = grpcclient.InferenceServerClient(urls[0])
        self.http = httpclient.InferenceServerClient(urls[1])
        tag = f"{os.getpid()}_{side}_{time.monotonic_ns()}"
        self.handles: list[Any] = []
        self.io: Any = None
        self.inp = self.create("in", f"/shm_msgs_in_{tag}")
        shm.set_shared_memory_region(self.inp, [np.arange(64, dtype=np.float32)])
        self.out = self.create("out", f"/shm_msgs_out_{tag}")
        self.grpc.unregister_system_shared_memory()

    def create(self, name: str, key: str, size: int = REGION_BYTES) -> Any:
        handle = shm.create_shared_memory_region(name, key, size)
        self.handles.append((handle, key))
        return handle

    def register(self, *, http: bool = False, name: str = "", key: str = "") -> None:
        """Register ``in`` and ``out`` (or one region ``name`` over object ``key``)."""
        client = self.http if http else self.grpc
        pairs = [(name, key)] if name else [("in", self.handles[0][1]), ("out", self.handles[1][1])]
        for n, k in pairs:
            client.register_system_shared_memory(n, k, REGION_BYTES)

    def infer(
        self, n: int = 4, *, http: bool = False, model: str = "twice_py", **window: Any
    ) -> tuple[str, str]:
        """One request of ``n`` floats from ``in`` into ``out`` (or the regions and windows
        ``window`` names); ("OK", "") or the error's (status, message)."""
        mod: Any = httpclient if http else grpcclient
        client = self.http if http else self.grpc
        i = mod.InferInput("IN", [n], "FP32")
        i.set_shared_memory(window.get("inreg", "in"), n * 4, window.get("ioff", 0))
        o = mod.InferRequestedOutput("OUT")
        o.set_shared_memory(
            window.get("outreg", "out"), window.get("osize", n * 4), window.get("ooff", 0)
        )
        try:
            client.infer(model, [i], outputs=[o])
        except InferenceServerException as e:
            return str(e.status()), e.message() or ""
        return "OK", ""

    def output(self) -> list[float]:
        return [float(v) for v in shm.get_contents_as_numpy(self.out, np.float32, [64])]

    def regions(self) -> list[str]:
        status = self.grpc.get_system_shared_memory_status(as_json=True)
        return sorted(status.get("regions", {}))

    def close(self) -> None:
        try:
            self.grpc.unregister_system_shared_memory()
        finally:
            for handle, _key in self.handles:
                shm.destroy_shared_memory_region(handle)
            self.grpc.close()
            self.http.close()


@pytest.fixture
def clients(servers: dict[str, tuple[str, str]]) -> Iterator[dict[str, Client]]:
    made = {side: Client(side, urls) for side, urls in servers.items()}
    try:
        yield made
    finally:
        for c in made.values():
            c.close()


def _each(clients: dict[str, Client], case: Callable[[Client], object]) -> dict[str, object]:
    """``case`` on every server; the answers by server."""
    return {side: case(c) for side, c in clients.items()}


def _same(answers: dict[str, object], expected: object) -> None:
    for side, got in answers.items():
        assert got == expected, side


BAD_WINDOWS = {
    "output window past the region's end": (
        {"ooff": 250},
        (
            "StatusCode.INVALID_ARGUMENT",
            "Invalid offset + byte size for shared memory region: 'out'",
        ),
    ),
    "output offset at the region's end": (
        {"ooff": REGION_BYTES},
        ("StatusCode.INVALID_ARGUMENT", "Invalid offset for shared memory region: 'out'"),
    ),
    "input offset past the region": (
        {"ioff": 300},
        ("StatusCode.INVALID_ARGUMENT", "Invalid offset for shared memory region: 'in'"),
    ),
    "unknown input region": (
        {"inreg": "nope"},
        ("StatusCode.NOT_FOUND", "Unable to find shared memory region: 'nope'"),
    ),
    "unknown output region": (
        {"outreg": "nope"},
        ("StatusCode.NOT_FOUND", "Unable to find shared memory region: 'nope'"),
    ),
}


@pytest.mark.parametrize("case", list(BAD_WINDOWS))
def test_bad_windows_get_tritons_status_and_message(clients: dict[str, Client], case: str) -> None:
    window, expected = BAD_WINDOWS[case]
    for c in clients.values():
        c.register()
    _same(_each(clients, lambda c: c.infer(**window)), expected)
    _same(_each(clients, lambda c: c.infer()), ("OK", ""))  # and the server keeps serving


def test_an_unknown_region_over_http_is_404_as_in_triton(clients: dict[str, Client]) -> None:
    for c in clients.values():
        c.register()
    _same(
        _each(clients, lambda c: c.infer(http=True, inreg="nope")),
        ("404", "Unable to find shared memory region: 'nope'"),
    )


def test_an_output_region_too_small_gets_tritons_status_and_message(
    clients: dict[str, Client],
) -> None:
    """INTERNAL (HTTP 500): the response allocator's code in Triton (c7d84a9)."""
    for c in clients.values():
        c.register()
    message = (
        "shared memory size specified with the request for output 'OUT' (8 bytes) should be "
        "at least 16 bytes to hold the results"
    )
    _same(_each(clients, lambda c: c.infer(osize=8)), ("StatusCode.INTERNAL", message))
    _same(_each(clients, lambda c: c.infer(osize=8, http=True)), ("500", message))


def test_offsets_place_the_same_bytes_in_the_output_region(clients: dict[str, Client]) -> None:
    for c in clients.values():
        c.register()
    _same(_each(clients, lambda c: c.infer(4, ioff=64, ooff=32)), ("OK", ""))
    _same(_each(clients, lambda c: c.infer(2, ooff=128, http=True)), ("OK", ""))
    expected = [0.0] * 64
    expected[8:12] = [32.0, 34.0, 36.0, 38.0]  # in[16:20] * 2 at byte 32
    expected[32:34] = [0.0, 2.0]  # in[0:2] * 2 at byte 128
    _same(_each(clients, Client.output), expected)


def test_a_region_registered_over_http_serves_grpc(clients: dict[str, Client]) -> None:
    for c in clients.values():
        c.register(http=True)
    _same(_each(clients, lambda c: c.infer(8)), ("OK", ""))
    _same(_each(clients, lambda c: c.output()[:8]), [float(2 * v) for v in range(8)])


def _in_flight(
    c: Client, start: Callable[[], object]
) -> tuple[threading.Thread, dict[str, object]]:
    """Write the slow marker at ``in[32]`` and run ``start`` (a request from there) in a
    thread; returns once the request has been in flight for ``SLOW_S / 4``."""
    marker = np.array([-SLOW_S, 5, 6, 7], dtype=np.float32)
    shm.set_shared_memory_region(c.inp, [marker], offset=128)
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("answer", start()))
    t.start()
    time.sleep(SLOW_S / 4)
    return t, box


def _unregister(client: Any, name: str = "") -> tuple[str, str]:
    try:
        client.unregister_system_shared_memory(name)
    except InferenceServerException as e:
        return str(e.status()), e.message() or ""
    return "OK", ""


@pytest.mark.parametrize("over", ["grpc", "http"])
def test_a_region_in_use_cannot_be_unregistered(clients: dict[str, Client], over: str) -> None:
    """2.51 refuses (INTERNAL) while a request uses the region, over either protocol, and
    keeps it; the request completes; once it has, the unregistration succeeds."""
    for c in clients.values():
        c.register()
    flights = {
        side: _in_flight(c, lambda c=c: c.infer(4, ioff=128, ooff=128))
        for side, c in clients.items()
    }
    code = "StatusCode.INTERNAL" if over == "grpc" else "500"
    refused = (code, "Cannot unregister shared memory region 'out', it is currently in use.")
    _same(_each(clients, lambda c: _unregister(getattr(c, over), "out")), refused)
    _same(_each(clients, Client.regions), ["in", "out"])
    for t, _ in flights.values():
        t.join(timeout=30)
    _same({side: box["answer"] for side, (_, box) in flights.items()}, ("OK", ""))
    _same(_each(clients, lambda c: c.output()[32:36]), [-2 * SLOW_S, 10.0, 12.0, 14.0])
    _same(_each(clients, lambda c: _unregister(getattr(c, over), "out")), ("OK", ""))
    _same(_each(clients, Client.regions), ["in"])


_KNOWN_SENT = re.compile(
    r'^triton_mp_frontend_native_known_calls_total\{outcome="sent"\} (\S+)$', re.M
)


def _sent_natively(server: ServerProcess) -> float:
    """Calls triton-mp's native gRPC thread submitted itself (``GET /metrics``; 0 where the
    Python frontend serves gRPC)."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as resp:
        found = _KNOWN_SENT.search(resp.read().decode())
    return float(found[1]) if found else 0.0


def _batched(c: Client, ioff: int = 0) -> tuple[str, str]:
    """One twice_batched_py request of 4 floats from ``in`` (at ``ioff``) into ``out``."""
    i = grpcclient.InferInput("IN", [1, 4], "FP32")
    i.set_shared_memory("in", 16, ioff)
    o = grpcclient.InferRequestedOutput("OUT")
    o.set_shared_memory("out", 16, ioff)
    try:
        c.grpc.infer("twice_batched_py", [i], outputs=[o])
    except InferenceServerException as e:
        return str(e.status()), e.message() or ""
    return "OK", ""


def test_regions_of_calls_sent_natively_answer_as_tritons(
    clients: dict[str, Client], ours: ServerProcess
) -> None:
    """The same call again and again (triton-mp's native gRPC thread then submits and
    answers it without Python), each output in the client's region; a region such a call
    uses cannot be unregistered until it is answered (INTERNAL, Triton's words); once
    unregistered, the next call gets Triton's NOT_FOUND, as in 2.51."""
    for c in clients.values():
        c.register()
    before = _sent_natively(ours)
    for k in range(8):
        for c in clients.values():
            shm.set_shared_memory_region(c.inp, [np.arange(4, dtype=np.float32) + k])
        _same(_each(clients, _batched), ("OK", ""))
        _same(_each(clients, lambda c: c.output()[:4]), [2.0 * (v + k) for v in range(4)])
    sent = _sent_natively(ours)
    if "(native)" in ours.log():  # NOTE: the extension is built: calls went natively
        assert sent - before >= 4, (before, sent)
    flights = {side: _in_flight(c, lambda c=c: _batched(c, 128)) for side, c in clients.items()}
    in_use = "Cannot unregister shared memory region 'out', it is currently in use."
    refused = ("StatusCode.INTERNAL", in_use)
    _same(_each(clients, lambda c: _unregister(c.grpc, "out")), refused)
    for t, _ in flights.values():
        t.join(timeout=30)
    _same({side: box["answer"] for side, (_, box) in flights.items()}, ("OK", ""))
    _same(_each(clients, lambda c: _unregister(c.grpc, "out")), ("OK", ""))
    gone = ("StatusCode.NOT_FOUND", "Unable to find shared memory region: 'out'")
    _same(_each(clients, _batched), gone)
    _same(_each(clients, _batched), gone)


@pytest.mark.parametrize("over", ["grpc", "http"])
def test_unregister_all_keeps_the_regions_in_use_and_names_them(
    clients: dict[str, Client], over: str
) -> None:
    for c in clients.values():
        c.register()
        key = c.handles[1][1] + "_spare"
        c.create("spare", key)
        c.register(name="spare", key=key)
    flights = {
        side: _in_flight(c, lambda c=c: c.infer(4, ioff=128, ooff=128))
        for side, c in clients.items()
    }
    _same(
        _each(clients, lambda c: _unregister(getattr(c, over))),
        (
            "StatusCode.INTERNAL" if over == "grpc" else "500",
            "Failed to unregister the following system shared memory regions: in ,out ,",
        ),
    )
    _same(_each(clients, Client.regions), ["in", "out"])
    for t, _ in flights.values():
        t.join(timeout=30)
    _same({side: box["answer"] for side, (_, box) in flights.items()}, ("OK", ""))
    _same(_each(clients, lambda c: _unregister(c.grpc)), ("OK", ""))
    _same(_each(clients, Client.regions), [])


@pytest.mark.parametrize("shift", [16, -16, 4096])
def test_an_output_window_overlapping_its_input_gets_the_input_whole(
    clients: dict[str, Client], shift: int
) -> None:
    """An identity model whose output window overlaps its own input window in one region
    (32 KiB, moved by ``shift`` bytes): the output is the input as it was (Triton copies
    inputs out of the client's memory before the model runs, so the overlap cannot smear
    them)."""
    size, n, start = 1 << 16, 8192, 8192
    original = np.arange(size // 4, dtype=np.float32)
    for c in clients.values():
        key = c.handles[0][1] + "_io"
        c.io = c.create("io", key, size)
        shm.set_shared_memory_region(c.io, [original])
        c.grpc.register_system_shared_memory("io", key, size)
    window = {"inreg": "io", "outreg": "io", "ioff": start, "ooff": start + shift}
    _same(_each(clients, lambda c: c.infer(n, model="same_py", **window)), ("OK", ""))
    first = (start + shift) // 4
    expected = original[start // 4 : start // 4 + n]
    for side, c in clients.items():
        got = shm.get_contents_as_numpy(c.io, np.float32, [size // 4])[first : first + n]
        np.testing.assert_array_equal(got, expected, err_msg=side)


def test_a_worker_killed_mid_request_frees_its_regions_and_its_successor_serves_them(
    ours: ServerProcess, clients: dict[str, Client]
) -> None:
    """triton-mp only: the request the dead worker held fails, which ends its use of the
    regions (they can be unregistered), and the restarted worker maps them afresh."""
    c = clients["triton-mp"]
    c.register()
    worker = next(
        p
        for p in psutil.Process(ours.pid).children(recursive=True)
        if " ".join(p.cmdline()).strip().startswith("triton-mp: worker twice_py")
    )
    thread, box = _in_flight(c, lambda: c.infer(4, ioff=128, ooff=128))
    assert _unregister(c.grpc, "out")[0] == "StatusCode.INTERNAL"  # in use
    worker.kill()
    thread.join(timeout=60)
    status, _message = box["answer"]  # type: ignore[misc]
    assert status != "OK"
    assert _unregister(c.grpc, "out") == ("OK", "")
    c.register(name="out", key=c.handles[1][1])
    deadline = time.monotonic() + 90
    while c.infer(8) != ("OK", ""):
        assert time.monotonic() < deadline, "the restarted worker never served the regions"
        time.sleep(0.5)
    assert c.output()[:8] == [float(2 * v) for v in range(8)]


def _register(client: Any, name: str, key: str, size: int, offset: int) -> tuple[str, str]:
    try:
        client.register_system_shared_memory(name, key, size, offset=offset)
    except InferenceServerException as e:
        return str(e.status()), e.message() or ""
    return "OK", ""


@pytest.mark.parametrize("over", ["grpc", "http"])
def test_a_window_mmap_refuses_gets_tritons_words(clients: dict[str, Client], over: str) -> None:
    page = mmap.PAGESIZE
    bad = "unable to process address spaceInvalid argument"
    status = "StatusCode.INVALID_ARGUMENT" if over == "grpc" else "400"
    for side, c in clients.items():
        # NOTE: one object per registration: 2.51 refuses a key registered already (INTERNAL
        # "Invalid shared memory region: '<key>'"); upstream main has no such rule
        # (tests/e2e/test_r26_shm_same_key.py).
        keys = [f"/shm_msgs_pages_{os.getpid()}_{side}_{over}_{i}" for i in range(3)]
        for i, key in enumerate(keys):
            c.create(f"pages{i}", key, 2 * page)
        client = c.grpc if over == "grpc" else c.http
        assert _register(client, "aligned", keys[0], 100, page) == ("OK", ""), side
        # mmap's offset must be a multiple of the page size, and its length above 0.
        assert _register(client, "b", keys[1], 100, 100) == (
            status,
            f"failed to register shared memory region 'b': {bad}",
        ), side
        assert _register(client, "c", keys[2], 0, 0) == (
            status,
            f"failed to register shared memory region 'c': {bad}",
        ), side
        assert c.regions() == ["aligned"], side


@pytest.mark.parametrize("over", ["grpc", "http"])
def test_a_key_without_its_slash_is_echoed_as_given_and_serves(
    clients: dict[str, Client], over: str
) -> None:
    for side, c in clients.items():
        c.grpc.unregister_system_shared_memory()
        key = c.handles[0][1]
        client = c.grpc if over == "grpc" else c.http
        client.register_system_shared_memory("in", key.lstrip("/"), REGION_BYTES)
        client.register_system_shared_memory("out", c.handles[1][1], REGION_BYTES)
        if over == "grpc":
            status = c.grpc.get_system_shared_memory_status("in", as_json=True)["regions"]["in"]
        else:
            (status,) = c.http.get_system_shared_memory_status("in")
        assert status["key"] == key.lstrip("/"), side
        assert c.infer(8, http=over == "http") == ("OK", ""), side
        assert c.output()[:8] == [float(2 * v) for v in range(8)], side


@pytest.mark.parametrize("over", ["grpc", "http"])
def test_an_empty_or_all_slash_key_is_refused_as_upstream_main_refuses_it(
    clients: dict[str, Client], over: str
) -> None:
    # NOTE: 2.51 tries shm_open and answers INTERNAL "Unable to open shared memory region:
    # ''" (500); since server PR #8336 (2.61) ValidateSharedMemoryKey refuses a key that is
    # empty or only slashes first, INVALID_ARG, in the same words as for "//" and the
    # reserved prefix (test_triton_http_messages MAIN_ONLY). triton-mp follows main here.
    codes = {"grpc": ("StatusCode.INTERNAL", "StatusCode.INVALID_ARGUMENT"), "http": ("500", "400")}
    theirs, ours = codes[over]
    for side, c in clients.items():
        client = c.grpc if over == "grpc" else c.http
        for key in ("", "/"):
            got = _register(client, "r", key, 16, 0)
            if side == "triton":
                assert got == (theirs, f"Unable to open shared memory region: '{key}'"), key
            else:
                want = f"cannot register shared memory region 'r' - invalid shm key '{key}'"
                assert got == (ours, want), key
        assert "r" not in c.regions(), side
