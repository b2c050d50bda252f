"""Fuzz ``common.onnx_file`` (it parses bytes from the model repository): any file, and any
corruption of a real ONNX file, reads to a signature and metadata or is refused with
``OnnxFileError``; nothing else escapes (no IndexError, no RecursionError, no hang), and
where ``onnx`` itself parses a corrupted file, the two agree on what they both read."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.model_config_builders import batchable_onnx
from triton_mp.common.onnx_file import OnnxFileError, read_metadata, read_signature

_VALID = batchable_onnx()
_VALID.metadata_props.add(key="character", value="a\nb")
_BYTES = _VALID.SerializeToString()

_FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _read_both(path: Path) -> bool:
    """Read ``path`` both ways; True when both reads succeeded, False when refused."""
    try:
        read_signature(path)
        read_metadata(path)
    except OnnxFileError:
        return False
    return True


@_FUZZ
@given(data=st.binary(max_size=512))
def test_any_bytes_read_or_are_refused(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    _read_both(path)


@_FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(_BYTES) - 1), st.integers(0, 255)), min_size=1, max_size=8
    ),
    cut=st.integers(1, len(_BYTES)),
)
def test_corrupted_onnx_reads_as_onnx_reads_it_or_is_refused(
    tmp_path: Path, edits: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(_BYTES[:cut])
    for pos, value in edits:
        if pos < len(data):
            data[pos] = value
    path = tmp_path / "model.onnx"
    path.write_bytes(bytes(data))
    if not _read_both(path):
        return
    try:
        model = onnx.load_from_string(bytes(data))
    except (DecodeError, RuntimeError, ValueError):
        return  # onnx refuses what the field reader skipped unread (weights): fine
    try:
        metadata = {p.key: p.value for p in model.metadata_props}
    except UnicodeDecodeError:
        return
    assert read_metadata(path) == metadata
    names = [v.name for v in model.graph.output]
    assert [o.name for o in read_signature(path).outputs] == names
