"""Typed msgpack encoding of ``ipc.messages`` unions, one decoder per channel direction.

Imported by ``ipc.channel`` (and by the supervisor to encode process specs).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()


def encode(msg: Any) -> bytes:
    """Encode one message or spec struct to msgpack bytes."""
    return _encoder.encode(msg)


class Decoder(Generic[T]):
    """Decodes bytes into one type (a message union or a spec struct).

    Raises:
        msgspec.ValidationError: the bytes are not a valid ``T``.
    """

    def __init__(self, type_: Any) -> None:
        self._dec: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(type_)
        self.decode_buffer = self._dec.decode
        """``decode`` without the wrapper's call: any buffer (``bytes``, a ``memoryview`` of
        a ring record); what it returns holds no reference to it."""

    def decode(self, data: bytes) -> T:
        """Decode one record."""
        return self._dec.decode(data)
