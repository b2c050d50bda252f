"""The config ``parameters`` Triton's PyTorch backend reads (``ModelState::ParseParameters``),
parsed and checked as Triton parses them. Pure: no torch import.

Every key is a ``string_value``: booleans as ``true/on/1`` or ``false/off/0`` (any case),
integers as C's ``stoi`` reads them. A value that does not parse fails the model's load with
Triton's message. Defaults are Triton's: optimized execution, inference mode and cuDNN on,
cache cleaning off; the JIT knobs and the fuser unchanged unless given.

``ENABLE_WEIGHT_SHARING`` shares one copy of the weights between the instances of a model on
one device in Triton, where every instance lives in one process; here every instance is its
own process, so it cannot act, and the backend says so in a warning rather than ignoring it.

Imported by ``backends.pytorch.backend`` (worker processes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from triton_mp.common.errors import ConfigError, ErrorCode

__all__ = ["TorchParameters", "parse_bool", "parse_int"]

_TRUE = ("true", "on", "1")
_FALSE = ("false", "off", "0")


def parse_bool(value: str) -> bool:
    """Backend common ``ParseBoolValue``.

    Raises:
        ConfigError (INVALID_ARG): ``failed to convert '<value>' to boolean``.
    """
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"failed to convert '{value}' to boolean", ErrorCode.INVALID_ARG)


def parse_int(value: str) -> int:
    """Backend common ``ParseIntValue`` (``std::stoi``: leading blanks, a sign, digits;
    what follows the digits is ignored).

    Raises:
        ConfigError (INVALID_ARG): ``failed to convert '<value>' to integral number``.
    """
    match = re.match(r"\s*([+-]?\d+)", value)
    if match is None:
        raise ConfigError(f"failed to convert '{value}' to integral number", ErrorCode.INVALID_ARG)
    return int(match.group(1))


@dataclass(frozen=True)
class TorchParameters:
    """The PyTorch backend's parameters of one model (Triton's names in the comments).

    ``None`` for the tri-state knobs means "leave PyTorch's default" (Triton's pair
    ``{false, _}``); thread counts of 0 or less leave PyTorch's default too.
    """

    optimized_execution: bool = True
    """not ``DISABLE_OPTIMIZED_EXECUTION``: the graph executor's optimisations."""
    inference_mode: bool = True
    """``INFERENCE_MODE``: ``torch.inference_mode`` around load and execute."""
    cudnn: bool = True
    """not ``DISABLE_CUDNN``."""
    cache_cleaning: bool = False
    """``ENABLE_CACHE_CLEANING``: empty the CUDA caching allocator after each execute."""
    weight_sharing: bool = False
    """``ENABLE_WEIGHT_SHARING`` (no effect here: one process per instance)."""
    tensor_fuser: bool | None = None
    """``ENABLE_TENSOR_FUSER``."""
    jit_profiling: bool | None = None
    """``ENABLE_JIT_PROFILING``."""
    jit_executor: bool | None = None
    """``ENABLE_JIT_EXECUTOR``."""
    intra_op_threads: int = 0
    """``INTRA_OP_THREAD_COUNT`` (> 0: ``torch.set_num_threads``)."""
    inter_op_threads: int = 0
    """``INTER_OP_THREAD_COUNT`` (> 0: ``torch.set_num_interop_threads``)."""

    @classmethod
    def from_config(cls, parameters: Mapping[str, object]) -> TorchParameters:
        """Read the config's ``parameters`` (JSON form: ``{key: {"string_value": s}}``).

        Raises:
            ConfigError (INVALID_ARG): a value that does not parse.
        """

        def text(key: str) -> str | None:
            entry = parameters.get(key)
            if not isinstance(entry, dict):
                return None
            return str(entry.get("string_value", ""))

        def flag(key: str) -> bool | None:
            value = text(key)
            return None if value is None else parse_bool(value)

        def count(key: str) -> int:
            value = text(key)
            return 0 if value is None else parse_int(value)

        disable_opt = flag("DISABLE_OPTIMIZED_EXECUTION")
        inference = flag("INFERENCE_MODE")
        disable_cudnn = flag("DISABLE_CUDNN")
        return cls(
            optimized_execution=not disable_opt if disable_opt is not None else True,
            inference_mode=inference if inference is not None else True,
            cudnn=not disable_cudnn if disable_cudnn is not None else True,
            cache_cleaning=bool(flag("ENABLE_CACHE_CLEANING")),
            weight_sharing=bool(flag("ENABLE_WEIGHT_SHARING")),
            tensor_fuser=flag("ENABLE_TENSOR_FUSER"),
            jit_profiling=flag("ENABLE_JIT_PROFILING"),
            jit_executor=flag("ENABLE_JIT_EXECUTOR"),
            intra_op_threads=count("INTRA_OP_THREAD_COUNT"),
            inter_op_threads=count("INTER_OP_THREAD_COUNT"),
        )
