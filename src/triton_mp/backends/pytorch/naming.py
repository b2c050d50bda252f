"""Which ``forward()`` argument and which returned tensor each config tensor is, as Triton's
PyTorch backend decides (``ModelInstanceState::GetNamingConvention``, ``ValidateInputs``,
``ValidateOutputs``). Pure: no torch import, so it is tested without a model.

Inputs, in order of preference:

1. ``FORWARD_ARGUMENT``: every config input is an argument name of ``forward()``;
2. ``NAMED_INDEX``: every name is ``<name>__<index>`` (``INPUT__0``), the index the position;
3. ``STRICT_CONFIG_ORDERING``: otherwise, the config's order is the argument order (with a
   warning when some names had ``__`` but no integer index).

Outputs: ``NAMED_INDEX`` when every name is ``<name>__<index>`` (the index into the tuple
``forward()`` returns), else the config's order. A model with implicit state
(``sequence_batching.state``) must use ``<name>__<index>`` for every input, output and state;
sequence control inputs must always be ``<name>__<index>`` (``ValidateBooleanSequenceControl``,
``ValidateTypedSequenceControl``) and count among ``forward()``'s arguments.
A ``forward()`` taking one ``Dict[str, Tensor]`` gets its inputs by config name.

Imported by ``backends.pytorch.backend`` (worker processes).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from triton_mp.common.errors import ConfigError, ErrorCode

__all__ = ["Convention", "IoMap", "input_map", "output_map"]

log = logging.getLogger(__name__)

_DELIMITER = "__"


class Convention(enum.Enum):
    """Triton's ``NamingConvention``."""

    FORWARD_ARGUMENT = "FORWARD_ARGUMENT"
    NAMED_INDEX = "NAMED_INDEX"
    STRICT_CONFIG_ORDERING = "STRICT_CONFIG_ORDERING"


@dataclass(frozen=True)
class IoMap:
    """Config tensor name -> position (argument of ``forward()`` or element it returns).

    Attributes:
        convention: how the positions were found.
        positions: name -> 0-based position; for a dict input, the order of the config.
        dict_input: ``forward()`` takes one ``Dict[str, Tensor]`` keyed by input name.
    """

    convention: Convention
    positions: dict[str, int]
    dict_input: bool = False


def _index(name: str) -> int | None:
    """The ``<index>`` of ``<name>__<index>`` (Triton: the text after the first ``__``, all
    digits), or None."""
    at = name.find(_DELIMITER)
    if at < 0:
        return None
    tail = name[at + len(_DELIMITER) :]
    # NOTE: Triton's loop accepts an empty tail (atoi gives 0); so do we.
    return int(tail) if tail.isdigit() else (0 if tail == "" else None)


def _named_index(names: Sequence[str], model: str, kind: str) -> bool:
    """Whether every name is ``<name>__<index>``; warns as Triton when a name has ``__``
    without an integer index."""
    for name in names:
        at = name.find(_DELIMITER)
        if at < 0:
            return False
        if _index(name) is None:
            if kind == "input":
                log.warning(
                    "input '%s' or previous input(s) are neither an input argument to the "
                    "model '%s' nor do they follow the <name>__<index> naming convention. "
                    "Falling back to enforcing strict ordering from model configuration.",
                    name,
                    model,
                )
            else:
                log.warning(
                    "output '%s' or previous output(s) of the model '%s' do not follow the "
                    "<name>__<index> naming convention. Falling back to enforcing strict "
                    "ordering from model configuration.",
                    name,
                    model,
                )
            return False
    return True


def _check_states(model: str, convention: Convention, state_names: Sequence[str]) -> None:
    """States need ``<name>__<index>`` everywhere (Triton's sequence-state rule).

    Raises:
        ConfigError (INVALID_ARG): a name that breaks it.
    """
    if not state_names:
        return
    if convention is not Convention.NAMED_INDEX:
        raise ConfigError(
            f"PyTorch model '{model}' is using sequence batching with state but not all "
            "inputs and outputs follow the <name>__<index> naming convention. ",
            ErrorCode.INVALID_ARG,
        )
    for name in state_names:
        if _index(name) is None:
            raise ConfigError(
                f"PyTorch model '{model}' is using sequence batching with state but state "
                f"'{name}' does not follow the <name>__<index> naming convention. ",
                ErrorCode.INVALID_ARG,
            )


