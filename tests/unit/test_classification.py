"""The classification extension's pieces, process-free: ``frontend.classification.top_k``
(Triton's TopkClassifications) and ``model_config.labels.read_labels`` (its LabelProvider)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ConfigError, ErrorCode, TritonMPError
from triton_mp.frontend.classification import MAX_ELEMENTS, top_k
from triton_mp.model_config.labels import read_labels


def _strings(data: bytes) -> list[str]:
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        out.append(data[i + 4 : i + 4 + n].decode())
        i += 4 + n
    return out


def test_each_batch_entry_gets_its_top_k_with_labels() -> None:
    x = np.array([[1, 9, 3], [7, 2, 8]], np.float32)
    data, shape = top_k(x.tobytes(), "FP32", x.shape, 2, True, ("a", "", "c"))
    assert shape == (2, 2)
    assert _strings(data) == ["9.000000:1", "3.000000:2:c", "8.000000:2:c", "7.000000:0:a"]


def test_unbatched_integers_and_a_k_past_the_classes() -> None:
    x = np.array([5, 250, 0], np.uint8)
    data, shape = top_k(x.tobytes(), "UINT8", x.shape, 10, False)
    assert (shape, _strings(data)) == ((3,), ["250:1", "5:0", "0:2"])


@pytest.mark.parametrize("datatype", ["FP16", "BF16", "BOOL", "BYTES"])
def test_types_without_classes_are_refused(datatype: str) -> None:
    with pytest.raises(TritonMPError) as e:
        top_k(b"\0\0", datatype, (1,), 1, False)
    assert e.value.code == ErrorCode.INVALID_ARG
    assert e.value.message == (
        f"class result not available for output due to unsupported type '{datatype}'"
    )


def test_too_many_elements_per_entry() -> None:
    with pytest.raises(TritonMPError, match="classification output tensor too large"):
        top_k(b"", "FP32", (MAX_ELEMENTS + 1,), 1, False)


def _config(label_filename: str) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name="m")
    cfg.output.add(name="OUT", data_type=mc.TYPE_FP32, dims=[3], label_filename=label_filename)
    return cfg


def test_labels_are_the_files_lines(tmp_path: Path) -> None:
    (tmp_path / "l.txt").write_text("a\n\nc\r\n")
    assert read_labels(tmp_path, _config("l.txt")) == {"OUT": ("a", "", "c\r")}
    assert read_labels(tmp_path, _config("")) == {}


def test_a_label_file_outside_the_model_or_missing_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        read_labels(tmp_path, _config("../x.txt"))
    assert e.value.code == ErrorCode.UNSUPPORTED
    assert e.value.message == (
        f"label file path '{tmp_path}/../x.txt' for output 'OUT' in model 'm' is outside "
        "model directory"
    )
    with pytest.raises(ConfigError) as e:
        read_labels(tmp_path, _config("none.txt"))
    assert e.value.message == (
        f"failed to open text file for read {tmp_path}/none.txt: No such file or directory"
    )
