"""`export`: regenerate patches/ from the commits above the base.

Deterministic: `git format-patch` with a zero commit id in the From line,
no signature, unnumbered subjects, 12-digit abbreviations, no user config;
files are numbered by position (NNNN-subject.patch), written atomically,
identical files are left untouched, stale ones are removed, and `series`
lists them in order. An export with nothing to export is refused.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from smla import proc
from smla.apply import commits_above_base, dirty_files, require_tree
from smla.errors import ExportError, SeriesError, TreeStateError
from smla.fsutil import atomic_write_bytes, atomic_write_text
from smla.series import SERIES_FILE, parse_patch, read_series_file
from smla.source import BASE_TAG

FORMAT_PATCH_ARGS = (
    "format-patch",
    "--zero-commit",
    "--no-signature",
    "--no-numbered",
    "--abbrev=12",
    "--no-cover-letter",
    "--no-thread",
)


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
    with tempfile.TemporaryDirectory() as tmp:
        proc.git(tree, *FORMAT_PATCH_ARGS, "-o", tmp, f"{BASE_TAG}..HEAD")
        files = sorted(Path(tmp).glob("*.patch"))
        return {f.name: f.read_bytes() for f in files}


def export(
    tree: Path, patches_dir: Path, *, allow_dirty: bool = False, prune: bool = False, during_rebase: bool = False
) -> ExportResult:
    """Write the commits above the base as patches/. Refuses to drop a listed
    patch that no commit carries (not applied yet, or gone upstream) unless `prune`."""
    require_tree(tree, during_rebase=during_rebase)
    dirty = dirty_files(tree)
    if dirty and not allow_dirty:
        raise TreeStateError(
            f"work tree {tree} has uncommitted changes ({', '.join(dirty[:5])}); they would not be exported",
            hint="commit them in the work tree (one commit per concern), then export again",
        )
    rendered = render(tree)
    if not prune:
        dropped = _dropped(patches_dir, tree)
        if dropped:
            raise ExportError(
                f"export would drop {', '.join(dropped)} from the series: no commit above the base in {tree} carries "
                + ("it" if len(dropped) == 1 else "them"),
                hint="apply the series first (`smla apply`), or pass --prune to drop them (e.g. merged upstream)",
            )
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
    atomic_write_text(patches_dir / SERIES_FILE, "".join(f"{n}\n" for n in rendered))
    return result


def _dropped(patches_dir: Path, tree: Path) -> list[str]:
    """Listed patches whose subject no commit above the base has."""
    try:
        names = read_series_file(patches_dir)
    except SeriesError:
        return []  # no (valid) series yet: nothing to lose
    subjects = {s for _, s in commits_above_base(tree)}
    dropped = []
    for name in names:
        path = patches_dir / name
        try:
            subject = parse_patch(path).subject if path.is_file() else None
        except SeriesError:
            subject = None
        if subject is None or subject not in subjects:
            dropped.append(name)
    return dropped
