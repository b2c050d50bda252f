"""The response cache's key, entry format and submit-path step (``frontend.cache.response``),
and its flags (``cli.serving_flags``): no processes, a dict for a store."""

from __future__ import annotations

import argparse

import pytest

from triton_mp.cli.main import parse_flags
from triton_mp.cli.serving_flags import (
    cache_and_rate_limit,
    parse_cache_setting,
    parse_rate_limit_resource,
)
from triton_mp.common.errors import TritonMPError
from triton_mp.frontend.cache.response import (
    BlobSegments,
    decode_entry,
    encode_entry,
    request_key,
)
from triton_mp.frontend.validation.inputs import ValidInput
from triton_mp.ipc import TensorRef


def _in(name: str, data: bytes, shape: tuple[int, ...] = (2,), dt: str = "FP32") -> ValidInput:
    return ValidInput(name, dt, shape, data)


def test_the_key_covers_model_version_names_and_bytes_in_name_order() -> None:
    a, b = _in("A", b"\1" * 8), _in("B", b"\2" * 8)
    base = request_key("m", 1, [a, b])
    assert request_key("m", 1, [b, a]) == base, "inputs are hashed in name order"
    assert len(base) == 16
    assert request_key("m", 2, [a, b]) != base
    assert request_key("n", 1, [a, b]) != base
    assert request_key("m", 1, [a, _in("B", b"\2" * 7 + b"\3")]) != base
    assert request_key("m", 1, [a, _in("C", b"\2" * 8)]) != base
    # Same bytes, other shape or datatype: another entry (Triton's key would mix them up).
    assert request_key("m", 1, [a, _in("B", b"\2" * 8, (1, 2))]) != base
    assert request_key("m", 1, [a, _in("B", b"\2" * 8, dt="INT32")]) != base


def test_name_and_bytes_boundaries_do_not_collide() -> None:
    assert request_key("m", 1, [_in("AB", b"C")]) != request_key("m", 1, [_in("A", b"BC")])


def test_an_entry_round_trips_and_its_refs_point_into_the_blob() -> None:
    out0 = TensorRef("OUT0", "FP32", (2,), "/w", 64, 8)
    out1 = TensorRef("OUT1", "BYTES", (1,), "/w", 128, 7)
    blob = encode_entry([(out0, b"\1" * 8), (out1, b"\3\0\0\0abc")])
    refs = decode_entry(blob)
    assert [(r.name, r.datatype, r.shape) for r in refs] == [
        ("OUT0", "FP32", (2,)),
        ("OUT1", "BYTES", (1,)),
    ]
    seg = BlobSegments(blob).get("")
    assert seg.buf[refs[0].offset : refs[0].offset + refs[0].nbytes] == b"\1" * 8
    assert seg.buf[refs[1].offset : refs[1].offset + refs[1].nbytes] == b"\3\0\0\0abc"


def _args(*argv: str) -> argparse.Namespace:
    return argparse.Namespace(**parse_flags(list(argv)).values)


def test_cache_flags_follow_tritonserver() -> None:
    got = cache_and_rate_limit(_args("--cache-config", "local,size=1048576"))
    assert got["cache"] == {"kind": "local", "settings": {"size": "1048576"}}
    got = cache_and_rate_limit(
        _args("--cache-config", "redis,host=h", "--cache-config", "redis,port=6379")
    )
    assert got["cache"] == {"kind": "redis", "settings": {"host": "h", "port": "6379"}}
    assert cache_and_rate_limit(_args())["cache"] is None


