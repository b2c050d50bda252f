"""tritonserver's command line, parsed as ``tritonserver`` parses it (pure; no I/O).

Imported by ``cli.main`` for ``triton-mp start`` and ``triton-mp-tritonserver``; the flags
themselves are one table, ``cli.flag_table.FLAGS`` (with ``cli.endpoint_flags``' rows). The
grammar is Triton's (``TritonParser::Parse``, GNU ``getopt_long`` with no short options):

- ``--flag=value`` and ``--flag value``; a flag without an argument (``--help``,
  ``--disable-auto-complete-config``) takes none, and ``--flag=value`` on it is refused;
- an unambiguous prefix of a flag's name names it (``--model-repo=...``), as getopt allows;
- booleans are ``true``/``on``/``1`` and ``false``/``off``/``0``, any case;
- ``--`` ends the options; any argument that is not an option is refused with
  "Unexpected argument: <arg>", an unknown option with "<prog>: unrecognized option '<arg>'";
- a bad value is refused with 'Bad option: "--<flag>".' and the reason on the next line.

A flag given that triton-mp does not act on yields one warning line (``Parsed.warnings``)
unless its value is what triton-mp does anyway (``Flag.quiet``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

NOT_YET = "not acted on yet"
"""``Flag.unused`` of a flag whose meaning triton-mp will implement but does not yet."""


class Kind(enum.Enum):
    """How a flag's argument is read (Triton's ``Option::Arg*``); the value is its usage
    word (INT_BOOL's has a space only to stay a distinct member)."""

    STR = "string"
    INT = "integer"
    FLOAT = "float"
    BOOL = "boolean"
    INT_BOOL = "integer "
    """An integer, or true (1) / false (0): ``--log-verbose`` (``ParseIntBoolOption``)."""
    NONE = ""
    """No argument: the flag's presence sets True."""


STR, INT, FLOAT, BOOL, INT_BOOL, NONE = (
    Kind.STR,
    Kind.INT,
    Kind.FLOAT,
    Kind.BOOL,
    Kind.INT_BOOL,
    Kind.NONE,
)
"""The kinds by their short names, as the flag tables (``cli.flag_table``,
``cli.endpoint_flags``) write their rows."""


class FlagError(Exception):
    """A command line tritonserver refuses; ``str()`` is the message it prints."""


@dataclass(frozen=True, slots=True)
class Flag:
    """One tritonserver (or triton-mp) flag.

    Attributes:
        name: without the leading ``--``.
        kind: how its argument is read.
        dest: the key of ``Parsed.values`` it sets (``cli.main`` turns those into a
            ``ServerConfig``); empty when triton-mp does not act on it.
        default: the value of ``dest`` when the flag is absent.
        repeat: every occurrence is kept (a tuple, in order); otherwise the last one wins.
        unused: why triton-mp does not act on it ("" when it does): the warning given when
            the flag is given, e.g. ``NOT_YET``.
        quiet: values that are what triton-mp does anyway: given with one, no warning.
        check: Triton's own check of the value (after conversion); raises FlagError with
            Triton's reason, or returns the value to keep (e.g. normalised).
        arg: the argument's usage text when not the kind's (``<string>,<string>=<string>``).
        help: one line: what it does in triton-mp (or in Triton, when unused).
        group: the usage section it is listed under.
    """

    name: str
    kind: Kind
    dest: str = ""
    default: object = None
    repeat: bool = False
    unused: str = ""
    quiet: tuple[object, ...] = ()
    check: Callable[[object], object] | None = None
    arg: str = ""
    help: str = ""
    group: str = ""


@dataclass(slots=True)
class Parsed:
    """A parsed command line.

    Attributes:
        values: ``dest`` -> value for every acted-on flag (its default when absent).
        given: the names of the flags given, in order (repeats once).
        warnings: one line per flag given that triton-mp does not act on.
        help: ``--help`` was given.
    """

    values: dict[str, object]
    given: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    help: bool = False


_TRUE = ("true", "on", "1")
_FALSE = ("false", "off", "0")


def parse_bool(text: str) -> bool:
    """Triton's ``ParseOption<bool>``.

    Raises:
        FlagError: "invalid value for bool option: <text>".
    """
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise FlagError(f"invalid value for bool option: {text}")


def _number(text: str, kind: Kind) -> object:
    try:
        if kind is Kind.FLOAT:
            return float(text)
        if kind is Kind.INT_BOOL and text.lower() in ("true", "false"):
            return 1 if text.lower() == "true" else 0
        return int(text)
    except ValueError:
        raise FlagError(f"Invalid option value. Got {text}") from None


def convert(flag: Flag, text: str | None) -> object:
    """The value of one occurrence of ``flag`` with argument ``text`` (None: no argument).

    Raises:
        FlagError: the reason Triton gives (without the 'Bad option' line).
    """
    if flag.kind is Kind.NONE:
        value: object = True
    elif text is None:  # pragma: no cover - the tokenizer always supplies one
        raise FlagError("missing argument")
    elif flag.kind is Kind.BOOL:
        value = parse_bool(text)
    elif flag.kind is Kind.STR:
        value = text
    else:
        value = _number(text, flag.kind)
    if flag.check is not None:
        value = flag.check(value)
    return value


# ---------------------------------------------------------- Triton's value checks
def one_of(flag: str, *allowed: str, lower: bool = True) -> Callable[[object], object]:
    """A check: the value (lowercased unless ``lower`` is False) is one of ``allowed``."""

    def check(value: object) -> object:
        text = str(value).lower() if lower else str(value)
        if text not in allowed:
            raise FlagError(f"invalid argument for {flag}")
        return text

    return check


def in_range(message: str, low: float, high: float = float("inf")) -> Callable[[object], object]:
    """A check: ``low <= value <= high``, else FlagError(message)."""

    def check(value: object) -> object:
        if not low <= value <= high:  # type: ignore[operator]
            raise FlagError(message)
        return value

    return check


def non_empty(message: str) -> Callable[[object], object]:
    """A check: the value is not empty."""

    def check(value: object) -> object:
        if not value:
            raise FlagError(message)
        return value

    return check


def backend_setting(value: object) -> object:
    """``<backend>,<setting>=<value>`` or ``<setting>=<value>`` (``ParseBackendConfigOption``)
    -> (backend, setting, value)."""
    text = str(value)
    comma = text.find(",")
    if comma == 0:
        raise FlagError(
            "No backend specified. --backend-config option format is <backend name>,"
            f"<setting>=<value> or <setting>=<value>. Got {text}"
        )
    eq = text.find("=", comma + 1)
    setting, val = text[comma + 1 : eq], text[eq + 1 :]
    if eq < 0 or not setting or not val:
        raise FlagError(
            f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {text}"
        )
    return (text[:comma] if comma > 0 else "", setting, val)


def metrics_setting(value: object) -> object:
    """``<setting>=<value>`` -> (setting, value) (``ParseMetricsConfigOption``: no comma
    before the ``=``)."""
    text = str(value)
    setting, eq, val = text.partition("=")
    if not eq or "," in setting:
        raise FlagError(f"--metrics-config option format is <setting>=<value>. Got {text}")
    return (setting, val)


def truncated_int(value: object) -> object:
    """A float flag that Triton reads with ``stoi`` (``--metrics-interval-ms``)."""
    return int(value)  # type: ignore[call-overload]


def _lookup(prog: str, key: str, arg: str, table: dict[str, Flag]) -> Flag:
    """The flag ``--key`` names: exact, else the one flag it is a prefix of (getopt)."""
    if key in table:
        return table[key]
    matches = sorted({f.name for n, f in table.items() if n.startswith(key)})
    if len(matches) == 1:
        return table[matches[0]]
    if matches:
        names = " ".join(f"'--{m}'" for m in matches)
        raise FlagError(f"{prog}: option '{arg}' is ambiguous; possibilities: {names}")
    raise FlagError(f"{prog}: unrecognized option '{arg}'")


def _tokens(
    prog: str, argv: list[str], table: dict[str, Flag]
) -> Iterable[tuple[Flag, str | None]]:
    """(flag, argument text) per option of ``argv``, in order.

    Raises:
        FlagError: an unknown, ambiguous or malformed option, or a positional argument.
    """
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            if i < len(argv):
                raise FlagError(f"Unexpected argument: {argv[i]}")
            return
        if not arg.startswith("--"):
            if arg.startswith("-") and arg != "-":
                raise FlagError(f"{prog}: invalid option -- '{arg[1:2]}'")
            raise FlagError(f"Unexpected argument: {arg}")
        key, eq, text = arg[2:].partition("=")
        flag = _lookup(prog, key, arg, table)
        if flag.kind is Kind.NONE:
            if eq:
                raise FlagError(f"{prog}: option '--{flag.name}' doesn't allow an argument")
            yield flag, None
            continue
        if not eq:
            if i >= len(argv):
                raise FlagError(f"{prog}: option '{arg}' requires an argument")
            text = argv[i]
            i += 1
        yield flag, text


def unused_warning(flag: Flag) -> str:
    """The warning line for a given flag triton-mp does not act on."""
    return f"'--{flag.name}' is accepted but {flag.unused}"


def parse(argv: list[str], flags: Iterable[Flag], prog: str = "tritonserver") -> Parsed:
    """Parse ``argv`` (without the program name) against ``flags``.

    Raises:
        FlagError: the message tritonserver prints for this command line.
    """
    table = {f.name: f for f in flags}
    parsed = Parsed(values={f.dest: f.default for f in table.values() if f.dest})
    for f in table.values():
        if f.dest and f.repeat:
            parsed.values[f.dest] = tuple(cast("Iterable[object]", f.default or ()))
    for flag, text in _tokens(prog, argv, table):
        if flag.name == "help":
            parsed.help = True
            continue
        try:
            value = convert(flag, text)
        except FlagError as e:
            raise FlagError(f'Bad option: "--{flag.name}".\n{e}') from None
        if flag.name not in parsed.given:
            parsed.given.append(flag.name)
        if flag.unused:
            if value not in flag.quiet:
                line = unused_warning(flag)
                if line not in parsed.warnings:
                    parsed.warnings.append(line)
            continue
        if flag.repeat:
            parsed.values[flag.dest] = (*parsed.values[flag.dest], value)  # type: ignore[misc]
        else:
            parsed.values[flag.dest] = value
    return parsed


def usage(flags: Iterable[Flag], prog: str = "tritonserver") -> str:
    """tritonserver's usage text: each flag, its argument, and one line of help, by group."""
    lines = [f"Usage: {prog} [options]"]
    group = None
    for f in flags:
        if f.group != group:
            group = f.group
            lines.append(f"\n{group}:")
        arg = f.arg or f.kind.value.strip()
        lines.append(f"  --{f.name}" + (f" <{arg}>" if arg else ""))
        text = f.help + (f" [{f.unused}]" if f.unused else "")
        lines.append(f"\t{text}")
    return "\n".join(lines)
