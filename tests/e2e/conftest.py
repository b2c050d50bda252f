"""Fixtures two or more e2e modules share (the rest live in their modules).

- ``http_repo_server``: a server of ``tests.helpers.http_repo``'s repository with client
  shared memory allowed, one per module that asks for it (test_http.py, test_http_errors.py
  name it ``server``).
- ``hc`` / ``gc``: tritonclient HTTP and gRPC clients of the requesting module's ``server``.
- ``container_image_build``: test_container.py's image, built from the session's first e2e
  test on while the other tests run (tests/conftest.py runs test_container.py last).
- ``shared_side_by_side``: one triton-mp and one real Triton 2.51 for the whole session,
  serving every model the session's modules list in ``SIDE_BY_SIDE_MODELS``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.deploy.container import ImageBuild
from tests.helpers.http_repo import http_repository
from tests.helpers.server import ServerProcess, server_factory
from tests.helpers.triton_peer import Ensemble, Models, PythonModel, RealTriton, serve_models

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


SHARED_MODELS = "SIDE_BY_SIDE_MODELS"
"""A test module's ``Models`` that ``shared_side_by_side`` serves (names unique in the session,
or the same model)."""


SHARED_FLAGS = (
    "--model-control-mode=explicit",
    "--load-model=*",
    "--cache-config=local,size=1048576",
)
"""Both servers of ``shared_side_by_side``: every model loaded, explicit model control (a
module may unload a model of its own), a 1 MiB local response cache (for the models that
enable it in their config)."""


def _shared_models(modules: list[ModuleType]) -> Models:
    """Every model the ``modules`` list in ``SHARED_MODELS``.

    Raises:
        ValueError: two modules give one name to different models.
    """
    models: dict[str, PythonModel | Ensemble | Path] = {}
    for module in modules:
        listed: Models = getattr(module, SHARED_MODELS, {})
        for name, model in listed.items():
            if models.setdefault(name, model) != model:
                raise ValueError(f"{module.__name__} redefines side-by-side model {name!r}")
    return models


_SHARED = "shared_side_by_side"


@pytest.fixture(scope="session")
def shared_side_by_side(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess | RealTriton]]:
    """``triton-mp`` always, ``triton`` when the real Triton 2.51 is installed, with
    ``SHARED_FLAGS`` (and ours with client shared memory on, as 2.51's default), serving the
    models of every module of the session that lists them in ``SIDE_BY_SIDE_MODELS``: one
    pair started for all (each pair's start and stop is 5-15 s of a 2-core machine), kept
    until the last test that uses it is torn down (``pytest_runtest_teardown``).

    A module shares it when its tests ask each model only about itself (its answers, its
    statistics, its metric series, unloading a model of its own): a module that reloads,
    restarts or stops a server, needs other flags, or counts the whole server starts its own
    (``serve_models``)."""
    modules = {id(i.module): i.module for i in request.session.items if i.module is not None}
    models = _shared_models(list(modules.values()))
    with ExitStack() as pair:
        found = pair.enter_context(
            serve_models(
                models,
                tmp_path_factory.mktemp("side_by_side"),
                *SHARED_FLAGS,
                ours_only=("--allow-client-shm=true",),
                with_cache=True,
            )
        )
        users = [i for i in request.session.items if _SHARED in getattr(i, "fixturenames", ())]
        _SHARED_PAIR[users[-1].nodeid] = pair
        try:
            yield found
        finally:
            _SHARED_PAIR.clear()


_SHARED_PAIR: dict[str, ExitStack] = {}
"""The running ``shared_side_by_side`` pair's stop, by the node id of the session's last test
that uses it (at most one)."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Stop the shared pair as soon as the last test that uses it is torn down, not at the
    session's end: its ~90 processes and ~3,200 shared-memory objects stay out of the tests
    after it (every unit test, and the e2e files after test_s12_ensemble_step_order)."""
    yield
    pair = _SHARED_PAIR.pop(item.nodeid, None)
    if pair is not None:
        pair.close()


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
