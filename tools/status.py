"""`status`: where the work tree stands against the pin and the series."""
from __future__ import annotations

from pathlib import Path

from tools import proc
from tools.apply import ALREADY, PENDING, dirty_files, match_series, require_tree
from tools.errors import ExportError
from tools.export import render
from tools.pin import Pin
from tools.series import Series


def status(pin: Pin, tree: Path, series: Series) -> dict:
    """A JSON-ready description of the tree: base, patches, local edits."""
    info = require_tree(tree)
    applied, extra = match_series(series, tree)
    patches = []
    for p in series.patches:
        state = ALREADY if p.name in applied else PENDING
        if state == PENDING:
            rev = proc.git(tree, "apply", "--check", "-R", "--", p.path.resolve(), check=False)
            if rev.returncode == 0:
                state = "upstream"
        patches.append({"name": p.name, "subject": p.subject, "state": state})
    try:
        rendered = render(tree)
    except ExportError:
        rendered = {}
    on_disk = {p.name: p.path.read_bytes() for p in series.patches}
    # Commits whose exported form differs from patches/ (edited or new).
    unexported = sorted(n for n, data in rendered.items() if on_disk.get(n) != data)
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
        "unexported": unexported,
    }
