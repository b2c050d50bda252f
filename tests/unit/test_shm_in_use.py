"""A client region in use by a request cannot be unregistered (Triton 2.51's rule).

``SystemShmRegistry.hold`` / ``release`` count the requests that name a region;
``frontend.inference.region_ids`` and ``holding_sink`` are where a request takes and gives
back its regions. No server, no processes (the side-by-side run against 2.51 is
``tests/e2e/test_triton_shm_messages.py``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.inference import holding_sink
from triton_mp.frontend.shm.system import ClientShmApi, SystemShmRegistry
from triton_mp.ipc.protocol.messages import ErrorInfo, InferResponse, RequestFailed


@pytest.fixture
def key() -> Iterator[str]:
    key = f"/tmp_shm_in_use_{os.getpid()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 256)
    os.close(fd)
    yield key
    os.unlink(f"/dev/shm{key}")


def _registry(key: str, *names: str) -> SystemShmRegistry:
    registry = SystemShmRegistry(0)
    for n in names:
        registry.register(n, key, 0, 256)
    return registry


def _id(registry: SystemShmRegistry, name: str) -> int:
    return registry.status(name)[0].region_id


def test_a_region_held_by_a_request_stays_and_the_refusal_is_tritons(key: str) -> None:
    registry = _registry(key, "in", "out")
    held = (_id(registry, "in"), _id(registry, "out"))
    registry.hold(held)
    names, refusal = registry.unregister("out")
    assert names == []
    assert refusal is not None
    assert (refusal.code, refusal.message) == (
        ErrorCode.INTERNAL,
        "Cannot unregister shared memory region 'out', it is currently in use.",
    )
    assert registry.has("out")
    registry.release(held)
    assert registry.unregister("out") == (["out"], None)
    assert not registry.has("out")


def test_every_request_must_end_before_the_region_is_free(key: str) -> None:
    registry = _registry(key, "r")
    rid = _id(registry, "r")
    registry.hold((rid,))
    registry.hold((rid, rid))  # one request naming it for an input and an output
    registry.release((rid,))
    assert registry.in_use("r")
    registry.release((rid, rid))
    assert not registry.in_use("r")
    assert registry.unregister("r") == (["r"], None)


def test_unregister_all_removes_the_free_ones_and_names_the_others_sorted(key: str) -> None:
    registry = _registry(key, "zeta", "free", "alpha")
    registry.hold((_id(registry, "zeta"), _id(registry, "alpha")))
    names, refusal = registry.unregister("")
    assert names == ["free"]
    assert refusal is not None
    assert (refusal.code, refusal.message) == (
        ErrorCode.INTERNAL,
        "Failed to unregister the following system shared memory regions: alpha ,zeta ,",
    )
    assert [r.name for r in registry.status()] == ["zeta", "alpha"]


def test_a_new_registration_under_the_name_is_not_held_by_the_old_one(key: str) -> None:
    registry = _registry(key, "r")
    old = _id(registry, "r")
    registry.hold((old,))
    registry.drop(["r"])  # another frontend unregistered it (it saw no use)
    registry.register("r", key, 0, 256)
    assert not registry.in_use("r")
    registry.release((old,))


def test_the_api_tells_the_peers_what_went_and_raises_for_what_stays(key: str) -> None:
    registry = _registry(key, "busy", "idle")
    registry.hold((_id(registry, "busy"),))
    sent: list[bytes] = []
    api = ClientShmApi(registry, frontend_id=0, send_peers=sent.append)
    with pytest.raises(TritonMPError) as e:
        api.unregister("")
    assert e.value.code == ErrorCode.INTERNAL
    assert len(sent) == 1
    assert b"idle" in sent[0]
    assert b"busy" not in sent[0]
    with pytest.raises(TritonMPError):
        api.unregister("busy")
    assert len(sent) == 1


def _response(final: bool) -> InferResponse:
    return InferResponse(request_id=1, version=1, final=final)


@pytest.mark.parametrize(
    ("streaming", "answers", "releases"),
    [
        (False, [_response(True)], [1]),
        (False, [RequestFailed(request_id=1, error=ErrorInfo(ErrorCode.INTERNAL, "x", "w"))], [1]),
        (True, [_response(False), _response(False), _response(True)], [0, 0, 1]),
        (
            True,
            [
                _response(False),
                RequestFailed(request_id=1, error=ErrorInfo(ErrorCode.INTERNAL, "x", "w")),
            ],
            [0, 1],
        ),
    ],
)
def test_the_sink_releases_on_the_final_answer_before_handing_it_on(
    streaming: bool, answers: list[object], releases: list[int]
) -> None:
    count = [0]
    seen: list[tuple[object, int]] = []

    def release() -> None:
        count[0] += 1

    sink = holding_sink(lambda a: seen.append((a, count[0])), release, streaming)
    for a in answers:
        sink(a)  # type: ignore[arg-type]
    assert [n for _, n in seen] == list(itertools.accumulate(releases))


def test_a_key_without_its_slash_is_kept_as_given_and_opens_the_same_object(key: str) -> None:
    # NOTE: Triton's shared-memory manager keeps shm_key as registered and status echoes it;
    # glibc's shm_open strips the leading slashes, so both spellings name one object.
    registry = SystemShmRegistry(0)
    bare = registry.register("bare", key.lstrip("/"), 0, 256)
    slashed = registry.register("slashed", key, 0, 256)
    assert [r.key for r in registry.status("")] == [key.lstrip("/"), key]
    assert bare.object_name == slashed.object_name == key
    window = registry.window("bare", 0, 256)
    assert window.object_name == key


class Watch:
    """A native producer's ``RegionWatch``: counts each ``changing``; ``native_uses`` are the
    calls it sent that still hold a region."""

    def __init__(self) -> None:
        self.native_uses: dict[int, int] = {}
        self.changes = 0

    def changing(self) -> None:
        self.changes += 1

    def uses(self, region_id: int) -> int:
        return self.native_uses.get(region_id, 0)


def test_a_watch_is_told_before_every_change_and_its_uses_keep_a_region(key: str) -> None:
    """``SystemShmRegistry.watch``: register, unregister (one, all), a peer's add and drop
    tell it first; a region only the watch's calls use is in use, and refused in Triton's
    words, until the watch's uses end."""
    registry = SystemShmRegistry(0)
    watch = Watch()
    registry.watch = watch
    registry.register("in", key, 0, 256)
    registry.register("out", key, 0, 256)
    assert watch.changes == 2
    watch.native_uses[_id(registry, "in")] = 1
    assert registry.in_use("in")
    assert not registry.in_use("out")
    names, refusal = registry.unregister("in")
    assert watch.changes == 3
    assert names == []
    assert refusal is not None
    assert refusal.message == "Cannot unregister shared memory region 'in', it is currently in use."
    names, refusal = registry.unregister("")
    assert watch.changes == 4
    assert names == ["out"]
    assert refusal is not None
    assert (
        refusal.message == "Failed to unregister the following system shared memory regions: in ,"
    )
    watch.native_uses.clear()
    assert registry.unregister("in") == (["in"], None)
    region = registry.register("again", key, 0, 256)
    registry.drop(["again"])
    registry.add(region)
    assert watch.changes == 8
