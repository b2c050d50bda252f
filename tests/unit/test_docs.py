"""README.md and docs/ cannot drift from the code: every fenced block carries a marker saying
which test uses it (docs/developing.md), the blocks that can be checked without a server are
checked here (command lines, config fragments, the set-up commands), every link and path a
page names exists, and every error message a page quotes is asserted by a test.

The blocks marked ``run`` are run against a server by tests/e2e/test_docs.py.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path

import pytest
from google.protobuf import text_format

from tests.helpers.docs_blocks import KINDS, ROOT, Block, all_blocks, doc_pages, prose
from triton_mp._proto import model_config_pb2
from triton_mp.cli.main import config_from_flags, parse_flags

BLOCKS = all_blocks()


def _of(kind: str) -> list[Block]:
    return [b for b in BLOCKS if b.kind == kind]


def test_every_block_says_how_it_is_tested() -> None:
    bad = [
        f"{b}: marker {b.marker!r}"
        for b in BLOCKS
        if b.kind not in KINDS and not (b.kind == "not run" and len(b.marker) > 12)
    ]
    assert not bad, (
        "put <!-- doc-test: KIND --> (or <!-- doc-test: not run: WHY -->) on the line above "
        f"each fenced block; KIND one of {sorted(KINDS)}:\n" + "\n".join(bad)
    )


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250


def _command_lines(block: Block) -> list[str]:
    """The block's commands: continuation lines joined, comments and prompts removed."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    out = []
    for line in joined.splitlines():
        line = line.strip().removeprefix("$ ")
        if line and not line.startswith("#"):
            out.append(line)
    return out


@pytest.mark.parametrize("block", _of("flags"), ids=str)
def test_start_command_lines_parse(block: Block) -> None:
    starts = [c for c in _command_lines(block) if c.startswith("triton-mp start")]
    assert starts, f"{block}: a flags block without a `triton-mp start` line"
    for command in starts:
        argv = shlex.split(command, comments=True)[2:]
        parsed = parse_flags(argv, "triton-mp start")
        assert not parsed.help
        assert not parsed.warnings, f"{block}: {command}: {parsed.warnings}"
        config_from_flags(parsed.values)


@pytest.mark.parametrize("block", _of("pbtxt"), ids=str)
def test_config_fragments_parse(block: Block) -> None:
    text_format.Parse(block.text, model_config_pb2.ModelConfig())


def test_the_two_set_up_commands_are_what_ci_reads() -> None:
    setup = _of("setup")
    assert [b.page for b in setup] == ["README.md", "README.md"]
    server, tests = (b.text.strip() for b in setup)
    assert "\n" not in server, "each set-up command is one line"
    assert "\n" not in tests, "each set-up command is one line"
    assert server.startswith("apt-get update && apt-get install -y ")
    assert re.search(r" && triton-mp start --allow-client-shm=true$", server)
    # the test command brings the system packages too, so it works on its own on a fresh machine
    assert tests.startswith(server.split(" && pip install ")[0] + " && pip install ")
    assert tests.endswith(" && python -m pytest")
    assert "bash scripts/install-perf-analyzer.sh" in server
    # what .ci/run extracts, run through its own function
    script = (ROOT / ".ci/run").read_text()
    fn = script[script.index("readme_command() {") : script.index("\nSERVER_CMD=")]
    got = subprocess.run(
        [
            "bash",
            "-c",
            fn + '\nreadme_command "triton-mp start( --[^&|;]*)?"; '
            'readme_command "python -m pytest"',
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert got == [server, tests]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


@cache
def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", prose(path), flags=re.M)}


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.name)
def test_links_and_paths_exist(page: Path) -> None:
    text = prose(page)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"link {target}: no {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"link {target}: no heading #{anchor} in {dest.name}")
    for path in re.findall(
        r"(?<![\w/.])((?:tests|src|bench|scripts|examples|deploy)/[\w./-]+\w)", text
    ):
        if "*" not in path and not (ROOT / path).exists():
            bad.append(f"path {path} does not exist")
    assert not bad, f"{page.name}:\n" + "\n".join(bad)


# An error message a page quotes: a double-quoted passage of one paragraph's prose (code spans
# left out) that starts with a letter; placeholders (<name>, N, M, ..., a code span) split it
# into the literal pieces a test must assert.
_QUOTE = re.compile(r'(?<![\w"])"([A-Za-z][^"]{12,400}?)"(?!\w)')
_PLACEHOLDER = re.compile(r"<[^>]+>|\.\.\.|\bCODE\b|\b[NMk]\b")


def _quoted_messages(page: Path) -> list[str]:
    out = []
    for paragraph in re.split(r"\n\s*\n", prose(page)):
        text = re.sub(r"`[^`]*`", "CODE", paragraph)
        text = re.sub(r"\s+", " ", text)
        out += [q for q in _QUOTE.findall(text) if " " in q]
    return out


@cache
def _test_strings() -> str:
    """Every string literal of the tests that talk to a server (e2e, integration, and the
    shared helpers), f-strings' literal parts included, joined by NULs."""
    parts: list[str] = []
    files = [
        *ROOT.glob("tests/e2e/*.py"),
        *ROOT.glob("tests/integration/*.py"),
        *ROOT.glob("tests/helpers/*.py"),
    ]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts.append(node.value)
    return "\x00".join(re.sub(r"\s+", " ", p) for p in parts)


def _pieces(quote: str) -> list[str]:
    pieces = [p.strip(" .,;:'") for p in _PLACEHOLDER.split(quote)]
    return [p for p in pieces if len(p) >= 10]


def _asserted(piece: str, corpus: str) -> bool:
    """Whether a test holds the piece whole or, where the test builds the message from parts
    (a prefix, an f-string), each of its parts between brackets, commas and colons."""
    if piece in corpus:
        return True
    parts = [p.strip(" .,;:'") for p in re.split(r"\[[^\]]*\]|, |: ", piece)]
    parts = [p for p in parts if len(p) >= 8]
    return bool(parts) and all(p in corpus for p in parts)


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.name)
def test_quoted_error_messages_are_asserted_by_a_test(page: Path) -> None:
    corpus = _test_strings()
    missing = [
        f'"{q}": {piece!r}'
        for q in _quoted_messages(page)
        for piece in _pieces(q)
        if not _asserted(piece, corpus)
    ]
    assert not missing, (
        f"{page.name} quotes messages no e2e or integration test asserts:\n" + "\n".join(missing)
    )
