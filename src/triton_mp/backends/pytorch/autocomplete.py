"""Auto-complete of PyTorch models: none, as in Triton (``ModelState::AutoCompleteConfig``).

A TorchScript file holds no tensor names, data types or shapes a config could be completed
from, so Triton's PyTorch backend only logs that it skipped; the config must name every
input and output (the loader's validation says so when it does not). Imported by the model
loader in the supervisor: no torch here.
"""

from __future__ import annotations

import logging
from pathlib import Path

from triton_mp._proto.model_config_pb2 import ModelConfig
from triton_mp.backends.registry import AutoCompleteOptions

log = logging.getLogger(__name__)


def auto_complete(config: ModelConfig, model_file: Path, options: AutoCompleteOptions) -> None:
    """Log Triton's warning; the config is left as it is."""
    del model_file, options
    log.warning(
        "skipping model configuration auto-complete for '%s': not supported for pytorch backend",
        config.name,
    )
