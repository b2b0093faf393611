"""`status`: where the work tree stands against the pin and the series."""
from __future__ import annotations

from pathlib import Path

from smla.apply import ALREADY, PENDING, dirty_files, match_series, require_tree, reverse_applies
from smla.errors import ExportError, TreeStateError
from smla.export import render
from smla.pin import Pin
from smla.series import Series
from smla.source import read_tree_info, rebase_in_progress


def status(pin: Pin, tree: Path, series: Series) -> dict:
    """A JSON-ready description of the tree: base, patches, local edits."""
    info = require_tree(tree, during_rebase=True)
    applied, extra = match_series(series, tree)
    patches = []
    for p in series.patches:
        state = ALREADY if p.name in applied else PENDING
        if state == PENDING and reverse_applies(tree, p):
            state = "upstream"
        patches.append({"name": p.name, "subject": p.subject, "state": state})
    return {
        "tree": str(tree),
        "pin": {"commit": pin.commit, "version": pin.version},
        "tree_upstream_commit": info.upstream_commit,
        "tree_version": info.version,
        "tree_source": info.source,
        "base": info.base,
        "matches_pin": info.upstream_commit == pin.commit,
        "patches": patches,
        "local_commits": [{"commit": c, "subject": s} for c, s in extra],
        "uncommitted": dirty_files(tree),
        "unexported": unexported(tree, series),
        "rebase_in_progress": rebase_in_progress(tree),
    }


def unexported(tree: Path, series: Series) -> list[str]:
    """Patch names whose export from the tree's commits differs from patches/ (edited or new)."""
    try:
        rendered = render(tree)
    except ExportError:  # no commits above the base
        return []
    on_disk = {p.name: p.path.read_bytes() for p in series.patches}
    return sorted(n for n, data in rendered.items() if on_disk.get(n) != data)


def unsaved_work(tree: Path, series: Series) -> list[str]:
    """What replacing `tree` would lose: uncommitted edits and commits not exported to patches/."""
    return [f"uncommitted change: {f}" for f in dirty_files(tree)] + [
        f"committed but not exported: {n}" for n in unexported(tree, series)
    ]


def check_replaceable(tree: Path, series: Series) -> None:
    """Refuse to replace a work tree that holds work not saved in patches/."""
    if read_tree_info(tree) is None:
        return
    lost = unsaved_work(tree, series)
    if lost:
        raise TreeStateError(
            f"work tree {tree} holds work that is not in patches/: " + "; ".join(lost[:5])
            + (" ..." if len(lost) > 5 else ""),
            hint="save it with `smla export` (commit first), or add --discard to throw it away",
        )
