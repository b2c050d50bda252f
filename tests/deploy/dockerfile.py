"""The repository's Dockerfile, parsed (dockerfile-parse): its stages and the shell commands
its RUN instructions run, so tests can check the image's rules and run the same commands.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


@dataclass
class Stage:
    """One ``FROM`` stage: its base, its name, and its instructions in order."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        """The values of every ``instruction`` (upper case) of this stage."""
        return [v for i, v in self.instructions if i == instruction]

    def commands(self) -> list[str]:
        """The shell commands of this stage's RUN instructions, split at ``&&``, whitespace
        collapsed (``if ...; fi`` blocks stay whole)."""
        out = []
        for run in self.values("RUN"):
            text = " ".join(run.split())
            if text.startswith("if "):
                head, _, rest = text.partition(" fi")
                out.append(head + " fi")
                text = rest.removeprefix(" &&").strip()
                text = text.removeprefix("(").removesuffix(")")
            out += [c.strip() for c in text.split(" && ") if c.strip()]
        return out


def stages(path: Path = DOCKERFILE) -> list[Stage]:
    """The Dockerfile's stages, with ``ARG`` defaults before the first ``FROM`` substituted
    into each base image."""
    parser = DockerfileParser(str(path))
    global_args: dict[str, str] = {}
    out: list[Stage] = []
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "COMMENT":
            continue
        if instruction == "ARG" and not out:
            name, _, default = value.partition("=")
            global_args[name] = default
            continue
        if instruction == "FROM":
            base, _, name = value.partition(" AS ")
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args.get(m.group(1), ""), base)
            out.append(Stage(base=base.strip(), name=name.strip() or None))
            continue
        out[-1].instructions.append((instruction, value))
    return out


def stage(name: str, path: Path = DOCKERFILE) -> Stage:
    """The stage ``FROM ... AS <name>``."""
    (found,) = [s for s in stages(path) if s.name == name]
    return found


def exec_form(value: str) -> list[str]:
    """An instruction's JSON (exec) form as a list, e.g. ENTRYPOINT ["a", "b"]."""
    parsed: list[str] = json.loads(value)
    return parsed
