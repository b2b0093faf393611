"""`apply`: put the series onto the work tree, all or nothing.

The patches are applied one by one in a scratch git worktree at the tree's
HEAD (one commit per patch, carrying the patch's header; committer date =
author date so commit ids are reproducible). Only when every patch went in
does the real branch move, by fast-forward; on the first failure the scratch
worktree is dropped and the tree is exactly as before.

Per patch the outcome is one of:
  applied          newly committed
  already-applied  a commit for it is already above the base (rerun = no-op)
  upstream         not needed: the change is already in the source (the
                   patch reverse-applies cleanly), reported, never applied twice
Zero fuzz by default: every context line must match (`git apply` never
fuzzes; `fuzz` > 0 lets that many context lines at each hunk edge differ).
"""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from smla import proc
from smla.errors import ApplyError, TreeStateError
from smla.series import Patch, Series, check_no_symlinks
from smla.source import BASE_TAG, TreeInfo, read_tree_info, rebase_in_progress

APPLIED = "applied"
ALREADY = "already-applied"
UPSTREAM = "upstream"
PENDING = "pending"


@dataclass
class PatchOutcome:
    name: str
    subject: str
    state: str
    offsets: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "subject": self.subject, "state": self.state, "offsets": self.offsets}


@dataclass
class ApplyResult:
    tree: Path
    base: str
    head: str
    outcomes: list[PatchOutcome]

    @property
    def changed(self) -> bool:
        return any(o.state == APPLIED for o in self.outcomes)

    def to_dict(self) -> dict:
        return {
            "tree": str(self.tree),
            "base": self.base,
            "head": self.head,
            "changed": self.changed,
            "patches": [o.to_dict() for o in self.outcomes],
        }


def require_tree(tree: Path, *, during_rebase: bool = False) -> TreeInfo:
    """The tree's TreeInfo; refuses a missing tree and, unless `during_rebase`, a stopped rebase."""
    info = read_tree_info(tree)
    if info is None:
        raise TreeStateError(f"no smla work tree at {tree}", hint="run `smla fetch` (or `make patch`) first")
    if not during_rebase and rebase_in_progress(tree):
        raise TreeStateError(
            f"a `smla rebase` is stopped in {tree}",
            hint="finish it with `smla rebase --continue` or undo it with `smla rebase --abort`",
        )
    return info


def reverse_applies(tree: Path, patch: Patch) -> bool:
    """True when the patch's change is already in `tree` (it reverse-applies cleanly)."""
    return proc.git(tree, "apply", "--check", "-R", "--", patch.path.resolve(), check=False).returncode == 0


def dirty_files(tree: Path) -> list[str]:
    out = proc.git(tree, "status", "--porcelain", "--untracked-files=all").stdout
    return [line[3:] for line in out.splitlines() if line.strip()]


def commits_above_base(tree: Path) -> list[tuple[str, str]]:
    """(commit id, subject) of each commit on the branch above the base, oldest first."""
    out = proc.git(tree, "log", "--reverse", "--format=%H%x00%s", f"{BASE_TAG}..HEAD").stdout
    return [tuple(line.split("\0", 1)) for line in out.splitlines() if line]  # type: ignore[misc]


