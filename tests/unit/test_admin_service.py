"""The admin service (``triton_mp.admin.Admin/QueueStatus``) without a server process.

The proto mirrors the msgspec structs field for field; the servicer runs on an in-process
grpc.aio server (in a thread) whose "scheduler" is a function answering each QueueQuery
with a hand-made QueueReply; ``fetch_queue_status`` is the client ``triton-mp stat`` uses.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import grpc
import msgspec
import pytest

from tests.helpers.server import free_port
from tests.unit.fake_queues import busy_cls, idle_add_sub
from triton_mp._proto import admin_pb2, admin_pb2_grpc, health_pb2_grpc
from triton_mp.cli.admin_client import (
    AdminError,
    fetch_queue_snapshot,
    fetch_queue_status,
    status_from_proto,
)
from triton_mp.common.errors import ErrorCode
from triton_mp.frontend.admin.stats import StatsApi
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.grpc.admin_service import AdminServicer, status_to_proto
from triton_mp.frontend.model_table import ModelTable
from triton_mp.ipc import Decoder, SegmentCache
from triton_mp.ipc.protocol.messages import QueueQuery, QueueReply, ToScheduler
from triton_mp.ipc.protocol.reports import (
    BatchRecord,
    InstanceStatus,
    LevelStatus,
    ModelQueueStatus,
)
from triton_mp.ipc.protocol.specs import ModelEntry

pytestmark = pytest.mark.timeout(60)

MODELS = (busy_cls(), idle_add_sub())

Scheduler = Callable[[QueueQuery], tuple[ModelQueueStatus, ...] | None]
"""Answers a query with these models, or None to stay silent."""


def _all(query: QueueQuery) -> tuple[ModelQueueStatus, ...]:
    return tuple(m for m in MODELS if not query.model or m.model == query.model)


class AdminServer:
    """A grpc.aio server in a thread serving ``AdminServicer`` (and optionally nothing)."""

    def __init__(self, scheduler: Scheduler | None, reply_timeout_s: float = 5.0) -> None:
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.queries: list[QueueQuery] = []
        self.frontend_restarts: dict[int, int] = {}
        self._scheduler = scheduler
        self._timeout_s = reply_timeout_s
        self._started = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),))
        self._stop: asyncio.Event | None = None

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = grpc.aio.server()
        if self._scheduler is not None:
            pending = PendingTable(SegmentCache())
            decoder = Decoder(ToScheduler)
            loop = asyncio.get_running_loop()
            scheduler = self._scheduler

            def send(data: bytes) -> None:
                query = decoder.decode(data)
                assert isinstance(query, QueueQuery)
                self.queries.append(query)
                models = scheduler(query)
                if models is not None:
                    reply = QueueReply(query_id=query.query_id, models=models)
                    loop.call_soon(pending.deliver, [reply])

            entries = tuple(
                ModelEntry(name=m.model, config=b"", ready_versions=(1,)) for m in MODELS
            )
            stats = StatsApi(
                frontend_id=3,
                models=ModelTable(entries),
                pending=pending,
                send_scheduler=send,
                reply_timeout_s=self._timeout_s,
            )
            stats.frontend_restarts.update(self.frontend_restarts)
            servicer = AdminServicer(stats)
            admin_pb2_grpc.add_AdminServicer_to_server(servicer, server)
        else:
            health_pb2_grpc.add_HealthServicer_to_server(health_pb2_grpc.HealthServicer(), server)
        server.add_insecure_port(self.url)
        await server.start()
        self._started.set()
        await self._stop.wait()
        await server.stop(grace=None)

    def __enter__(self) -> AdminServer:
        self._thread.start()
        assert self._started.wait(10), "in-process admin server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def admin() -> Iterator[AdminServer]:
    with AdminServer(_all) as server:
        yield server


# ------------------------------------------------------------------------------ the proto
@pytest.mark.parametrize(
    ("struct", "message"),
    [
        (LevelStatus, admin_pb2.LevelStatus),
        (InstanceStatus, admin_pb2.InstanceStatus),
        (BatchRecord, admin_pb2.BatchRecord),
        (ModelQueueStatus, admin_pb2.ModelQueueStatus),
    ],
)
def test_proto_mirrors_every_struct_field(struct: type[msgspec.Struct], message: type) -> None:
    struct_fields = [f.name for f in msgspec.structs.fields(struct)]
    proto_fields = [f.name for f in message.DESCRIPTOR.fields]
    assert struct_fields == proto_fields


def test_status_survives_proto_round_trip() -> None:
    response = status_to_proto(MODELS)
    wire = admin_pb2.QueueStatusResponse.FromString(response.SerializeToString())
    assert status_from_proto(wire) == MODELS
    cls = wire.models[0]
    assert dict(cls.batch_sizes) == {1: 5, 3: 2, 8: 60, 16: 40}
    assert dict(cls.close_reasons) == {"preferred": 100, "idle": 7}
    assert [lv.depth for lv in cls.levels] == [12, 40]


def test_empty_reply_is_empty_response() -> None:
    assert status_from_proto(status_to_proto(())) == ()


# ---------------------------------------------------------------------------- the service
def test_queue_status_for_every_model(admin: AdminServer) -> None:
    assert fetch_queue_status(admin.url) == MODELS
    assert admin.queries == [QueueQuery(query_id=admin.queries[0].query_id, frontend_id=3)]


def test_queue_snapshot_carries_frontend_restarts() -> None:
    """What ``triton-mp stat`` shows in its header: the supervisor's restart counts the
    frontend holds (``StatsApi.frontend_restarts``), per frontend id."""
    server = AdminServer(_all)
    server.frontend_restarts = {0: 0, 1: 2}
    with server:
        assert fetch_queue_snapshot(server.url) == (MODELS, {0: 0, 1: 2})


def test_queue_status_for_one_model(admin: AdminServer) -> None:
    assert fetch_queue_status(admin.url, "ocr_cls") == (busy_cls(),)
    assert admin.queries[-1].model == "ocr_cls"


def test_unknown_model_is_not_found_without_asking_the_scheduler(admin: AdminServer) -> None:
    with pytest.raises(AdminError) as info:
        fetch_queue_status(admin.url, "nope")
    assert info.value.code == ErrorCode.NOT_FOUND
    assert info.value.message == "Request for unknown model: 'nope' is not found"
    assert admin.queries == []


def test_unknown_model_status_code_on_the_wire(admin: AdminServer) -> None:
    with grpc.insecure_channel(admin.url) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.QueueStatus(admin_pb2.QueueStatusRequest(model="nope"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "Request for unknown model: 'nope' is not found"


def test_silent_scheduler_is_deadline_exceeded() -> None:
    silent = AdminServer(lambda q: None, reply_timeout_s=0.2)
    with silent as server, pytest.raises(AdminError) as info:
        fetch_queue_status(server.url)
    assert info.value.code == ErrorCode.DEADLINE_EXCEEDED
    assert "scheduler did not answer" in info.value.message


def test_server_without_admin_service_is_unsupported() -> None:
    with AdminServer(None) as server, pytest.raises(AdminError) as info:
        fetch_queue_status(server.url)
    assert info.value.code == ErrorCode.UNSUPPORTED
    assert info.value.message == (
        f"the server at {server.url} does not serve triton-mp's admin service"
    )


def test_no_server_is_unavailable_in_one_line() -> None:
    url = f"127.0.0.1:{free_port()}"
    with pytest.raises(AdminError) as info:
        fetch_queue_status(url, timeout_s=5)
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert info.value.message.startswith(f"cannot reach a server at {url}: ")
    assert "\n" not in info.value.message
