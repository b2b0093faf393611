"""`export`: regenerate patches/ from the commits above the base.

Deterministic: `git format-patch` with a zero commit id in the From line,
no signature, unnumbered subjects, 12-digit abbreviations, no user config;
files are numbered by position (NNNN-subject.patch), written atomically,
identical files are left untouched, stale ones are removed, and `series`
lists them in order. An export with nothing to export is refused.

Guards (smla.treestate): export refuses when patches/ changed since the tree
was built (a pulled patch would be overwritten with the tree's older commit)
unless `force`, and refuses to drop a listed patch no commit carries unless
`prune` (or `force`). Afterwards the tree's record says it equals patches/.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from smla import lock, proc, treestate
from smla.errors import ExportError, SeriesError, TreeStateError, cmd
from smla.fsutil import atomic_write_bytes
from smla.series import load, write_series_file
from smla.treeinfo import BASE_TAG, commits_above_base, dirty_files, require_tree
from smla.treestate import FORMAT_PATCH_ARGS

@dataclass
class ExportResult:
    directory: Path
    names: list[str]
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "directory": str(self.directory),
            "series": self.names,
            "written": self.written,
            "unchanged": self.unchanged,
            "removed": self.removed,
        }


def render(tree: Path) -> dict[str, bytes]:
    """{file name: bytes} of the patches the commits above the base make, in order."""
    if not commits_above_base(tree):
        raise ExportError(
            f"nothing to export: no commits above {BASE_TAG} in {tree}",
            hint="commit your changes in the work tree first (one commit per concern)",
        )
    with proc.git_tmpdir(tree) as tmp:
        proc.git(tree, *FORMAT_PATCH_ARGS, "-o", tmp, f"{BASE_TAG}..HEAD")
        files = sorted(Path(tmp).glob("*.patch"))
        return {f.name: f.read_bytes() for f in files}


def export(
    tree: Path, patches_dir: Path, *, allow_dirty: bool = False, prune: bool = False, force: bool = False,
    during_rebase: bool = False,
) -> ExportResult:
    """Write the commits above the base as patches/ (see the module doc for the guards)."""
    with lock.hold(tree):
        return _export_locked(tree, patches_dir, allow_dirty=allow_dirty, prune=prune, force=force,
                              during_rebase=during_rebase)


def _export_locked(tree: Path, patches_dir: Path, *, allow_dirty: bool, prune: bool, force: bool,
                   during_rebase: bool) -> ExportResult:
    require_tree(tree, during_rebase=during_rebase)
    dirty = dirty_files(tree)
    if dirty and not allow_dirty:
        raise TreeStateError(
            f"work tree {tree} has uncommitted changes ({', '.join(dirty[:5])}); they would not be exported",
            hint="commit them in the work tree (one commit per concern), then export again",
        )
    rendered = render(tree)
    if not force:
        _check_nothing_lost(tree, patches_dir, prune)
    result = ExportResult(patches_dir, list(rendered))
    patches_dir.mkdir(parents=True, exist_ok=True)
    for name, data in rendered.items():
        if atomic_write_bytes(patches_dir / name, data):
            result.written.append(name)
        else:
            result.unchanged.append(name)
    for stale in sorted(patches_dir.glob("*.patch")):
        if stale.name not in rendered:
            stale.unlink()
            result.removed.append(stale.name)
    write_series_file(patches_dir, list(rendered))
    commits = commits_above_base(tree)
    if len(commits) == len(rendered):  # format-patch skips empty and merge commits: then no record
        treestate.record(tree, load(patches_dir, allow_empty=True), dict(zip(rendered, (c for c, _ in commits))))
    return result


def _check_nothing_lost(tree: Path, patches_dir: Path, prune: bool) -> None:
    """Refuse to overwrite patches changed since the tree was built, or to drop listed ones."""
    try:
        current = load(patches_dir, allow_empty=True)
    except SeriesError:
        return  # no (valid) series yet: nothing to lose
    st = treestate.compare(tree, current)
    if st.patches_newer:
        raise ExportError(
            f"patches/ changed since the tree {tree} was built ({st.changed_text()}); exporting would "
            "overwrite them with the tree's older commits",
            hint=(treestate.both_ways_out(st) if st.edited else
                  f"run {cmd('smla', 'apply')} to rebuild the tree from patches/ first; or "
                  f"{cmd('smla', 'export', '--force')} to overwrite them with the tree's commits"),
        )
    # A patch whose commit was edited keeps its Subject (and is rewritten); one whose Subject no
    # commit has any more would disappear from patches/.
    subjects = {s for _, s in commits_above_base(tree)}
    dropped = [p.name for p in current.patches if p.name not in st.carried and p.subject not in subjects]
    if dropped and not prune:
        raise ExportError(
            f"export would drop {', '.join(dropped)} from the series: no commit above the base in {tree} carries "
            + ("it" if len(dropped) == 1 else "them"),
            hint=f"apply the series first ({cmd('smla', 'apply')}), or pass --prune to drop "
                 + ("it" if len(dropped) == 1 else "them") + " (e.g. merged upstream)",
        )
