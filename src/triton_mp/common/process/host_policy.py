"""Host policies: ``--host-policy <name>,<setting>=<value>`` and what an instance gets from one.

Pure parsing, shared by the CLI (the flag), the planner (an instance's policy) and its unit
tests. Triton's rules and words (server ``command_line_parser.cc`` ParseGenericConfigOption,
core ``tritonserver.cc`` SetHostPolicy, ``numa_utils.cc``, ``backend_model.cc``):

- the flag is ``<policy_name>,<setting>=<value>``, each part non-empty; the only settings are
  ``numa-node`` and ``cpu-cores``; a later flag for the same policy and setting wins;
- ``cpu-cores`` is a comma-separated list of ``<lower>-<upper>`` ranges (inclusive);
  triton-mp also takes a single core (``0-3,6``), which Triton refuses;
- an instance group without ``host_policy`` uses ``cpu`` (KIND_CPU), ``gpu_<device>``
  (KIND_GPU) or ``model`` (KIND_MODEL); a policy name no flag set means no setting.

Where Triton sets a policy on the instance's backend thread, triton-mp applies it to the
whole worker process (``common.process.platform.pin_process``): every instance is its own process.
"""

from __future__ import annotations

import re

from triton_mp.common.errors import ConfigError, ErrorCode, TritonMPError

__all__ = [
    "SETTINGS",
    "add_host_policy",
    "default_policy_name",
    "parse_cpu_cores",
    "parse_host_policy_option",
    "parse_numa_node",
]

SETTINGS = ("numa-node", "cpu-cores")
"""The host policy settings Triton knows."""

_STOI = re.compile(r"\s*([+-]?[0-9]+)")


def parse_host_policy_option(arg: str) -> tuple[str, str, str]:
    """One ``--host-policy`` value as ``(policy name, setting, value)``.

    Raises:
        TritonMPError (INVALID_ARG): the format is wrong (Triton's parse message);
            UNSUPPORTED: a setting other than ``numa-node`` and ``cpu-cores``.
    """
    name, sep, rest = arg.partition(",")
    setting, sep2, value = rest.partition("=")
    if not sep or not sep2 or not name or not setting or not value:
        raise TritonMPError(
            "--host-policy option format is '<policy name>,<setting>=<value>'. Got " + arg,
            ErrorCode.INVALID_ARG,
        )
    if setting not in SETTINGS:
        raise TritonMPError(
            f"Unsupported host policy setting '{setting}' is specified, supported settings "
            "are 'numa-node', 'cpu-cores'",
            ErrorCode.UNSUPPORTED,
        )
    return name, setting, value


def add_host_policy(policies: dict[str, dict[str, str]], arg: str) -> dict[str, dict[str, str]]:
    """``policies`` with one more ``--host-policy`` flag applied (a repeated setting wins).

    Raises:
        TritonMPError: as ``parse_host_policy_option``.
    """
    name, setting, value = parse_host_policy_option(arg)
    out = {k: dict(v) for k, v in policies.items()}
    out.setdefault(name, {})[setting] = value
    return out


def _stoi(what: str, text: str) -> int:
    """``std::stoi`` as Triton's ParseIntOption uses it: leading blanks and a leading
    integer; the rest of the text is ignored."""
    match = _STOI.match(text)
    if match is None:
        raise ConfigError(f"{what}: Can't parse '{text}' to integer")
    return int(match.group(1))


def parse_cpu_cores(value: str) -> tuple[int, ...]:
    """A ``cpu-cores`` value as the sorted, distinct CPU ids it names.

    ``"0-3,6"`` -> ``(0, 1, 2, 3, 6)``. An empty range (``"3-1"``) names no core.

    Raises:
        ConfigError: an item is neither ``<lower>-<upper>`` nor one integer, or a bound is
            not an integer (Triton's ``Parsing 'cpu-cores' value`` message).
    """
    cores: set[int] = set()
    for item in value.split(","):
        lower_text, dash, upper_text = item.partition("-")
        if not dash:
            if _STOI.fullmatch(item.strip() or "x") is None:
                raise ConfigError(
                    "host policy setting 'cpu-cores' format is "
                    f"'<lower_cpu_core_id>-<upper_cpu_core_id>'. Got {item}"
                )
            lower_text = upper_text = item
        lower = _stoi("Parsing 'cpu-cores' value", lower_text)
        upper = _stoi("Parsing 'cpu-cores' value", upper_text)
        if lower < 0:
            raise ConfigError(f"host policy setting 'cpu-cores' has a negative core id {lower}")
        cores.update(range(lower, upper + 1))
    return tuple(sorted(cores))


def parse_numa_node(value: str) -> int:
    """A ``numa-node`` value as a node id.

    Raises:
        ConfigError: not an integer (Triton's ``Parsing 'numa-node' value`` message), or
            negative.
    """
    node = _stoi("Parsing 'numa-node' value", value)
    if node < 0:
        raise ConfigError(f"host policy setting 'numa-node' has a negative node id {node}")
    return node


def default_policy_name(kind: str, gpu_id: int) -> str:
    """Triton's policy name of an instance whose group names none: ``cpu``, ``gpu_<id>``
    or ``model`` (``kind`` is ``KIND_CPU``, ``KIND_GPU`` or ``KIND_MODEL``)."""
    if kind == "KIND_GPU":
        return f"gpu_{gpu_id}"
    if kind == "KIND_MODEL":
        return "model"
    return "cpu"
