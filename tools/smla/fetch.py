"""`fetch`: the work tree of vLLM at the pin (the sources themselves: smla.source).

An existing tree is replaced only with `force`, and then only when that
loses no work (treestate.keep_work, checked again right before the swap)
unless `discard` says so too.
"""
from __future__ import annotations

from pathlib import Path

from smla import source, treestate
from smla.errors import UsageError, cmd
from smla.project import Project
from smla.series import load
from smla.treeinfo import TreeInfo


def fetch(project: Project, tree: Path, source_spec: str = "auto", *, force: bool = False, discard: bool = False,
          echo=print) -> TreeInfo:
    if discard and not force:
        raise UsageError("--discard only goes with --force (it lets --force throw away unexported work)",
                         hint=f"{cmd('smla', 'fetch', '--force', '--discard')}")
    guard = None
    if force and not discard:
        guard = treestate.keep_work(lambda: load(project.patches_dir, allow_empty=True))
    return source.fetch(project.pin(), tree, source_spec, force=force, echo=echo, guard=guard)
