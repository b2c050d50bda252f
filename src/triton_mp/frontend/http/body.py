"""Reading an HTTP request body within Triton's limits (server ``http_server.cc``).

Imported by ``frontend.http.routes``. The body is read chunk by chunk from aiohttp's
stream (its own decompression is off: the server runs with ``auto_decompress=False``), so
the limits hold while it arrives:

- ``Transfer-Encoding: chunked``: more than ``MAX_CHUNKS`` (65536) non-empty chunks is
  refused with 400 and the connection is closed (server PR #8770, ``ChunkCountIncrement``).
- ``--http-max-input-size`` bytes (default 64 MiB): an inflated body past it is refused
  with Triton's decompression message (PR #8570, ``DataCompressor::DecompressData``); a
  plain one with its "request JSON size" message (PR #8432, ``EVBufferToJson``).

``inflate`` decompresses an inference body as Triton's ``DataCompressor::DecompressData``:
zlib with gzip/zlib header detection for either encoding, and a corrupt or cut stream keeps
what inflated before the damage (Triton ignores zlib's data errors), so the request goes on
with those bytes (often none: a raw request of zero bytes).
"""

from __future__ import annotations

import zlib

from aiohttp import web

from triton_mp.common.errors import InvalidRequest

MAX_CHUNKS = 1 << 16
"""Triton's ``kMaxChunkedChunks``: non-empty chunks one chunked request may have."""

CHUNKS_MESSAGE = (
    f"Chunked request body exceeds maximum of {MAX_CHUNKS} non-empty chunks. Send fewer or "
    "larger HTTP chunks."
)


class TooManyChunks(InvalidRequest):
    """A chunked body over ``MAX_CHUNKS`` chunks (400; the connection is closed after)."""


INFLATE_PIECE = 1 << 16
"""Compressed bytes inflated per zlib call (bounds the byte-wise replay after an error)."""


def _inflated_too_big(limit: int) -> InvalidRequest:
    return InvalidRequest(
        f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. Use "
        "--http-max-input-size to increase the limit."
    )


def _salvage(d: zlib._Decompress, piece: bytes, out: bytearray, limit: int) -> None:
    """Replay ``piece`` byte by byte on ``d`` (its state before the piece), keeping what
    inflates before zlib reports the damage."""
    for i in range(len(piece)):
        try:
            out += d.decompress(piece[i : i + 1])
        except zlib.error:
            return
        if len(out) > limit:
            raise _inflated_too_big(limit)
        if d.eof:
            return


def inflate(data: bytes, limit: int) -> bytes:
    """A gzip or deflate (zlib) inference body inflated, at most ``limit`` bytes.

    Raises:
        InvalidRequest: ``data`` is empty (Triton's "nothing to be decompressed"), or it
            inflates past ``limit`` (Triton's decompression limit message).
    """
    if not data:
        raise InvalidRequest("nothing to be decompressed")
    d = zlib.decompressobj(15 | 32)  # NOTE: inflateInit2(15 | 32): detect gzip or zlib
    out = bytearray()
    for start in range(0, len(data), INFLATE_PIECE):
        piece = data[start : start + INFLATE_PIECE]
        saved, mark = d.copy(), len(out)
        try:
            pending = piece
            while pending and not d.eof:
                out += d.decompress(pending, limit + 1 - len(out))
                if len(out) > limit:
                    raise _inflated_too_big(limit)
                pending = d.unconsumed_tail
        except zlib.error:
            del out[mark:]
            _salvage(saved, piece, out, limit)
            break
        if d.eof:
            break  # NOTE: as inflate(): what follows the end of the stream is ignored
    return bytes(out)


def _too_big(request: web.Request, size: int, limit: int) -> InvalidRequest:
    if request.headers.get("Content-Encoding", "") in ("gzip", "deflate"):
        return _inflated_too_big(limit)
    # NOTE: Triton names the Content-Length; without one (chunked), the bytes read so far.
    length = request.content_length if request.content_length is not None else size
    return InvalidRequest(
        f"request JSON size of {length} bytes exceeds the maximum allowed input size of "
        f"{limit} bytes. Use --http-max-input-size to increase the limit."
    )


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole request body (inflated when gzip/deflate), at most ``limit`` bytes.

    Raises:
        TooManyChunks: a chunked body of more than 65536 non-empty chunks.
        InvalidRequest: (400) the body is over ``limit`` bytes (inflated), or could not be
            read or decoded (a corrupt gzip stream, a connection cut mid-body).
    """
    plain = request.headers.get("Content-Encoding", "") not in ("gzip", "deflate")
    if plain and request.content_length is not None and request.content_length > limit:
        raise _too_big(request, request.content_length, limit)
    if not request.body_exists:
        return b""  # NOTE: aiohttp's shared empty payload reads (b"", True) after its first
    body = bytearray()
    chunks = 0
    try:
        while True:
            data, chunk_end = await request.content.readchunk()
            if not data and not chunk_end:
                break  # NOTE: (b"", False) is the end of the body
            body += data
            if len(body) > limit:
                raise _too_big(request, len(body), limit)
            if chunk_end:
                # NOTE: aiohttp marks the end of each chunk that brought bytes, once.
                chunks += 1
                if chunks > MAX_CHUNKS:
                    raise TooManyChunks(CHUNKS_MESSAGE)
    except web.RequestPayloadError as e:
        raise InvalidRequest(f"failed to read the request body: {e}") from None
    return bytes(body)
