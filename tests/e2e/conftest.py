"""Fixtures two or more e2e modules share (the rest live in their modules).

- ``http_repo_server``: a server of ``tests.helpers.http_repo``'s repository with client
  shared memory allowed, one per module that asks for it (test_http.py, test_http_errors.py
  name it ``server``).
- ``hc`` / ``gc``: tritonclient HTTP and gRPC clients of the requesting module's ``server``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.http_repo import http_repository
from tests.helpers.server import ServerProcess, server_factory


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
