"""Client shared-memory changes applied by every frontend before the call that made them returns.

Imported by ``frontend.shm.api`` (the calls) and ``frontend.main`` (the wiring). Triton is one
process: once SystemSharedMemoryRegister (or an unregister, or the CUDA twins) returns, every
connection sees the change. Here each frontend keeps its own copy of the regions, so the
frontend that takes the call sends the change to every other frontend, on its own ring to each
(``ipc.protocol.shm_messages``), numbered by an ``op``, and answers only once each live peer
has applied it and sent back ``ShmApplied``. A peer's answer to an unregister names the regions
a request it accepted still uses (it keeps them): the in-use rule of Triton 2.51 then holds
server-wide (``frontend.shm.api`` keeps such regions everywhere and answers Triton's error).

A peer that does not answer within ``APPLY_TIMEOUT_S`` (dead, or restarting:
``supervisor.processes.frontend_restart``) is *silent*: the call is answered without it, and
later calls do not wait for it until it answers one again. Its ring keeps the records: the
process restarted in its place reads them, and a frontend that serves resends it every region
it knows (``resend``) before it binds its ports. ``PeerRounds`` makes these decisions without a
loop or a process (unit-tested); ``ShmPeers`` sends, awaits and applies.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from triton_mp.frontend.shm.cuda import CudaRegion
from triton_mp.frontend.shm.system import Region, SystemShmRegistry
from triton_mp.ipc import encode
from triton_mp.ipc.protocol.shm_messages import (
    CudaShmRegion,
    ShmApplied,
    ShmRegion,
    ShmRegistered,
    ShmUnregistered,
)

log = logging.getLogger(__name__)

APPLY_TIMEOUT_S = 5.0
"""How long a call waits for a peer's ``ShmApplied`` before it answers without it (seconds)."""

ShmRecord = ShmRegistered | ShmUnregistered | ShmApplied
"""The inbox records ``ShmPeers.on_record`` takes."""


