"""Opening a new release line: where a rebase onto a release goes, and its work tree.

`smla rebase --onto 0.33.0` on line 0.26.0 does not move line 0.26.0: it opens lines/0.33.0/ (a
copy of the old line's pin and patches/, rewritten when the rebase finishes) and works in that
line's own tree, work/0.33.0/vllm, made by copying the old line's tree (when it is an smla tree
with no rebase stopped in it; else the rebase fetches the old pin there). `--abort` removes both
again; the old line's pin, patches/ and tree are never written. A commit target, or the line's own
release, keeps the rebase in the line (in place, as a single-line checkout always did).
"""
from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from smla import pin as pin_mod
from smla import proc, treeinfo
from smla.errors import UsageError
from smla.project import Project


def destination(project: Project, kind: str, spec: str, old_pin: pin_mod.Pin) -> Project:
    """The line the rebase writes: a new one named after a release target, else the line itself."""
    if kind != "version" or spec in (old_pin.version, project.line):
        return project
    dest = project.on(spec)
    if dest.line_dir.exists():
        raise UsageError(
            f"the release line {spec} exists already ({project.rel(dest.line_dir)}): a rebase opens a new line",
            hint=f"work on it with `--line {spec}`; to open it again, remove {project.rel(dest.line_dir)} first",
        )
    return dest


class Opening:
    """What `opening_tree` made: `created` (the tree is this run's), `kept` once the rebase started."""

    def __init__(self, created: bool):
        self.created = created
        self.kept = False

    def keep(self) -> None:
        self.kept = True


@contextlib.contextmanager
def opening_tree(project: Project, dest: Project, tree: Path) -> Iterator[Opening]:
    """For a new line whose tree does not exist: a copy of the old line's tree (or nothing: the
    rebase fetches); removed again when the rebase fails before it started (Opening.keep)."""
    if dest.line == project.line or tree.exists():
        yield Opening(False)
        return
    source = project.line_tree
    if treeinfo.read_tree_info(source) is not None and not treeinfo.rebase_in_progress(source):
        shutil.copytree(source, tree, symlinks=True)
        proc.git(tree, "worktree", "prune", check=False)
        proc.git(tree, "update-index", "-q", "--refresh", check=False)  # copies have new stat data
    opening = Opening(True)
    try:
        yield opening
    finally:
        if not opening.kept:
            remove_tree(tree)


def open_line(project: Project, dest: Project, echo) -> Path:
    """lines/<release>/ as a copy of the old line's pin and patches/ (rewritten when the rebase ends)."""
    (dest.patches_dir).mkdir(parents=True)
    shutil.copy2(project.pin_file, dest.pin_file)
    for f in sorted(project.patches_dir.iterdir()):
        if f.is_file():
            shutil.copy2(f, dest.patches_dir / f.name)
    echo(f"opened the release line {project.rel(dest.line_dir)} from {project.rel(project.line_dir)}")
    return dest.line_dir


def remove_opened_line(opened: Path, source: Path) -> list[str]:
    """Undo open_line: remove the copies it made that are still byte-identical to the old line's files
    (`source`, lines/<old>/); anything made or edited there since is kept (smla.keep). Lines naming each."""
    kept = []
    for f in sorted(p for p in opened.rglob("*") if p.is_file()):
        twin = source / f.relative_to(opened)
        if twin.is_file() and twin.read_bytes() == f.read_bytes():
            f.unlink()
        else:
            kept.append(f"{f} was made or edited during the rebase: kept")
    for d in sorted((p for p in opened.rglob("*") if p.is_dir()), reverse=True) + [opened]:
        with contextlib.suppress(OSError):
            d.rmdir()
    return kept


def remove_tree(tree: Path) -> None:
    shutil.rmtree(tree, ignore_errors=True)
    parent = tree.parent
    with contextlib.suppress(OSError):
        parent.rmdir()  # work/<release>/ when the tree was all it held
