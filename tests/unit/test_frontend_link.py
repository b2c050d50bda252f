"""The supervisor's control pipes to the frontends (``supervisor.processes.frontend_link``): each
frontend gets its own model table update, and an acknowledged update waits for each."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection

import pytest

from triton_mp.ipc.protocol.control_messages import ModelTableUpdate, TableAck
from triton_mp.ipc.recordio.codec import Decoder, encode
from triton_mp.supervisor.processes.frontend_link import FrontendLink


@pytest.fixture
def pipes() -> Iterator[tuple[FrontendLink, dict[int, Connection]]]:
    """A link to two frontends; yields it and the frontends' ends of the pipes. The link's
    reader threads close their own ends (``frontend_link``'s docstring): the test closes
    the frontends' ends, which ends each reader, and waits for them."""
    ends = {i: Pipe() for i in (0, 1)}
    link = FrontendLink(lambda: False)
    readers = link.attach({i: ours for i, (ours, _) in ends.items()}, lambda fid, call: None)
    try:
        yield link, {i: theirs for i, (_, theirs) in ends.items()}
    finally:
        link.close()
        for _, theirs in ends.values():
            theirs.close()
        for t in readers:
            t.join(timeout=5)
            assert not t.is_alive()


def _received(conn: Connection) -> ModelTableUpdate:
    assert conn.poll(5)
    msg = Decoder(ModelTableUpdate).decode(conn.recv_bytes())
    assert isinstance(msg, ModelTableUpdate)
    return msg


def test_each_frontend_gets_only_its_own_rings(
    pipes: tuple[FrontendLink, dict[int, Connection]],
) -> None:
    link, fe = pipes
    link.update_each(
        {0: ModelTableUpdate(add_rings=("w7_f0",)), 1: ModelTableUpdate(add_rings=("w7_f1",))},
        ack=False,
    )
    assert _received(fe[0]).add_rings == ("w7_f0",)
    assert _received(fe[1]).add_rings == ("w7_f1",)


def test_an_acknowledged_update_waits_for_every_frontend_it_went_to(
    pipes: tuple[FrontendLink, dict[int, Connection]],
) -> None:
    link, fe = pipes
    done = threading.Event()

    def send() -> None:
        link.update_each({0: ModelTableUpdate(), 1: ModelTableUpdate(add_rings=("r",))}, True)
        done.set()

    sender = threading.Thread(target=send)
    sender.start()
    try:
        first, second = _received(fe[0]), _received(fe[1])
        assert first.seq == second.seq > 0  # one update, one sequence number
        fe[0].send_bytes(encode(TableAck(seq=first.seq)))
        assert not done.wait(0.3)  # frontend 1 has not applied its part yet
        fe[1].send_bytes(encode(TableAck(seq=second.seq)))
        assert done.wait(5)
    finally:
        sender.join(timeout=10)


def test_update_sends_the_same_update_to_every_frontend(
    pipes: tuple[FrontendLink, dict[int, Connection]],
) -> None:
    link, fe = pipes
    link.update(ModelTableUpdate(remove_routes=(3,)), ack=False)
    assert _received(fe[0]).remove_routes == _received(fe[1]).remove_routes == (3,)


def test_a_dead_frontend_is_not_waited_for_and_its_successor_gets_updates(
    pipes: tuple[FrontendLink, dict[int, Connection]],
) -> None:
    link, fe = pipes
    done = threading.Event()

    def send() -> None:
        link.update_each({0: ModelTableUpdate(), 1: ModelTableUpdate()}, True)
        done.set()

    sender = threading.Thread(target=send)
    sender.start()
    try:
        first = _received(fe[0])
        _received(fe[1])
        fe[0].send_bytes(encode(TableAck(seq=first.seq)))
        assert not done.wait(0.3)  # frontend 1 has not acknowledged
        link.detach(1)  # it died: the update stops waiting for it, long before ACK_TIMEOUT_S
        assert done.wait(5)
    finally:
        sender.join(timeout=10)
    assert link.attached() == {0}
    link.update(ModelTableUpdate(remove_routes=(4,)), ack=False)
    with pytest.raises(EOFError):
        fe[1].recv_bytes()  # nothing goes to the dead one's pipe: it only sees the shutdown
    ours, theirs = Pipe()
    reader = link.attach_one(1, ours)  # the process restarted in its place
    try:
        link.update(ModelTableUpdate(remove_routes=(5,)), ack=False)
        assert _received(theirs).remove_routes == (5,)
        assert _received(fe[0]).remove_routes == (4,)
    finally:
        theirs.close()
        reader.join(timeout=5)
    assert not reader.is_alive()


def test_detach_ends_the_reader_without_closing_its_descriptor_under_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A detached frontend's reader ends (EOF from the shutdown) and closes the pipe itself,
    never another thread under it; a pipe opened afterwards, which may reuse the descriptor
    number, loses no byte to it."""
    closers: list[str] = []
    close = Connection.close

    def recorded_close(conn: Connection) -> None:
        closers.append(threading.current_thread().name)
        close(conn)

    monkeypatch.setattr(Connection, "close", recorded_close)
    ours, theirs = Pipe()
    link = FrontendLink(lambda: False)
    (reader,) = link.attach({0: ours}, lambda fid, call: None)
    link.detach(0)
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert ours.closed
    assert closers == [reader.name]
    with pytest.raises(EOFError):
        theirs.recv_bytes()  # the frontend's side sees the shutdown as EOF, nothing else
    theirs.close()
    ours2, theirs2 = Pipe()
    reader2 = link.attach_one(0, ours2)
    try:
        theirs2.send_bytes(encode(TableAck(seq=1)))
        link.update_each({0: ModelTableUpdate()}, ack=False)
        assert _received(theirs2) == ModelTableUpdate()
    finally:
        theirs2.close()
        reader2.join(timeout=5)
    assert not reader2.is_alive()
