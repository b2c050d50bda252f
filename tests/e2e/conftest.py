"""Fixtures two or more e2e modules share (the rest live in their modules).

- ``http_repo_server``: a server of ``tests.helpers.http_repo``'s repository with client
  shared memory allowed, one per module that asks for it (test_http.py, test_http_errors.py
  name it ``server``).
- ``hc`` / ``gc``: tritonclient HTTP and gRPC clients of the requesting module's ``server``.
- ``container_image_build``: test_container.py's image, built from the session's first e2e
  test on while the other tests run (tests/conftest.py runs test_container.py last).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.deploy.container import ImageBuild
from tests.helpers.http_repo import http_repository
from tests.helpers.server import ServerProcess, server_factory

CONTAINER_TESTS = "test_container.py"


@pytest.fixture(scope="session", autouse=True)
def container_image_build(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ImageBuild | None]:
    """The container image's build (``tests.deploy.container.ImageBuild``), started when
    the session runs a test of test_container.py (the build takes about 45 s of a quiet
    2-core machine, most of it compiling the native extension); stopped and removed at the
    session's end. None when the session runs none."""
    if not any(item.path.name == CONTAINER_TESTS for item in request.session.items):
        yield None
        return
    build = ImageBuild(tmp_path_factory.mktemp("podman"))
    try:
        yield build
    finally:
        build.close()


@pytest.fixture(scope="module")
def http_repo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = http_repository(tmp_path_factory.mktemp("repo"))
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo, "--allow-client-shm=true")


@pytest.fixture
def hc(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


@pytest.fixture
def gc(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = server.client()
    yield c
    c.close()