def match_series(series: Series, tree: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Which series patches have commits above the base, and which commits are not from the series.

    Returns (names of applied patches, extra commits). Commits must be in
    series order; a commit that matches no patch is "extra" (a local edit).
    """
    commits = commits_above_base(tree)
    applied: list[str] = []
    i = 0
    for patch in series.patches:
        if i < len(commits) and commits[i][1] == patch.subject:
            applied.append(patch.name)
            i += 1
    return applied, commits[i:]


def apply_series(series: Series, tree: Path, *, force: bool = False, fuzz: int = 0, echo=print) -> ApplyResult:
    info = require_tree(tree)
    dirty = dirty_files(tree)
    if dirty and not force:
        shown = ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
        raise TreeStateError(
            f"work tree {tree} has uncommitted changes ({shown})",
            hint="commit them and run `smla export`, or discard them, or rerun with --force",
        )
    check_no_symlinks(series, tree)
    applied, extra = match_series(series, tree)
    if extra:
        raise TreeStateError(
            f"work tree {tree} has commits that are not in the series: "
            + "; ".join(f"{c[:12]} {s}" for c, s in extra[:5]),
            hint="run `smla export` to turn them into patches, or `smla status` to inspect",
        )
    outcomes = [
        PatchOutcome(p.name, p.subject, ALREADY if p.name in applied else PENDING) for p in series.patches
    ]
    last_applied = max((i for i, o in enumerate(outcomes) if o.state == ALREADY), default=-1)
    # A patch skipped as upstream on an earlier run has no commit: recognise it again.
    for patch, o in zip(series.patches[:last_applied], outcomes[:last_applied]):
        if o.state == PENDING and reverse_applies(tree, patch):
            o.state = UPSTREAM
    if last_applied >= 0 and any(o.state == PENDING for o in outcomes[:last_applied]):
        raise TreeStateError(
            f"work tree {tree} has later patches applied but not earlier ones",
            hint="run `smla fetch --force` and `smla apply` to start from a clean base",
        )
    pending = [(p, o) for p, o in zip(series.patches, outcomes) if o.state == PENDING]
    if not pending:
        upstream = sum(o.state == UPSTREAM for o in outcomes)
        note = f" ({upstream} already upstream)" if upstream else ""
        echo(f"all {len(outcomes)} patches already applied to {tree}{note}; nothing to do")
        return ApplyResult(tree, info.base, proc.git_out(tree, "rev-parse", "HEAD"), outcomes)

    head = proc.git_out(tree, "rev-parse", "HEAD")
    scratch = Path(tempfile.mkdtemp(prefix=".smla-apply-", dir=tree.parent))
    scratch.rmdir()
    proc.git(tree, "worktree", "add", "-q", "--detach", scratch, head)
    try:
        for patch, outcome in pending:
            _apply_one(patch, outcome, scratch, fuzz)
        new_head = proc.git_out(scratch, "rev-parse", "HEAD")
    finally:
        proc.git(tree, "worktree", "remove", "--force", scratch, check=False)
        shutil.rmtree(scratch, ignore_errors=True)
        proc.git(tree, "worktree", "prune", check=False)
    if new_head != head:
        merged = proc.git(tree, "merge", "-q", "--ff-only", new_head, check=False)
        if merged.returncode != 0:
            raise ApplyError(
                f"patches apply, but the work tree could not be updated: {merged.stderr.strip()}",
                hint="your uncommitted changes conflict with the series; commit or discard them",
            )
    for o in outcomes:
        echo(_line(o))
    return ApplyResult(tree, info.base, proc.git_out(tree, "rev-parse", "HEAD"), outcomes)


def _line(o: PatchOutcome) -> str:
    extra = f" ({'; '.join(o.offsets)})" if o.offsets else ""
    return f"  {o.state:<16} {o.name}{extra}"


def _apply_one(patch: Patch, outcome: PatchOutcome, worktree: Path, fuzz: int) -> None:
    ctx = [f"-C{max(0, 3 - fuzz)}"] if fuzz else []
    check = proc.git(worktree, "apply", "--check", "-v", *ctx, "--", patch.path.resolve(), check=False)
    if check.returncode == 0:
        outcome.offsets = hunk_offsets(check.stderr + check.stdout)
        proc.git(worktree, "am", "-q", "--keep-cr", "--committer-date-is-author-date", *ctx, "--",
                 patch.path.resolve())
        outcome.state = APPLIED
        return
    if reverse_applies(worktree, patch):
        outcome.state = UPSTREAM
        return
    raise failure(patch, check.stderr, worktree)


def failure(patch: Patch, stderr: str, tree: Path | None = None) -> ApplyError:
    """An ApplyError naming the patch, file, hunk and line from `git apply` stderr."""
    m = re.search(r"error: patch failed: (.+):(\d+)", stderr)
    if m:
        file, line = m.group(1), int(m.group(2))
        hunk = patch.hunk_at(file, line)
        where = f"{hunk.describe() if hunk else file}, at line {line} of the tree's {file}"
    else:
        m2 = re.search(r"error: (.+?): (No such file or directory|already exists in working directory|does not exist in index)", stderr)
        where = f"{m2.group(1)}: {m2.group(2)}" if m2 else stderr.strip().splitlines()[-1] if stderr.strip() else "?"
    return ApplyError(
        f"patch {patch.name} ({patch.subject}) does not apply: {where}",
        hint=(
            "the tree is unchanged. See the failing hunk with "
            f"`git -C {_real_tree(tree)} apply --check -v {patch.path.resolve()}`; "
            "if upstream moved, carry the series with `smla rebase`, or fix the patch in a tree and `smla export`"
        ),
    )


def _real_tree(worktree: Path | None) -> str:
    """The main tree of a scratch worktree (what the user should look at)."""
    if worktree is None:
        return "<tree>"
    common = proc.git(worktree, "rev-parse", "--path-format=absolute", "--git-common-dir", check=False)
    return str(Path(common.stdout.strip()).parent) if common.returncode == 0 else str(worktree)


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
