"""vLLM's own pre-commit lint over what a line's series adds or changes (issue 33).

The linter is the ruff release the tree's .pre-commit-config.yaml pins (requirements/dev.txt
installs the same release into the test's Python); it runs in the tree, so it reads the tree's
own pyproject.toml. What counts:
  - a file the series adds: every `ruff check` finding, and `ruff format --check`;
  - a file the series changes: the `ruff check` findings on lines the series added or changed
    (upstream's own findings elsewhere in the file are upstream's).
The series is the tree's state (files on disk) against its base, tag smla-base.
`python tests/series_lint.py <tree>` prints the findings as JSON.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

BASE = "smla-base"
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.M)


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.code} {self.message}"


def ruff_bin() -> Path:
    """The ruff of the Python running this (the venv's, from requirements/dev.txt)."""
    return Path(sys.executable).with_name("ruff")


def pinned_ruff(tree: Path) -> str:
    """The ruff version the tree's .pre-commit-config.yaml pins (its ruff-pre-commit rev)."""
    text = (tree / ".pre-commit-config.yaml").read_text()
    m = re.search(r"repo: https://github.com/astral-sh/ruff-pre-commit\s*\n\s*rev: v?([\w.]+)", text)
    if not m:
        raise AssertionError(f"{tree}/.pre-commit-config.yaml pins no ruff-pre-commit rev")
    return m.group(1)


def installed_ruff() -> str:
    out = subprocess.run([str(ruff_bin()), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.split()[-1]


def _diff(tree: Path, *args: str) -> str:
    """`git diff BASE <args>` of the tree's files on disk (no colour, renames as add + delete)."""
    return subprocess.run(["git", "-C", str(tree), "diff", "--no-color", "--no-renames", BASE, *args],
                          capture_output=True, text=True, check=True).stdout


def series_files(tree: Path) -> tuple[list[str], dict[str, set[int]]]:
    """(the .py files the series adds, {changed .py file: the line numbers it adds or changes})."""
    added = sorted(_diff(tree, "--name-only", "--diff-filter=A", "--", "*.py").split())
    changed: dict[str, set[int]] = {}
    for path in _diff(tree, "--name-only", "--diff-filter=M", "--", "*.py").split():
        lines: set[int] = set()
        for start, count in _HUNK.findall(_diff(tree, "-U0", "--", path)):
            lines.update(range(int(start), int(start) + (int(count) if count else 1)))
        changed[path] = lines
    return added, changed


def _ruff(tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ruff_bin()), *args], cwd=tree, capture_output=True, text=True)


def check_findings(tree: Path) -> list[Finding]:
    """`ruff check` findings that belong to the series (see the module docstring)."""
    added, changed = series_files(tree)
    files = added + sorted(changed)
    if not files:
        return []
    proc = _ruff(tree, "check", "--no-cache", "--output-format", "json", "--", *files)
    if proc.returncode not in (0, 1):
        raise AssertionError(f"ruff check failed in {tree}: {proc.stderr[-2000:]}")
    found = []
    for item in json.loads(proc.stdout or "[]"):
        path = Path(item["filename"]).resolve().relative_to(tree.resolve()).as_posix()
        row = item["location"]["row"]
        if path in changed and row not in changed[path]:
            continue
        found.append(Finding(path, row, item["code"] or "syntax", item["message"]))
    return sorted(found)


def format_findings(tree: Path) -> list[str]:
    """The added files `ruff format --check` would reformat."""
    added, _ = series_files(tree)
    if not added:
        return []
    proc = _ruff(tree, "format", "--no-cache", "--check", "--", *added)
    if proc.returncode not in (0, 1):
        raise AssertionError(f"ruff format failed in {tree}: {proc.stderr[-2000:]}")
    return sorted(m for m in re.findall(r"^Would reformat: (.+)$", proc.stdout, re.M))


if __name__ == "__main__":
    t = Path(sys.argv[1])
    print(json.dumps({"check": [asdict(f) for f in check_findings(t)],
                      "format": format_findings(t)}, indent=1))
