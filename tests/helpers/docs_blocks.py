"""The fenced blocks of README.md and docs/*.md, each with the marker that says how a test uses
it (docs/developing.md, "The docs are tested"); shared by tests/unit/test_docs.py (the static
checks) and tests/e2e/test_docs.py (the blocks it runs against a server).

A block is the text between two ``` fences; its marker is the HTML comment on the nearest
non-blank line above its opening fence: ``<!-- doc-test: KIND -->`` or
``<!-- doc-test: not run: WHY -->``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

KINDS = {
    "run": "run against a server on the default repository (tests/e2e/test_docs.py)",
    "run-trace": "run against the trace file of a server that traced and stopped",
    "flags": "each `triton-mp start` line parsed by the command line parser",
    "pbtxt": "parsed as a ModelConfig",
    "output": "what a command printed",
    "output-metrics": "a /metrics excerpt, checked against a running server's",
    "setup": "the README's set-up commands, run by .ci/run",
}

_MARKER = re.compile(r"^\s*<!-- doc-test: (.+?) -->\s*$")
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


def doc_pages() -> list[Path]:
    """README.md and every docs/ page whose blocks carry markers (docs/deploy.md's blocks are
    checked by tests/deploy, which renders and validates what it shows)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [p for p in pages if p.name != "deploy.md"]


@dataclass(frozen=True)
class Block:
    """One fenced block.

    Attributes:
        page: the file, relative to the repository root.
        line: the 1-based line of its opening fence.
        lang: the fence's info string ("python", "sh", "" ...).
        marker: the marker's text after ``doc-test:`` ("run", "not run: why"); "" for none.
        text: the lines between the fences, their common indentation removed.
    """

    page: str
    line: int
    lang: str
    marker: str
    text: str

    @property
    def kind(self) -> str:
        return "not run" if self.marker.startswith("not run:") else self.marker

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of one page, in order."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j]]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mm = _MARKER.match(lines[k]) if k >= 0 else None
        rel = str(path.relative_to(ROOT))
        out.append(Block(rel, i + 1, lang, mm.group(1) if mm else "", "\n".join(body) + "\n"))
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for page in doc_pages() for b in blocks(page)]


def prose(path: Path) -> str:
    """A page without its fenced blocks."""
    text = path.read_text()
    return re.sub(r"^\s*```.*?^\s*```\s*$", "", text, flags=re.M | re.S)
