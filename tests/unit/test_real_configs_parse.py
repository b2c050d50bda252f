"""Real-world config.pbtxt files parse into our generated ModelConfig.

The corpus is /work/shared/reference/configs (next to the repository, not part of it; the tests
skip when it is absent). SOURCES.md there records, per file, whether a stock text_format parser
accepts it. Files marked TEMPLATED there contain unfilled placeholders on purpose: their raw
parse is a strict xfail carrying SOURCES.md's explanation, and a second test fills the
placeholders with dummy values and requires a clean parse. Where tritonclient is installed, our
parse must also give the same bytes as its parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import text_format

from triton_mp._proto import model_config_pb2

CONFIGS_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "configs"
SOURCES_MD = CONFIGS_DIR / "SOURCES.md"


@dataclass(frozen=True)
class SourceRow:
    """One row of the SOURCES.md table."""

    file_id: str
    """The corpus id, e.g. ``F28``."""
    features: str
    """The "features exercised" cell; ``TEMPLATED`` marks files with placeholders."""
    parse: str
    """The "parse" cell: ``OK`` or ``FAIL (...)`` with the reason."""

    @property
    def templated(self) -> bool:
        return "TEMPLATED" in self.features and not self.parse.startswith("OK")


def _read_sources() -> dict[str, SourceRow]:
    if not SOURCES_MD.is_file():
        return {}
    rows: dict[str, SourceRow] = {}
    for line in SOURCES_MD.read_text(encoding="utf-8").splitlines():
        if not re.match(r"^\| F\d+ \|", line):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        file_name = cells[1].strip("`")
        rows[file_name] = SourceRow(file_id=cells[0], features=cells[-2], parse=cells[-1])
    return rows


SOURCES = _read_sources()
CONFIG_FILES = sorted(CONFIGS_DIR.glob("*.pbtxt")) if CONFIGS_DIR.is_dir() else []


def _raw_case(path: Path) -> object:
    row = SOURCES.get(path.name)
    if row is not None and row.templated:
        reason = f"{row.file_id} is a template on purpose (SOURCES.md): {row.parse}"
        mark = pytest.mark.xfail(raises=text_format.ParseError, reason=reason, strict=True)
        return pytest.param(path, id=path.name, marks=mark)
    return pytest.param(path, id=path.name)


def _skip_if_no_corpus() -> None:
    if not CONFIG_FILES:
        pytest.skip("config corpus not present (../shared/reference/configs beside the clone)")


def _parse_ours(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _assert_same_as_tritonclient(text: str, ours: model_config_pb2.ModelConfig) -> None:
    try:
        from tritonclient.grpc import model_config_pb2 as tc_config
    except ImportError:
        return
    theirs = text_format.Parse(text, tc_config.ModelConfig())
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(
        deterministic=True
    )


def test_corpus_is_listed_in_sources() -> None:
    """Every corpus file has a SOURCES.md row, so no expected failure can go unexplained."""
    _skip_if_no_corpus()
    unlisted = [p.name for p in CONFIG_FILES if p.name not in SOURCES]
    assert unlisted == []


@pytest.mark.parametrize("path", [_raw_case(p) for p in CONFIG_FILES] or [None])
def test_real_config_parses(path: Path | None) -> None:
    _skip_if_no_corpus()
    assert path is not None
    text = path.read_text(encoding="utf-8")
    ours = _parse_ours(text)
    _assert_same_as_tritonclient(text, ours)


def _fill_template(text: str) -> str:
    """Put dummy values where the corpus templates have placeholders.

    Two styles occur (SOURCES.md, "Two placeholder styles"): ``${var}`` (TensorRT-LLM
    fill_template.py) and ``#VAR`` (WeNet, filled by sed). Placeholders inside quoted strings
    are valid text already and stay as they are.
    """
    text = re.sub(r"(data_type:\s*)\$\{[^}]*\}", r"\1TYPE_FP32", text)
    text = re.sub(r'(?<!")\$\{[^}]*\}(?!")', "1", text)
    text = text.replace("TYPE_#DTYPE", "TYPE_FP32")
    return re.sub(r"(?<=[\[\s,])#[A-Za-z_]\w*", "1", text)


TEMPLATED_FILES = [p for p in CONFIG_FILES if (row := SOURCES.get(p.name)) and row.templated]


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in TEMPLATED_FILES] or [None])
def test_real_template_parses_once_filled(path: Path | None) -> None:
    _skip_if_no_corpus()
    if path is None:
        pytest.skip("no templated files in the corpus")
    filled = _fill_template(path.read_text(encoding="utf-8"))
    ours = _parse_ours(filled)
    assert ours.input or ours.output
    _assert_same_as_tritonclient(filled, ours)
