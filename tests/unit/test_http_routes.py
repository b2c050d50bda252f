"""The HTTP adapter's routing and error mapping, in-process (aiohttp's test server, no processes).

A fake core stands in for FrontendApi: each test checks how ``frontend.http.routes`` turns a path
and verb into a call, and a TritonMPError (or an unexpected exception) into Triton's status
and ``{"error": ...}`` body. Real answers are checked end to end in tests/e2e/test_http.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.admin.server import ServerMetadata
from triton_mp.frontend.http.routes import HTTP_STATUS, HttpFrontend, raw_model_name


class FakeCore:
    """Stands in for the ``server`` and ``shm`` parts of FrontendApi; answers metadata with a
    fixed error or value, as a test sets it."""

    def __init__(self) -> None:
        self.raise_on_metadata: BaseException | None = None
        self.is_ready = True
        self.calls: list[tuple[str, ...]] = []

    def ready(self) -> bool:
        return self.is_ready

    async def ready_checked(self) -> bool:
        return self.ready()

    @property
    def server(self) -> FakeCore:
        return self

    @property
    def shm(self) -> FakeCore:
        return self

    def metadata(self) -> ServerMetadata:
        if self.raise_on_metadata is not None:
            raise self.raise_on_metadata
        return ServerMetadata(name="fake", version="0", extensions=("x",))

    def model_ready(self, name: str, version: str) -> bool:
        self.calls.append(("model_ready", name, version))
        return name == "good"

    async def model_ready_checked(self, name: str, version: str) -> bool:
        return self.model_ready(name, version)

    async def unregister(self, name: str) -> None:
        self.calls.append(("shm_unregister", name))


def _run(core: FakeCore, body: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async def main() -> None:
        client: TestClient[Any, Any] = TestClient(TestServer(HttpFrontend(core).app))  # type: ignore[arg-type]
        await client.start_server()
        try:
            await body(client)
        finally:
            await client.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.INTERNAL, 500),
        (ErrorCode.NOT_FOUND, 404),
        (ErrorCode.UNAVAILABLE, 503),
        (ErrorCode.UNSUPPORTED, 501),
        (ErrorCode.INVALID_ARG, 400),
        (ErrorCode.ALREADY_EXISTS, 400),
        (ErrorCode.UNKNOWN, 400),
        (ErrorCode.CANCELLED, 400),
    ],
)
def test_error_codes_map_to_tritons_http_statuses(code: ErrorCode, status: int) -> None:
    assert HTTP_STATUS.get(code, 400) == status
    core = FakeCore()
    core.raise_on_metadata = TritonMPError("nope", code)

    async def body(client: TestClient[Any, Any]) -> None:
        r = await client.get("/v2")
        assert r.status == status
        assert r.headers["Content-Type"] == "application/json"
        assert await r.json() == {"error": "nope"}

    _run(core, body)


def test_an_unexpected_exception_is_a_500_with_its_text() -> None:
    core = FakeCore()
    core.raise_on_metadata = RuntimeError("boom")

    async def body(client: TestClient[Any, Any]) -> None:
        r = await client.get("/v2")
        assert r.status == 500
        assert await r.json() == {"error": "RuntimeError: boom"}
        # The server keeps serving.
        core.raise_on_metadata = None
        assert (await (await client.get("/v2")).json())["name"] == "fake"

    _run(core, body)


def test_routes_take_tritons_model_and_version_patterns() -> None:
    core = FakeCore()

    async def body(client: TestClient[Any, Any]) -> None:
        assert (await client.get("/v2/models/good/ready")).status == 200
        assert (await client.get("/v2/models/good/versions/12/ready")).status == 200
        bad = await client.get("/v2/models/other/ready")
        assert bad.status == 400
        # NOTE: JSON bodies labelled text/plain, as 2.51's libevhtp labels them.
        assert bad.content_type == "text/plain"
        assert await bad.json(content_type=None) == {"error": "Model version not ready"}
        # A version must be digits, as Triton's route regex says: anything else is no route.
        r = await client.get("/v2/models/good/versions/v1/ready")
        assert r.status == 404
        assert await r.json(content_type="text/plain") == {"error": "Not Found"}
        r = await client.head("/v2/health/live")
        assert r.status == 405
        r = await client.delete("/v2/models/good/ready")
        assert r.status == 405
        assert await r.json(content_type="text/plain") == {"error": "Method Not Allowed"}
        r = await client.delete("/v2/models/good/config")
        assert r.status == 405
        assert await r.json() == {"error": "Method Not Allowed"}
        assert (await client.post("/v2/systemsharedmemory/region/a/unregister")).status == 200
        assert (await client.post("/v2/systemsharedmemory/unregister")).status == 200

    _run(core, body)
    assert core.calls == [
        ("model_ready", "good", ""),
        ("model_ready", "good", "12"),
        ("model_ready", "other", ""),
        ("shm_unregister", "a"),
        ("shm_unregister", ""),
    ]


@pytest.mark.parametrize(("ready", "status"), [(True, 200), (False, 400)])
def test_health_ready_has_an_empty_body(ready: bool, status: int) -> None:
    core = FakeCore()
    core.is_ready = ready

    async def body(client: TestClient[Any, Any]) -> None:
        r = await client.get("/v2/health/ready")
        assert r.status == status
        assert await r.read() == b""
        live = await client.get("/v2/health/live")
        assert live.status == 200

    _run(core, body)


@pytest.mark.parametrize(
    ("template", "raw", "name"),
    [
        ("/v2/models/{model}/infer", "/v2/models/..%2F..%2Fm/infer", "..%2F..%2Fm"),
        ("/v2/models/{model}", "/v2/models/%6D?x=%2F", "%6D"),
        (
            "/v2/repository/{repository}/models/{model}/load",
            "/v2/repository/r/models/a%20b/load",
            "a%20b",
        ),
        ("/v2/repository/models/{model}/unload", "/v2/repository/models/m/unload", "m"),
        ("/v2/models/stats", "/v2/models/stats", ""),
    ],
)
def test_model_names_keep_their_percent_escapes(template: str, raw: str, name: str) -> None:
    """Triton matches its routes on the undecoded URL: ``%2F`` is no separator there."""
    assert raw_model_name(template, raw) == name
