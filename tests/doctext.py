"""Reading and rewriting the docs' checked parts (tests/test_docs.py, tests/test_selection.py).

Two kinds of checked part:
- a transcript: a ```console block; each `$ ` line is a command, the lines after it (up to the
  next command) are what it printed;
- a generated section: the lines between `<!-- NAME: generated ... -->` and
  `<!-- end of NAME -->`.
Under `--update-docs` (make docs) the tests write what the code prints now; otherwise they
compare and show the difference.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from gitfixtures import REPO_ROOT

PROMPT = "$ "
FENCE = re.compile(r"^```console\s*$")


@dataclass
class Step:
    command: str
    output: list[str] = field(default_factory=list)


@dataclass
class Transcript:
    path: Path
    start: int  # index of the first line inside the fence
    end: int  # index of the closing fence
    steps: list[Step]


# Docs of GPU runs: their console blocks (if any) show output of a machine the tests do not have.
GPU_DOCS = ("fp8-kv.md", "indexer.md")


def checked_docs() -> list[Path]:
    """The documents whose console blocks are transcripts: README.md and docs/*.md but GPU_DOCS."""
    docs = [p for p in sorted((REPO_ROOT / "docs").glob("*.md")) if p.name not in GPU_DOCS]
    return [REPO_ROOT / "README.md", *docs]


def transcripts(path: Path) -> list[Transcript]:
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            steps: list[Step] = []
            for line in lines[i + 1:j]:
                if line.startswith(PROMPT):
                    steps.append(Step(line[len(PROMPT):]))
                else:
                    assert steps, f"{path.name}:{i + 2}: a console block starts with a `$ ` command"
                    steps[-1].output.append(line)
            out.append(Transcript(path, i + 1, j, steps))
            i = j
        i += 1
    return out


def write_transcripts(path: Path, done: list[tuple[Transcript, list[list[str]]]]) -> None:
    """Put each transcript's new outputs (one list of lines per step) into `path`."""
    lines = path.read_text().splitlines()
    for t, outputs in sorted(done, key=lambda d: -d[0].start):
        body = []
        for step, output in zip(t.steps, outputs):
            body += [PROMPT + step.command, *output]
        lines[t.start:t.end] = body
    path.write_text("\n".join(lines) + "\n")


def _markers(name: str) -> tuple[re.Pattern, str]:
    return re.compile(rf"^<!-- {re.escape(name)}: generated .*-->$"), f"<!-- end of {name} -->"


def section(path: Path, name: str) -> list[str]:
    lines = path.read_text().splitlines()
    begin, end = _markers(name)
    i = next(k for k, line in enumerate(lines) if begin.match(line))
    j = lines.index(end, i)
    return lines[i + 1:j]


def write_section(path: Path, name: str, body: list[str]) -> None:
    lines = path.read_text().splitlines()
    begin, end = _markers(name)
    i = next(k for k, line in enumerate(lines) if begin.match(line))
    j = lines.index(end, i)
    lines[i + 1:j] = body
    path.write_text("\n".join(lines) + "\n")


def check_or_update(path: Path, what: str, expected: list[str], actual: list[str], update: bool,
                    write) -> None:
    """Compare a checked part with the code's output; under --update-docs, `write()` it instead."""
    if update:
        if expected != actual:
            write()
        return
    if expected != actual:
        diff = "\n".join(difflib.unified_diff(expected, actual, f"{path.name} ({what})", "real output",
                                              lineterm=""))
        raise AssertionError(f"{path.relative_to(REPO_ROOT)}: {what} is not what the code prints now "
                             f"(`make docs` rewrites it):\n{diff}")