def test_the_deprecated_byte_size_is_the_local_cache(capsys: pytest.CaptureFixture[str]) -> None:
    got = cache_and_rate_limit(_args("--response-cache-byte-size", "4096"))
    assert got["cache"] == {"kind": "local", "settings": {"size": "4096"}}
    assert "'--cache-config=local,size=4096'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("--response-cache-byte-size", "1", "--cache-config", "local,size=1"),
            "Error: Incompatible flags --response-cache-byte-size and --cache-config both "
            "provided. Please provide one or the other.",
        ),
        (
            ("--cache-config", "local,port=1"),
            "Failed to initialize LocalCache: config didn't contain a valid 'size' field.",
        ),
        (("--cache-config", "redis,host=h"), "Failed to initialize RedisCache, didn't specify"),
        (("--cache-config", "memcached,size=1"), "unable to find 'libtritoncache_memcached.so'"),
        (("--rate-limit", "fast"), "invalid argument for --rate-limit"),
    ],
)
def test_bad_cache_and_rate_limit_flags_fail_with_triton_s_message(
    argv: tuple[str, ...], message: str
) -> None:
    with pytest.raises(TritonMPError) as e:
        cache_and_rate_limit(_args(*argv))
    assert e.value.message.startswith(message)


def test_cache_setting_format_errors() -> None:
    with pytest.raises(TritonMPError, match="No cache specified"):
        parse_cache_setting("size=1")
    with pytest.raises(TritonMPError, match="option format is '<cache name>,<setting>=<value>'"):
        parse_cache_setting("local,size")
    assert parse_cache_setting("local,size=1=2") == ("local", "size", "1=2")


def test_rate_limit_resource_format() -> None:
    assert parse_rate_limit_resource("R:2") == {"name": "R", "count": 2, "device": -1}
    assert parse_rate_limit_resource("R:2:1") == {"name": "R", "count": 2, "device": 1}
    for bad in ("R", "R:x", "R:1:2:3"):
        with pytest.raises(TritonMPError, match="--rate-limit-resource option format"):
            parse_rate_limit_resource(bad)


# ------------------------------------------------------------ the submit path with a cache
import asyncio  # noqa: E402

import numpy as np  # noqa: E402

from tests.unit.fake_frontend import (  # noqa: E402
    FakeArena,
    FakeCache,
    FakeScheduler,
    FakeSegment,
    FakeWorker,
    model_entry,
    table,
)
from triton_mp._proto import model_config_pb2 as mc  # noqa: E402
from triton_mp.frontend.cache.response import ResponseCacheStep  # noqa: E402
from triton_mp.frontend.dispatch.pending import PendingTable  # noqa: E402
from triton_mp.frontend.inference import Inference  # noqa: E402
from triton_mp.frontend.request import InferenceRequest, InputTensor  # noqa: E402
from triton_mp.frontend.shm.system import SystemShmRegistry  # noqa: E402
from triton_mp.ipc.protocol.control_messages import ModelEntry  # noqa: E402
from triton_mp.ipc.protocol.messages import CacheOutcome  # noqa: E402


class DictStore:
    """A store in a dict, counting calls."""

    def __init__(self) -> None:
        self.entries: dict[bytes, bytes] = {}
        self.inserts = 0

    def lookup(self, key: bytes) -> bytes | None:
        return self.entries.get(key)

    def insert(self, key: bytes, data: bytes) -> bool:
        self.inserts += 1
        self.entries[key] = data
        return True


def _cached_entry(name: str, enable: bool = True) -> ModelEntry:
    e = model_entry(name)
    cfg = mc.ModelConfig.FromString(e.config)
    cfg.response_cache.enable = enable
    return ModelEntry(name=name, config=cfg.SerializeToString(), ready_versions=(1,))


