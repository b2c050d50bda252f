"""A client region in use by a request cannot be unregistered (Triton 2.51's rule).

``SystemShmRegistry.hold`` / ``release`` count the requests that name a region;
``frontend.inference.region_ids`` and ``holding_sink`` are where a request takes and gives
back its regions; ``unregister_refusal`` words Triton's answer (the other frontends' uses
join this frontend's in ``frontend.shm.api``: tests/unit/test_shm_peers.py). No server, no
processes (the side-by-side run against 2.51 is
``tests/e2e/test_triton_shm_messages.py``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from triton_mp.common.errors import ErrorCode
from triton_mp.frontend.inference import holding_sink
from triton_mp.frontend.shm.system import SystemShmRegistry, unregister_refusal
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
    removed, kept = registry.unregister("out")
    assert (removed, kept) == ([], ["out"])
    refusal = unregister_refusal("out", kept)
    assert refusal is not None
    assert (refusal.code, refusal.message) == (
        ErrorCode.INTERNAL,
        "Cannot unregister shared memory region 'out', it is currently in use.",
    )
    assert registry.has("out")
    registry.release(held)
    removed, kept = registry.unregister("out")
    assert ([r.name for r in removed], kept) == (["out"], [])
    assert unregister_refusal("out", kept) is None
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
    removed, kept = registry.unregister("r")
    assert ([r.name for r in removed], kept) == (["r"], [])


def test_unregister_all_removes_the_free_ones_and_names_the_others_sorted(key: str) -> None:
    registry = _registry(key, "zeta", "free", "alpha")
    registry.hold((_id(registry, "zeta"), _id(registry, "alpha")))
    removed, kept = registry.unregister("")
    assert [r.name for r in removed] == ["free"]
    refusal = unregister_refusal("", kept)
    assert refusal is not None
    assert (refusal.code, refusal.message) == (
        ErrorCode.INTERNAL,
        "Failed to unregister the following system shared memory regions: alpha ,zeta ,",
    )
    assert [r.name for r in registry.status()] == ["zeta", "alpha"]


def test_a_peers_unregister_keeps_what_a_request_here_holds(key: str) -> None:
    registry = _registry(key, "r", "free")
    old = _id(registry, "r")
    registry.hold((old,))
    assert registry.drop(["r", "free"]) == ["r"]  # another frontend's unregister
    assert registry.has("r")
    assert not registry.has("free")
    registry.release((old,))
    assert registry.drop(["r"]) == []
    assert not registry.has("r")


def test_a_new_registration_under_the_name_is_not_held_by_the_old_one(key: str) -> None:
    registry = _registry(key, "r")
    old = _id(registry, "r")
    registry.hold((old,))
    registry.release((old,))
    registry.hold((old,))  # a request of the old registration, still unanswered
    registry.unregister("r")
    assert registry.has("r")
    registry.release((old,))
    registry.unregister("r")
    registry.register("r", key, 0, 256)
    assert _id(registry, "r") != old
    registry.hold((old,))
    assert not registry.in_use("r")
    registry.release((old,))


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
    removed, kept = registry.unregister("in")
    assert watch.changes == 3
    assert (removed, kept) == ([], ["in"])
    removed, kept = registry.unregister("")
    assert watch.changes == 4
    assert ([r.name for r in removed], kept) == (["out"], ["in"])
    watch.native_uses.clear()
    removed, kept = registry.unregister("in")
    assert ([r.name for r in removed], kept) == (["in"], [])
    region = registry.register("again", key, 0, 256)
    registry.drop(["again"])
    registry.add([region])
    assert watch.changes == 8
