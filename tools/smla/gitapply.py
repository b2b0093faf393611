"""What `git apply` says about a patch: which hunks failed where, which went in at an offset,
and whether the change is already there (it reverse-applies). The one parser of git apply's
output: apply and rebase/replay use it."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from smla import proc
from smla.series import Patch


def reverse_applies(tree: Path, patch: Patch) -> bool:
    """True when the patch's change is already in `tree` (it reverse-applies cleanly)."""
    return proc.git(tree, "apply", "--check", "-R", "--", patch.path.resolve(), check=False).returncode == 0


@dataclass(frozen=True)
class HunkFailure:
    """One place where `git apply` failed: a hunk (file + line) or a whole file."""

    description: str  # "hunk #2 of f.py (@@ ... @@)" or "f.py: No such file or directory"
    file: str
    line: int | None = None

    def __str__(self) -> str:
        return self.description


_FILE_ERRORS = "No such file or directory|already exists in working directory|does not exist in index"


def failed_hunks(patch: Patch, stderr: str) -> list[HunkFailure]:
    """Every failure `git apply [--check] [--reject] -v` reports in `stderr`, described with
    the patch's own hunk headers; in order, without repeats. (The one parser: apply and rebase.)"""
    found: list[HunkFailure] = []
    for m in re.finditer(r"error: patch failed: (.+):(\d+)", stderr):
        file, line = m.group(1), int(m.group(2))
        hunk = patch.hunk_at(file, line)
        found.append(HunkFailure(hunk.describe() if hunk else f"{file} at line {line}", file, line))
    for m in re.finditer(rf"error: (\S+): ({_FILE_ERRORS})", stderr):
        found.append(HunkFailure(f"{m.group(1)}: {m.group(2)}", m.group(1)))
    unique: list[HunkFailure] = []
    for f in found:
        if f.description not in [u.description for u in unique]:
            unique.append(f)
    return unique


def hunk_offsets(text: str) -> list[str]:
    """'file: Hunk #N succeeded at L (offset K lines)' for each hunk git applied off its line."""
    found, current = [], "?"
    for line in text.splitlines():
        m = re.match(r"Checking patch (.+)\.\.\.$", line)
        if m:
            current = m.group(1)
        m = re.match(r"(Hunk #\d+ succeeded at \d+ \(offset -?\d+ lines?\))", line)
        if m:
            found.append(f"{current}: {m.group(1)}")
    return found
