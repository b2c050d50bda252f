"""Several gRPC frontend processes share one port (SO_REUSEPORT) and one scheduler."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import copy_models
from tests.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CLIENTS = 16


def test_two_frontends_share_the_port_and_both_serve(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    repo = copy_models(tmp_path / "repo", "add_sub")
    server = start_server(repo, "--frontend-processes", "2", "--log-verbose", "1")
    # NOTE: each client is its own TCP connection; the kernel spreads connections over the
    # listening frontends. Under load the second frontend may start listening after the
    # server is live, so keep opening connections until both served (or 200 tried).
    frontends: set[str] = set()
    for k in range(200):
        client = server.client()
        a = np.full((1, 16), k, np.float32)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            i = grpcclient.InferInput(name, [1, 16], "FP32")
            i.set_data_from_numpy(a)
            inputs.append(i)
        res = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + a)
        client.close()
        if k >= CLIENTS - 1:
            frontends = set(re.findall(r"accepted for 'add_sub'.*instance=(\d+)", server.log()))
            if frontends == {"0", "1"}:
                break
    assert frontends == {"0", "1"}