@dataclass(slots=True)
class _Round:
    waiting: set[int]
    """Peers whose ``ShmApplied`` has not come."""
    in_use: set[str] = field(default_factory=set)
    taken: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the peers answered to one change."""

    in_use: frozenset[str]
    """Of an unregister: regions some peer kept because a request of its own uses them."""
    taken: frozenset[str]
    """Of a register: names some peer holds under another registration (it kept its own)."""
    missing: frozenset[int]
    """Peers that did not answer in time (silent from now on)."""


class PeerRounds:
    """Which peers each change awaits, and what their answers say (no loop, no process).

    Args:
        peers: the other frontends' ids.
    """

    def __init__(self, peers: Iterable[int]) -> None:
        self._peers = frozenset(peers)
        self._ops = itertools.count(1)
        self._rounds: dict[int, _Round] = {}
        self.silent: set[int] = set()
        """Peers that let a change time out and have answered none since."""

    def start(self) -> tuple[int, bool]:
        """A new change: its ``op``, and whether it awaits any peer (the silent ones and a
        server of one frontend await none)."""
        op = next(self._ops)
        waiting = set(self._peers - self.silent)
        self._rounds[op] = _Round(waiting)
        return op, bool(waiting)

    def applied(
        self, peer: int, op: int, in_use: Iterable[str] = (), taken: Iterable[str] = ()
    ) -> bool:
        """``peer`` applied change ``op`` (it is not silent any more). Returns whether the
        change now awaits no peer; False also for a change already finished (an answer
        that came after its timeout, or a restarted peer's to its predecessor's record)."""
        self.silent.discard(peer)
        r = self._rounds.get(op)
        if r is None or peer not in r.waiting:
            return False
        r.waiting.discard(peer)
        r.in_use.update(in_use)
        r.taken.update(taken)
        return not r.waiting

    def finish(self, op: int) -> Outcome:
        """End change ``op``: what its peers answered; the ones that did not answer are
        silent from now on."""
        r = self._rounds.pop(op)
        self.silent |= r.waiting
        return Outcome(frozenset(r.in_use), frozenset(r.taken), frozenset(r.waiting))


def shared(r: Region) -> ShmRegion:
    """A system region as frontends share it."""
    return ShmRegion(r.name, r.key, r.offset, r.byte_size, r.region_id, r.registered_ns)


def shared_cuda(r: CudaRegion) -> CudaShmRegion:
    """A CUDA region as frontends share it."""
    return CudaShmRegion(
        r.name, r.raw_handle, r.device_id, r.byte_size, r.region_id, r.registered_ns
    )


class ShmPeers:
    """One frontend's end of the protocol (module docstring).

    Args:
        frontend_id: this frontend's id.
        registry: this frontend's regions (its ``cuda`` beside them).
        send_to: per other frontend's id, a push of encoded records to its ring.
        timeout_s: ``APPLY_TIMEOUT_S``.
    """

    def __init__(
        self,
        frontend_id: int,
        registry: SystemShmRegistry,
        send_to: Mapping[int, Callable[[bytes], None]],
        timeout_s: float = APPLY_TIMEOUT_S,
    ) -> None:
        self.frontend_id = frontend_id
        self.registry = registry
        self._send_to = dict(send_to)
        self._timeout_s = timeout_s
        self.rounds = PeerRounds(self._send_to)
        self._done: dict[int, asyncio.Future[None]] = {}

    async def change(self, record: Callable[[int], ShmRegistered | ShmUnregistered]) -> Outcome:
        """Send ``record(op)`` to every peer (silent ones too: their rings keep it) and wait
        until each live one applied it, or ``timeout_s``. Returns what they answered."""
        op, awaits = self.rounds.start()
        data = encode(record(op))
        for send in self._send_to.values():
            send(data)
        if awaits:
            done = asyncio.get_running_loop().create_future()
            self._done[op] = done
            try:
                await asyncio.wait_for(asyncio.shield(done), self._timeout_s)
            except TimeoutError:
                pass
            finally:
                self._done.pop(op, None)
        outcome = self.rounds.finish(op)
        for peer in sorted(outcome.missing):
            log.warning(
                "frontend %d did not apply a shared-memory change within %.1f s; answering "
                "without it (it applies the change when it serves again)",
                peer,
                self._timeout_s,
            )
        return outcome

    def on_record(self, msg: ShmRecord) -> None:
        """Apply a peer's change and answer it, or take a peer's answer (inbox, loop thread)."""
        if isinstance(msg, ShmApplied):
            if self.rounds.applied(msg.frontend_id, msg.op, msg.in_use, msg.taken):
                done = self._done.get(msg.op)
                if done is not None and not done.done():
                    done.set_result(None)
            return
        kept, taken = self._apply(msg)
        send = self._send_to.get(msg.frontend_id)
        if msg.op and send is not None:
            answer = ShmApplied(
                frontend_id=self.frontend_id, op=msg.op, in_use=tuple(kept), taken=tuple(taken)
            )
            send(encode(answer))

    def _apply(self, msg: ShmRegistered | ShmUnregistered) -> tuple[list[str], list[str]]:
        """Apply a peer's change here. Returns the names kept in use (an unregister's) and the
        names held under another registration (a register's)."""
        registry, cuda = self.registry, self.registry.cuda
        if isinstance(msg, ShmRegistered):
            regions = [
                Region(r.name, r.key, r.offset, r.byte_size, r.region_id, r.registered_ns)
                for r in msg.regions
            ]
            cudas = [
                CudaRegion(
                    c.name, c.raw_handle, c.device_id, c.byte_size, c.region_id, c.registered_ns
                )
                for c in msg.cuda
            ]
            if not msg.op:  # NOTE: a resend to this restarted frontend: as it is
                registry.add(regions)
                if cuda is not None:
                    cuda.add(cudas)
                return [], []
            taken = registry.adopt(regions)
            if cuda is not None:
                taken += cuda.adopt(cudas)
            return [], taken
        if msg.region_ids:  # NOTE: a register taken back
            ids = msg.region_ids
            registry.take_back(msg.names, ids[: len(msg.names)])
            if cuda is not None:
                cuda.take_back(msg.cuda_names, ids[len(msg.names) :])
            return [], []
        kept = registry.drop(msg.names)
        if cuda is not None:
            cuda.drop(msg.cuda_names)
        return kept, []

    def resend(self, peer: int) -> None:
        """Send every region this frontend knows to ``peer`` (a frontend restarted in a dead
        one's place: ``ModelTableUpdate.resend_shm_to``); it answers nothing."""
        send = self._send_to.get(peer)
        cuda = self.registry.cuda
        regions = tuple(shared(r) for r in self.registry.regions())
        cudas = () if cuda is None else tuple(shared_cuda(c) for c in cuda.regions())
        if send is not None and (regions or cudas):
            send(encode(ShmRegistered(frontend_id=self.frontend_id, regions=regions, cuda=cudas)))
