"""An output's classification labels (``ModelOutput.label_filename``), read at load.

Triton's core reads them when it creates the model (``Model::Init``, ``LabelProvider``): the
file is ``<model directory>/<label_filename>``, one label per line as ``std::getline``
splits it, label ``i`` for class index ``i``. A path that leaves the model directory is
refused UNSUPPORTED; a file that cannot be read fails the load with the filesystem's words.
The classification extension (``frontend.classification``) appends the label to each class.
"""

from __future__ import annotations

import os
from pathlib import Path

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ConfigError, ErrorCode


def read_labels(directory: Path, config: mc.ModelConfig) -> dict[str, tuple[str, ...]]:
    """Output name -> its labels, for every output with a ``label_filename``.

    Raises:
        ConfigError: UNSUPPORTED "label file path '<p>' for output '<o>' in model '<m>' is
            outside model directory"; INTERNAL "failed to open text file for read <p>:
            <strerror>".
    """
    labels: dict[str, tuple[str, ...]] = {}
    root = os.path.normpath(str(directory))
    for out in config.output:
        if not out.label_filename:
            continue
        path = os.path.join(str(directory), out.label_filename)
        normal = os.path.normpath(path)
        if normal != root and not normal.startswith(root + os.sep):
            raise ConfigError(
                f"label file path '{path}' for output '{out.name}' in model '{config.name}' "
                "is outside model directory",
                ErrorCode.UNSUPPORTED,
            )
        try:
            text = Path(path).read_bytes().decode("utf-8", errors="replace")
        except OSError as e:
            raise ConfigError(
                f"failed to open text file for read {path}: {os.strerror(e.errno or 0)}",
                ErrorCode.INTERNAL,
            ) from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # NOTE: getline yields no empty line after the last newline
        labels[out.name] = tuple(lines)
    return labels
