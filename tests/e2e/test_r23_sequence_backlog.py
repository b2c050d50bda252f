"""A sequence request waiting for a free slot (the sequence batcher's backlog) that its client
gives up on, side by side with the real Triton 2.51: the server goes on serving the live
sequence and takes new ones (r23, session 18: the cancel left an empty backlog entry and
the scheduler died reading it; ``SequencePolicy.cancel``)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repo_control import config_pbtxt, seq_sum_config, seq_sum_source
from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, side_by_side

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

Server = ServerProcess | RealTriton

ONE_SLOT = {
    **seq_sum_config(),
    "max_batch_size": 1,
    "sequence_batching": {
        **seq_sum_config()["sequence_batching"],
        "oldest": None,
        "direct": {},
    },
}
ONE_SLOT["sequence_batching"] = {
    k: v for k, v in ONE_SLOT["sequence_batching"].items() if v is not None
}
"""seq_sum with one instance and max_batch_size 1 (Direct): one sequence slot."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    repo = tmp_path_factory.mktemp("backlog") / "repo"
    write_python_model(repo, "seq_one", config_pbtxt(ONE_SLOT), seq_sum_source())
    with side_by_side(repo, tmp_path_factory.mktemp("logs")) as found:
        yield found


def _seq(server: Server, seq: int, value: int, timeout_s: float = 30, **flags: object) -> str:
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[value]], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        try:
            r = c.infer("seq_one", [t], sequence_id=seq, client_timeout=timeout_s, **flags)  # type: ignore[arg-type]
        except InferenceServerException as e:
            return str(e.status())
    return str(r.as_numpy("OUTPUT0").tolist())


def test_a_backlogged_start_given_up_by_its_client_loses_nothing_else(
    servers: dict[str, Server],
) -> None:
    for name, server in sorted(servers.items()):  # Triton first: its half passes
        assert _seq(server, 100, 1, sequence_start=True) == "[[1]]", name
        # NOTE: the one slot is sequence 100's: 200 waits in the backlog until its deadline
        got = _seq(server, 200, 5, timeout_s=1.5, sequence_start=True)
        assert got == "StatusCode.DEADLINE_EXCEEDED", (name, got)
        assert _seq(server, 100, 2) == "[[3]]", name
        assert _seq(server, 100, 3, sequence_end=True) == "[[6]]", name
        assert _seq(server, 300, 7, sequence_start=True, sequence_end=True) == "[[7]]", name
        if isinstance(server, ServerProcess):
            assert server.proc.poll() is None, name
