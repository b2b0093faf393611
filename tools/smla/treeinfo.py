"""Facts about a work tree, below every module that reads or changes one.

A work tree is a git repository: tag BASE_TAG is pristine vLLM at the pin,
branch BRANCH carries one commit per patch, `git config smla.*` records the
upstream commit, release and source kind (TreeInfo), and a stopped `smla
rebase` keeps its state in <git dir>/REBASE_STATE_DIR. This module answers
the questions every command asks first (is it a work tree, where is its
base, is a rebase stopped, what is uncommitted, which commits sit above the
base) and names the states a patch can be in. It imports no command module
and no other tree module (source, treestate, apply ... import it), so the
import graph has no circle: tests/test_layers.py checks that.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from smla import proc
from smla.errors import TreeStateError, cmd

BASE_TAG = "smla-base"
# Where `smla rebase` keeps its state while stopped on a conflict (inside .git).
REBASE_STATE_DIR = "smla-rebase"
BRANCH = "smla"

# What a patch of patches/ is in a tree (apply's report, status's rows).
APPLIED = "applied"  # newly committed by this apply
ALREADY = "already-applied"  # a commit above the base carries it
UPSTREAM = "upstream"  # not needed: the base already holds its change
PENDING = "pending"  # not applied yet


@dataclass(frozen=True)
class TreeInfo:
    """What a work tree's git config says about it."""

    path: Path
    upstream_commit: str
    version: str
    source: str  # "git" or "sdist"
    base: str  # commit id of BASE_TAG

    def to_dict(self) -> dict:
        return {
            "path": str(self.path),
            "upstream_commit": self.upstream_commit,
            "version": self.version,
            "source": self.source,
            "base": self.base,
        }


def base_commit(tree: Path) -> str | None:
    """The commit BASE_TAG names in the repository at `tree`, None when the tag is missing."""
    res = proc.git(tree, "rev-parse", "-q", "--verify", f"refs/tags/{BASE_TAG}^{{commit}}", check=False)
    return res.stdout.strip() if res.returncode == 0 else None


def git_path(tree: Path, rel: str) -> Path:
    """Where `rel` lives inside the tree's git directory (`git rev-parse --git-path`)."""
    path = Path(proc.git_out(tree, "rev-parse", "--git-path", rel))
    return path if path.is_absolute() else tree / path


def read_tree_info(tree: Path) -> TreeInfo | None:
    """TreeInfo of an existing smla work tree, None when `tree` is not one."""
    if not (tree / ".git").exists():
        return None
    cfg = proc.git(tree, "config", "--get-regexp", r"^smla\.", check=False).stdout
    values = dict(line.split(" ", 1) for line in cfg.splitlines() if " " in line)
    base = base_commit(tree)
    if "smla.upstream" not in values or base is None:
        return None
    return TreeInfo(
        path=tree,
        upstream_commit=values["smla.upstream"],
        version=values.get("smla.version", "?"),
        source=values.get("smla.source", "?"),
        base=base,
    )


def lost_base_tag(tree: Path) -> TreeStateError | None:
    """The error for an smla work tree (smla.upstream is set) whose BASE_TAG is gone, with the command
    that puts it back; None when that is not the case. Every command that meets such a tree says so
    (status, apply, fetch, clean), instead of calling it "not an smla work tree"."""
    if not (tree / ".git").exists() or read_tree_info(tree) is not None:
        return None
    upstream = proc.git(tree, "config", "--get", "smla.upstream", check=False).stdout.strip()
    if not upstream:
        return None
    base = _base_candidate(tree, upstream)
    restore = (f"put it back with {cmd('git', '-C', tree, 'tag', BASE_TAG, base)}"
               if base else f"tag the commit that holds pristine vLLM: {cmd('git', '-C', tree, 'tag', BASE_TAG, '<commit>')}")
    return TreeStateError(
        f"work tree {tree} lost its {BASE_TAG} tag (the pristine vLLM commit the series sits on)",
        hint=f"{restore}, then {cmd('smla', 'status')}; or throw the tree away with "
             f"{cmd('smla', 'clean', '--discard')} and run {cmd('smla', 'patch')}",
    )


def _base_candidate(tree: Path, upstream: str) -> str | None:
    """The base commit of a tree whose tag is gone: the upstream commit itself (git source), else the
    newest commit whose message records `Upstream-Commit: <upstream>` (an sdist snapshot)."""
    found = proc.git(tree, "rev-parse", "-q", "--verify", "--end-of-options", f"{upstream}^{{commit}}", check=False)
    if found.returncode == 0:
        return found.stdout.strip()
    log_ = proc.git(tree, "log", "--format=%H", f"--grep=^Upstream-Commit: {upstream}", "HEAD", check=False)
    ids = log_.stdout.split()
    return ids[0] if ids else None


def rebase_in_progress(tree: Path) -> bool:
    """True while a `smla rebase` is stopped in `tree` (its state file exists)."""
    if not (tree / ".git").exists():
        return False
    return git_path(tree, f"{REBASE_STATE_DIR}/state.json").is_file()


def require_tree(tree: Path, *, during_rebase: bool = False) -> TreeInfo:
    """The tree's TreeInfo; refuses a missing tree and, unless `during_rebase`, a stopped rebase."""
    info = read_tree_info(tree)
    lost = lost_base_tag(tree) if info is None else None
    if lost is not None:
        raise lost
    if info is None:
        raise TreeStateError(f"no smla work tree at {tree}",
                             hint=f"run {cmd('smla', 'fetch')} (or {cmd('make', 'patch')}) first")
    if not during_rebase and rebase_in_progress(tree):
        raise TreeStateError(
            f"a `smla rebase` is stopped in {tree}",
            hint=f"finish it with {cmd('smla', 'rebase', '--continue')} or undo it with {cmd('smla', 'rebase', '--abort')}",
        )
    return info


def commits_above_base(tree: Path) -> list[tuple[str, str]]:
    """(commit id, subject) of each commit on the branch above the base, oldest first."""
    out = proc.git(tree, "log", "--reverse", "--format=%H%x00%s", f"{BASE_TAG}..HEAD").stdout
    return [tuple(line.split("\0", 1)) for line in out.splitlines() if line]  # type: ignore[misc]


def commit_all(tree: Path) -> str:
    """The commands that commit every uncommitted change, new (untracked) files too: what hints
    say (`git commit -a` leaves new files out)."""
    return f"{cmd('git', '-C', tree, 'add', '-A')}, then {cmd('git', '-C', tree, 'commit')}"


def dirty_files(tree: Path) -> list[str]:
    out = proc.git(tree, "status", "--porcelain", "--untracked-files=all").stdout
    return [line[3:] for line in out.splitlines() if line.strip()]