class CachedFrontend:
    def __init__(self, latency: object = None) -> None:
        self.input_segment, self.worker_segment = FakeSegment("/in"), FakeSegment("/out")
        self.worker = FakeWorker(self.worker_segment)
        cache = FakeCache(self.input_segment, self.worker_segment)
        self.pending = PendingTable(cache)  # type: ignore[arg-type]
        self.scheduler = FakeScheduler()
        self.store = DictStore()
        ticks = iter(range(1000, 10**9, 10))

        def clock() -> int:
            return next(ticks)

        step = ResponseCacheStep(self.store, self.scheduler.send, cache, clock)  # type: ignore[arg-type]
        self.inference = Inference(
            frontend_id=0,
            models=table(_cached_entry("cached"), _cached_entry("plain", enable=False)),
            shm=SystemShmRegistry(0),
            arena=FakeArena(self.input_segment),  # type: ignore[arg-type]
            cache=cache,  # type: ignore[arg-type]
            pending=self.pending,
            send_scheduler=self.scheduler.send,
            clock_ns=clock,
            response_cache=step,
            latency=latency,  # type: ignore[arg-type]
        )

    def outcomes(self) -> list[CacheOutcome]:
        return [m for m in self.scheduler.sent if isinstance(m, CacheOutcome)]


def _req(model: str, values: tuple[float, ...] = (1.0, 2.0)) -> InferenceRequest:
    data = np.array(values, np.float32).tobytes()
    return InferenceRequest(
        model_name=model, inputs=(InputTensor("IN", "FP32", (len(values),)),), raw_inputs=(data,)
    )


def test_a_miss_runs_and_is_stored_then_the_same_request_is_a_hit_without_the_scheduler() -> None:
    async def body() -> None:
        f = CachedFrontend()
        ticket = f.inference.submit(_req("cached"))
        (sent,) = f.scheduler.requests()
        out = np.array([5, 6], np.float32).tobytes()
        f.pending.deliver([f.worker.answer(sent, {"OUT": out})])
        result = await ticket.result()
        assert result.data(result.outputs[0]) == out
        result.release()
        assert f.store.inserts == 1
        (miss,) = f.outcomes()
        assert (miss.model, miss.version, miss.hit) == ("cached", 1, False)
        assert miss.cache_ns > 0
        hit_ticket = f.inference.submit(_req("cached"))
        assert len(f.scheduler.requests()) == 1, "a hit never reaches the scheduler"
        hit = await hit_ticket.result()
        assert hit.data(hit.outputs[0]) == out
        assert hit.view(hit.outputs[0]) is not None
        assert [r.name for r in hit.outputs] == ["OUT"]
        assert hit.outputs[0].shape == (2,)
        hit.release()
        assert f.outcomes()[-1].hit
        assert f.outcomes()[-1].request_ns > 0
        assert len(f.pending) == 0

    asyncio.run(body())


def test_errors_are_not_stored_and_uncached_models_never_look_up() -> None:
    async def body() -> None:
        f = CachedFrontend()
        ticket = f.inference.submit(_req("cached"))
        f.pending.deliver([f.worker.failed(f.scheduler.requests()[-1])])
        with pytest.raises(TritonMPError):
            await ticket.result()
        assert f.store.inserts == 0
        assert f.outcomes() == []
        for _ in range(2):
            t = f.inference.submit(_req("plain"))
            f.pending.deliver([f.worker.answer(f.scheduler.requests()[-1], {"OUT": b"\0" * 8})])
            (await t.result()).release()
        assert f.store.inserts == 0
        assert len(f.scheduler.requests()) == 3

    asyncio.run(body())


class Observed:
    """A stand-in for ``FirstResponseHistograms``: what was observed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.clock_ns = lambda: 0

    def observe(self, model: object, version: int, start_ns: int) -> None:
        self.seen.append((model.name, version))  # type: ignore[attr-defined]


def test_a_miss_and_a_hit_each_observe_their_first_response() -> None:
    """histogram_latencies: core observes a cached response as any other."""

    async def body() -> None:
        observed = Observed()
        f = CachedFrontend(observed)
        ticket = f.inference.submit(_req("cached"))
        (sent,) = f.scheduler.requests()
        out = np.array([5, 6], np.float32).tobytes()
        f.pending.deliver([f.worker.answer(sent, {"OUT": out})])
        (await ticket.result()).release()
        assert observed.seen == [("cached", 1)]
        (await f.inference.submit(_req("cached")).result()).release()
        assert observed.seen == [("cached", 1), ("cached", 1)]

    asyncio.run(body())
