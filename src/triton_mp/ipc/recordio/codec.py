"""Typed msgpack encoding of ``ipc.protocol.messages`` unions, one decoder per channel direction.

Imported by ``ipc.channel`` (and by the supervisor to encode process specs). A decoder also
takes the binary records of ``ipc.recordio.records`` (first byte ``records.MARKER``, which msgpack
never produces), so one ring carries both forms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

from triton_mp.ipc.recordio.records import record_decoder

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
        self.decode_buffer: Callable[[Any], T] = record_decoder(self._dec.decode)
        """``decode`` without the wrapper's call: any buffer (``bytes``, a ``memoryview`` of
        a ring record), a binary record or a msgpack message; what it returns holds no
        reference to it."""

    def decode(self, data: bytes) -> T:
        """Decode one record (a binary record or a msgpack message)."""
        return self.decode_buffer(data)