def input_map(
    model: str,
    config_inputs: Sequence[str],
    arguments: Sequence[tuple[str, str]],
    state_inputs: Sequence[str] = (),
    control_inputs: Sequence[str] = (),
) -> IoMap:
    """The positions of a model's inputs.

    Args:
        model: the model name (for messages).
        config_inputs: the config's input names, in order.
        arguments: ``forward()``'s schema as ``(name, type kind)`` pairs (``"ClassType"``
            first for ``self``; ``"TensorType"``, ``"ListType"``, ``"DictType"``).
        state_inputs: ``sequence_batching.state[*].input_name``.
        control_inputs: ``sequence_batching.control_input[*].name``.

    Raises:
        ConfigError: the arguments are not tensors (or one dict), their count differs from
            the config's, there is no input, or a state or control breaks the naming rule.
    """
    for name in control_inputs:
        if _index(name) is None:
            raise ConfigError(f"input '{name}' does not follow <name>__<index> naming convention.")
    args = list(arguments)
    if args and args[0][1] == "ClassType":
        args = args[1:]
    if not config_inputs:
        raise ConfigError(
            "model configuration must contain at least one input, none were specified."
        )
    if len(args) == 1 and args[0][1] == "DictType":
        return IoMap(
            Convention.FORWARD_ARGUMENT,
            {n: i for i, n in enumerate([*config_inputs, *state_inputs, *control_inputs])},
            dict_input=True,
        )
    if any(kind == "DictType" for _, kind in args[1:]):
        raise ConfigError(
            "Multiple inputs of kind DictType were detected. Only a single input of type "
            "Dict(str, Tensor) is supported."
        )
    for _, kind in args:
        if kind not in ("TensorType", "ListType"):
            raise ConfigError(
                f"An input of type '{kind}' was detected in the model. Only a single input "
                "of type Dict(str, Tensor) or input(s) of type Tensor are supported."
            )
    allowed = [name for name, _ in args]
    expected = len(config_inputs) + len(state_inputs) + len(control_inputs)
    if len(allowed) != expected:
        raise ConfigError(
            f"unable to load model '{model}', configuration expects {expected} inputs, "
            f"model provides {len(allowed)}",
            ErrorCode.INVALID_ARG,
        )
    if all(n in allowed for n in config_inputs):
        convention = Convention.FORWARD_ARGUMENT
    elif _named_index(config_inputs, model, "input"):
        convention = Convention.NAMED_INDEX
    else:
        convention = Convention.STRICT_CONFIG_ORDERING
    _check_states(model, convention, state_inputs)
    positions: dict[str, int] = {}
    for i, name in enumerate(config_inputs):
        if convention is Convention.FORWARD_ARGUMENT:
            positions[name] = allowed.index(name)
        elif convention is Convention.NAMED_INDEX:
            positions[name] = _index(name) or 0
        else:
            positions[name] = i
    for name in (*state_inputs, *control_inputs):
        positions[name] = _index(name) or 0
    return IoMap(convention, positions)


def output_map(
    model: str, config_outputs: Sequence[str], state_outputs: Sequence[str] = ()
) -> IoMap:
    """The position of each output (and state output) in what ``forward()`` returns.

    Raises:
        ConfigError: no output, or a state breaks the naming rule.
    """
    if not config_outputs:
        raise ConfigError(
            "model configuration must contain at least one output, none were specified."
        )
    if _named_index(config_outputs, model, "output"):
        convention = Convention.NAMED_INDEX
        positions = {n: _index(n) or 0 for n in config_outputs}
    else:
        convention = Convention.STRICT_CONFIG_ORDERING
        positions = {n: i for i, n in enumerate(config_outputs)}
    _check_states(model, convention, state_outputs)
    for name in state_outputs:
        positions[name] = _index(name) or 0
    return IoMap(convention, positions)
