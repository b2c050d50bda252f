"""Client shared-memory changes every frontend applies before the call returns.

``frontend.shm.peers.PeerRounds`` decides which peers a change awaits and what their answers
say; ``ShmPeers`` and ``frontend.shm.api.ClientShmApi`` run the protocol. Here three frontends
live in one event loop: each one's records to another are encoded, decoded as the inbox
decodes them, and applied on a later turn of the loop (as a peer's inbox would), or never, for
a frontend that is down. No server, no processes (the e2e twin with tritonclient is
tests/e2e/test_shm_across_frontends.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.shm.api import ClientShmApi
from triton_mp.frontend.shm.cuda import CUDA_IPC_HANDLE_BYTES, CudaShmRegistry
from triton_mp.frontend.shm.peers import Outcome, PeerRounds, ShmPeers
from triton_mp.frontend.shm.system import DISABLED_MESSAGE, SystemShmRegistry
from triton_mp.ipc.protocol.messages import ToFrontend
from triton_mp.ipc.recordio.codec import Decoder

# ----------------------------------------------------------------- the decisions


def test_a_change_awaits_every_peer_and_gathers_what_they_keep() -> None:
    rounds = PeerRounds([1, 2])
    op, awaits = rounds.start()
    assert awaits
    assert not rounds.applied(1, op, ["a"])
    assert not rounds.applied(1, op, ["b"])  # NOTE: a second answer counts once
    assert rounds.applied(2, op, ["c"], ["t"])
    assert rounds.finish(op) == Outcome(frozenset({"a", "c"}), frozenset({"t"}), frozenset())


def test_a_server_of_one_frontend_awaits_nothing() -> None:
    rounds = PeerRounds([])
    op, awaits = rounds.start()
    assert not awaits
    assert rounds.finish(op) == Outcome(frozenset(), frozenset(), frozenset())


def test_a_peer_that_times_out_is_not_awaited_until_it_answers_again() -> None:
    rounds = PeerRounds([1, 2])
    first, _ = rounds.start()
    rounds.applied(1, first, [])
    assert rounds.finish(first).missing == {2}
    assert rounds.silent == {2}
    second, _ = rounds.start()
    assert rounds.applied(1, second, []), "the silent peer is not awaited"
    rounds.finish(second)
    # NOTE: the restarted process reads the record its predecessor left and answers it late.
    assert not rounds.applied(2, first, [])
    assert rounds.silent == set()
    third, _ = rounds.start()
    assert not rounds.applied(1, third, [])
    assert rounds.applied(2, third, [])


def test_only_peers_awaited_count() -> None:
    rounds = PeerRounds([1])
    op, _ = rounds.start()
    assert not rounds.applied(7, op, ["x"])
    assert rounds.applied(1, op, [])
    assert rounds.finish(op) == Outcome(frozenset(), frozenset(), frozenset())


# ----------------------------------------------------------------- three frontends

_decode = Decoder(ToFrontend).decode


@pytest.fixture
def key() -> Iterator[str]:
    key = f"/tmp_shm_peers_{os.getpid()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)
    yield key
    os.unlink(f"/dev/shm{key}")


@dataclass
class Server:
    """Frontends 0..n-1 in one loop; ``down`` ones keep their records unapplied."""

    n: int
    timeout_s: float = 5.0
    down: set[int] = field(default_factory=set)
    peers: list[ShmPeers] = field(default_factory=list)
    apis: list[ClientShmApi] = field(default_factory=list)
    held: dict[int, list[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i in range(self.n):
            registry = SystemShmRegistry(i)
            registry.cuda = CudaShmRegistry(
                (0,),
                enabled=True,
                taken=registry.has,
                disabled_message=DISABLED_MESSAGE,
                frontend_id=i,
            )
            sends = {j: self._sender(j) for j in range(self.n) if j != i}
            self.peers.append(ShmPeers(i, registry, sends, self.timeout_s))
            self.apis.append(ClientShmApi(self.peers[i]))

    def _sender(self, to: int):  # type: ignore[no-untyped-def]
        def send(data: bytes) -> None:
            if to in self.down:
                self.held.setdefault(to, []).append(data)
                return
            asyncio.get_running_loop().call_soon(self.peers[to].on_record, _decode(data))

        return send

    def up(self, i: int) -> None:
        """Frontend ``i`` serves again: it reads what its ring kept, in order."""
        self.down.discard(i)
        for data in self.held.pop(i, []):
            self.peers[i].on_record(_decode(data))

    def registry(self, i: int) -> SystemShmRegistry:
        return self.peers[i].registry

    def names(self, i: int) -> list[str]:
        return sorted(r.name for r in self.registry(i).regions())


def test_a_registration_is_on_every_frontend_when_the_call_returns(key: str) -> None:
    async def body() -> None:
        s = Server(3)
        await s.apis[0].register("r", key, 0, 4096)
        # NOTE: no turn of the loop since: the call itself awaited the peers.
        assert [s.names(i) for i in range(3)] == [["r"], ["r"], ["r"]]
        assert {s.registry(i).status("r")[0].region_id for i in range(3)} == {
            s.registry(0).status("r")[0].region_id
        }
        await s.apis[2].unregister("r")
        assert [s.names(i) for i in range(3)] == [[], [], []]

    asyncio.run(body())


def test_unregister_of_a_region_another_frontend_uses_fails_and_keeps_it_everywhere(
    key: str,
) -> None:
    async def body() -> None:
        s = Server(3)
        await s.apis[0].register("r", key, 0, 4096)
        rid = s.registry(1).status("r")[0].region_id
        s.registry(1).hold((rid,))  # a request frontend 1 accepted
        with pytest.raises(TritonMPError) as e:
            await s.apis[0].unregister("r")
        assert (e.value.code, e.value.message) == (
            ErrorCode.INTERNAL,
            "Cannot unregister shared memory region 'r', it is currently in use.",
        )
        assert [s.registry(i).status("r")[0].region_id for i in range(3)] == [rid] * 3
        s.registry(1).release((rid,))
        await s.apis[2].unregister("r")
        assert [s.names(i) for i in range(3)] == [[], [], []]

    asyncio.run(body())


def test_unregister_all_drops_the_free_ones_and_names_every_frontends_used_ones(
    key: str,
) -> None:
    async def body() -> None:
        s = Server(3)
        for name in ("zeta", "free", "alpha", "beta"):
            await s.apis[1].register(name, key, 0, 4096)
        s.registry(0).hold((s.registry(0).status("zeta")[0].region_id,))
        s.registry(2).hold((s.registry(2).status("alpha")[0].region_id,))
        s.registry(1).hold((s.registry(1).status("beta")[0].region_id,))
        with pytest.raises(TritonMPError) as e:
            await s.apis[0].unregister("")
        assert (e.value.code, e.value.message) == (
            ErrorCode.INTERNAL,
            "Failed to unregister the following system shared memory regions: alpha ,beta ,zeta ,",
        )
        assert [s.names(i) for i in range(3)] == [["alpha", "beta", "zeta"]] * 3

    asyncio.run(body())


def test_cuda_registrations_reach_every_frontend(key: str) -> None:
    async def body() -> None:
        s = Server(2)
        await s.apis[1].cuda_register("g", b"\1" * CUDA_IPC_HANDLE_BYTES, 0, 1024)
        assert [r.name for r in s.apis[0].cuda_status("")] == ["g"]
        with pytest.raises(TritonMPError) as e:
            await s.apis[0].register("g", key, 0, 4096)
        assert e.value.code == ErrorCode.ALREADY_EXISTS
        await s.apis[0].cuda_unregister("")
        assert s.apis[1].cuda_status("") == []

    asyncio.run(body())


def test_a_frontend_that_is_down_delays_a_call_once_and_catches_up_when_it_serves(
    key: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        s = Server(3, timeout_s=0.05, down={2})
        with caplog.at_level(logging.WARNING):
            await s.apis[0].register("a", key, 0, 4096)
        assert "frontend 2 did not apply a shared-memory change" in caplog.text
        assert s.names(1) == ["a"]
        assert s.names(2) == []
        assert s.peers[0].rounds.silent == {2}
        await s.apis[0].register("b", key, 0, 4096)  # NOTE: awaits frontend 1 only
        await s.apis[1].unregister("a")
        s.up(2)
        assert s.names(2) == ["b"]
        await asyncio.sleep(0)  # NOTE: its late answers reach 0 and 1
        assert s.peers[0].rounds.silent == set()
        assert s.peers[1].rounds.silent == set()

    asyncio.run(body())


def test_a_restarted_frontend_is_sent_every_region_and_answers_nothing(key: str) -> None:
    async def body() -> None:
        s = Server(2)
        await s.apis[0].register("sys", key, 0, 4096)
        await s.apis[0].cuda_register("gpu", b"\2" * CUDA_IPC_HANDLE_BYTES, 0, 512)
        out: list[bytes] = []
        s.peers[0]._send_to[1] = out.append
        s.peers[0].resend(1)
        (record,) = out
        answers: list[bytes] = []
        fresh = Server(2).peers[1]
        fresh._send_to[0] = answers.append
        fresh.on_record(_decode(record))
        assert [r.name for r in fresh.registry.regions()] == ["sys"]
        assert fresh.registry.cuda is not None
        assert [r.name for r in fresh.registry.cuda.regions()] == ["gpu"]
        assert answers == []

    asyncio.run(body())


ALREADY = (ErrorCode.ALREADY_EXISTS, "shared memory region 'x' already in manager")


def _race(
    n: int, cuda: bool, key: str, first: int, later_first: bool = False
) -> tuple[list[object], list[list[object]]]:
    """Frontends 0 and 1 of ``n`` register "x" at once (``first`` is accepted first): what
    each call returned, and every frontend's table (names and region ids, system then CUDA).
    ``later_first``: every other frontend hears of the later register before the earlier."""

    async def body() -> tuple[list[object], list[list[object]]]:
        s = Server(n)
        others = set(range(2, n))
        s.down |= others

        async def register(i: int) -> None:
            if cuda:
                await s.apis[i].cuda_register("x", bytes([i]) * CUDA_IPC_HANDLE_BYTES, 0, 64)
            else:
                await s.apis[i].register("x", key, 0, 4096)

        calls = [asyncio.ensure_future(register(i)) for i in (first, 1 - first)]
        await asyncio.sleep(0.01)  # NOTE: both are accepted, both await their peers
        for i in sorted(others):
            if later_first:
                s.held[i].reverse()
            s.up(i)
        got = list(await asyncio.gather(*calls, return_exceptions=True))
        if first:
            got.reverse()
        tables = [
            sorted((r.name, r.region_id) for r in s.registry(i).regions())
            + sorted((r.name, r.region_id) for r in s.apis[i].cuda_status(""))
            for i in range(n)
        ]
        return [None if e is None else (e.code, e.message) for e in got], tables  # type: ignore[union-attr]

    return asyncio.run(body())


@pytest.mark.parametrize("first", [0, 1])
@pytest.mark.parametrize("cuda", [False, True])
def test_one_name_registered_through_two_frontends_at_once_lets_exactly_one_through(
    key: str, cuda: bool, first: int
) -> None:
    """Triton serializes two registers of one name: one succeeds, the other finds it taken.
    The register accepted first succeeds everywhere and the other answers ALREADY_EXISTS."""
    got, tables = _race(2, cuda, key, first)
    assert got == ([None, ALREADY] if first == 0 else [ALREADY, None])
    assert tables[0] == tables[1] == [("x", 256 + first)], tables


@pytest.mark.parametrize("later_first", [False, True])
@pytest.mark.parametrize("first", [0, 1])
@pytest.mark.parametrize("cuda", [False, True])
def test_with_four_frontends_exactly_one_gets_through_and_the_tables_agree(
    key: str, cuda: bool, first: int, later_first: bool
) -> None:
    """The frontends that register neither name pick the same winner in whatever order the
    two registers reach them (``later_first``: the loser's first), so exactly one call
    succeeds, as in Triton, and every frontend ends with the winner's registration."""
    got, tables = _race(4, cuda, key, first, later_first)
    assert got == ([None, ALREADY] if first == 0 else [ALREADY, None])
    assert tables[0] == tables[1] == tables[2] == tables[3] == [("x", 256 + first)], tables
