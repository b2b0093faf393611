"""`clean`: remove the work tree (what `make clean` runs).

Only a directory `smla fetch` made, never the toolkit checkout or one holding it, with or without
`discard` (smla.keep, the rule of docs/errors.md). Refused, unless `discard`, for a stopped rebase
and a tree holding work not in patches/ (the guard of treestate.keep_work, the same one `fetch
--force` uses). Scratch worktrees a killed run left beside the tree go with it.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from smla import keep, lock, proc, treestate
from smla.errors import UsageError, cmd
from smla.project import Project
from smla.series import load
from smla.treeinfo import lost_base_tag, rebase_in_progress


def clean(project: Project, tree: Path, *, discard: bool = False) -> bool:
    """Remove `tree`; False when there is none."""
    with lock.hold(tree):
        if not tree.exists():
            return False
        if not discard:
            lost = lost_base_tag(tree)
            if lost is not None:
                raise lost
        keep.require_work_tree(project.root, tree)
        if not discard:
            if rebase_in_progress(tree):
                raise UsageError(f"a `smla rebase` is stopped in {tree}",
                                 hint=f"{cmd('smla', 'rebase', '--abort')} first, or add --discard")
            treestate.keep_work(lambda: load(project.patches_dir, allow_empty=True))(tree)
        if (tree / ".git").is_dir():
            proc.sweep_scratch(tree)
        shutil.rmtree(tree)
        return True
