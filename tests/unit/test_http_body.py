"""``frontend.http.body.read_body`` without a server: chunk counting and the size limit."""

from __future__ import annotations

import asyncio
import gzip
import os
import zlib
from unittest import mock

import pytest
from aiohttp import streams
from aiohttp.test_utils import make_mocked_request

from triton_mp.common.errors import InvalidRequest
from triton_mp.frontend.http.body import (
    INFLATE_PIECE,
    MAX_CHUNKS,
    TooManyChunks,
    inflate,
    read_body,
)


def _request(chunks: list[bytes], headers: dict[str, str]) -> object:
    protocol = mock.Mock(_reading_paused=False)
    payload = streams.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    payload.begin_http_chunk_receiving()
    for c in chunks:
        payload.feed_data(c)
        payload.end_http_chunk_receiving()
    payload.feed_eof()
    return make_mocked_request("POST", "/", headers=headers, payload=payload)


async def _read(chunks: list[bytes], limit: int = 1 << 20, **headers: str) -> bytes:
    return await read_body(_request(chunks, headers), limit)  # type: ignore[arg-type]


def test_chunks_up_to_the_cap_are_read() -> None:
    body = asyncio.run(_read([b"x"] * MAX_CHUNKS, **{"Transfer-Encoding": "chunked"}))
    assert body == b"x" * MAX_CHUNKS


def test_one_chunk_more_is_refused() -> None:
    with pytest.raises(TooManyChunks) as e:
        asyncio.run(_read([b"x"] * (MAX_CHUNKS + 1), **{"Transfer-Encoding": "chunked"}))
    assert e.value.message.startswith("Chunked request body exceeds maximum of 65536 non-empty")


def test_a_body_over_the_limit_is_refused_with_tritons_words() -> None:
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(_read([b"x" * 11], limit=10))
    assert e.value.message == (
        "request JSON size of 11 bytes exceeds the maximum allowed input size of 10 bytes. "
        "Use --http-max-input-size to increase the limit."
    )
    with pytest.raises(InvalidRequest) as e2:
        asyncio.run(_read([b"x" * 11], limit=10, **{"Content-Encoding": "gzip"}))
    assert e2.value.message.startswith("Decompressed data size exceeds the maximum allowed value")


def test_gzip_and_zlib_bodies_inflate_whichever_encoding_names_them() -> None:
    body = b'{"inputs": []}' * 100
    assert inflate(gzip.compress(body), 1 << 20) == body
    assert inflate(zlib.compress(body), 1 << 20) == body


def test_a_damaged_stream_keeps_what_inflated_before_the_damage() -> None:
    """As Triton's DecompressData, which ignores zlib's data errors."""
    body = os.urandom(3 * INFLATE_PIECE)
    packed = zlib.compress(body, 0)  # stored blocks: the damage is found only at the end
    assert inflate(packed[:-4] + b"\0\0\0\0", 1 << 20) == body  # a bad checksum
    cut = inflate(packed[: 2 * INFLATE_PIECE], 1 << 20)  # a stream cut short
    assert len(cut) > INFLATE_PIECE
    assert body.startswith(cut)
    text = b"0123456789" * 1000
    damaged = gzip.compress(text)[:-8] + b"\xff" * 8
    assert inflate(damaged, 1 << 20) == text
    assert inflate(b"not gzip at all", 1 << 20) == b""


def test_inflating_is_bounded() -> None:
    with pytest.raises(InvalidRequest) as e:
        inflate(gzip.compress(b" " * 2049), 2048)
    assert e.value.message.startswith("Decompressed data size exceeds the maximum allowed value")
    with pytest.raises(InvalidRequest) as e2:
        inflate(b"", 2048)
    assert e2.value.message == "nothing to be decompressed"
