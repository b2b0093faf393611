"""`status`: where the work tree stands against the pin and the series.

The comparison is smla.treestate's; this module only shapes it for humans
(`text`) and for CI (`--json`, `--check`: exit 0 only when the tree is at the
pin and equals patches/).
"""
from __future__ import annotations

from pathlib import Path

from smla import treestate
from smla.errors import NotInSync, cmd
from smla.pin import Pin
from smla.series import Series
from smla.treeinfo import ALREADY, PENDING, UPSTREAM, rebase_in_progress, require_tree

HEADLINES = {
    treestate.IN_SYNC: "in sync: the tree's commits are exactly patches/",
    treestate.PATCHES_NEWER: "patches/ is newer than the tree (it changed, or was not applied yet)",
    treestate.TREE_EDITED: "the tree has edits not yet exported to patches/",
    treestate.DIVERGED: "both changed: patches/ since the tree was built, and the tree since then",
}


def status(pin: Pin, tree: Path, series: Series) -> dict:
    """A JSON-ready description of the tree: base, patches, local edits, what to do next."""
    info = require_tree(tree, during_rebase=True)
    st = treestate.compare(tree, series)
    patches = []
    for p in series.patches:
        if p.name in st.carried:
            state = ALREADY
        elif p.name in st.upstream:
            state = UPSTREAM
        elif p.name in st.changed:
            state = st.changed[p.name]  # "changed" or "new"
        elif p.name in st.dropped:
            state = "dropped"
        elif p.name in st.pending:
            state = PENDING
        elif p.name in st.inexact:
            state = "fuzzed"  # applied with fuzz/offsets: its commit differs from the file
        else:
            state = "edited"  # its commit was rewritten in the tree
        patches.append({"name": p.name, "subject": p.subject, "state": state, "commit": st.carried.get(p.name)})
    stopped = rebase_in_progress(tree)
    matches_pin = info.upstream_commit == pin.commit and info.version == pin.version
    hint = st.advice()
    if stopped:
        hint = (f"a rebase is stopped: finish it with {cmd('smla', 'rebase', '--continue')} "
                f"or undo it with {cmd('smla', 'rebase', '--abort')}")
    elif info.upstream_commit == pin.commit and info.version != pin.version:
        hint = (f"the pin names the tree's commit {pin.short} but version {pin.version}, and that commit is "
                f"vLLM {info.version}: fix `version` at {pin.where('version')} "
                f"(`git diff vllm-pin.txt` shows local edits)")
    elif not matches_pin:  # the way out apply and export give too (treestate.require_at_pin)
        hint = f"the tree is not at the pin: {treestate.pin_mismatch(pin, info, 'status').hint}"
    return {
        "tree": str(tree),
        "pin": {"commit": pin.commit, "version": pin.version},
        "tree_upstream_commit": info.upstream_commit,
        "tree_version": info.version,
        "tree_source": info.source,
        "base": info.base,
        "matches_pin": matches_pin,
        "state": st.kind,
        "in_sync": st.in_sync and matches_pin and not stopped,
        "recorded": st.has_record,
        "patches": patches,
        "changed_patches": [{"name": n, "change": how} for n, how in st.changed.items()]
        + [{"name": n, "change": "removed"} for n in st.removed],
        "local_commits": [{"commit": c, "subject": s} for c, s in st.edited],
        "stale_commits": [{"commit": c, "subject": s} for c, s in st.stale],
        "uncommitted": st.uncommitted,
        "inexact": st.inexact,
        "hint": hint,
        "rebase_in_progress": stopped,
    }


def check(s: dict) -> None:
    """`status --check`: raise NotInSync (exit 7) unless the tree is at the pin and equals patches/.
    Under --json the status object already printed is the whole output (`reported`)."""
    if s["in_sync"]:
        return
    why = s["state"] if s["matches_pin"] else f"{s['state']}, and the tree is not at the pin"
    err = NotInSync(f"the work tree does not equal patches/ ({why})",
                    hint=s["hint"] or f"{cmd('smla', 'status')} shows the difference")
    err.reported = True
    raise err


def text(s: dict) -> str:
    lines = [
        f"work tree   {s['tree']}",
        f"base        {s['base'][:12]}  vLLM {s['tree_version']} ({s['tree_upstream_commit'][:12]}, "
        f"from {s['tree_source']})",
        f"pin         vLLM {s['pin']['version']} ({s['pin']['commit'][:12]})"
        + ("" if s["matches_pin"] else "   <- the tree is NOT at the pin"),
        f"state       {HEADLINES[s['state']]}",
        "patches",
    ]
    lines += [f"  {p['state']:<16} {p['name']}" for p in s["patches"]]
    removed = [c["name"] for c in s["changed_patches"] if c["change"] == "removed"]
    if removed:
        lines.append("removed from patches/ since the tree was built")
        lines += [f"  {n}" for n in removed]
    if s["stale_commits"]:
        lines.append("commits made from an older patches/ (rebuilt by `smla apply`)")
        lines += [f"  {c['commit'][:12]} {c['subject']}" for c in s["stale_commits"]]
    if s["local_commits"]:
        lines.append("commits not exported to patches/")
        lines += [f"  {c['commit'][:12]} {c['subject']}" for c in s["local_commits"]]
    if s["uncommitted"]:
        lines.append("uncommitted changes in the tree")
        lines += [f"  {f}" for f in s["uncommitted"][:20]]
        if len(s["uncommitted"]) > 20:
            lines.append(f"  ... and {len(s['uncommitted']) - 20} more")
    if not (s["local_commits"] or s["uncommitted"]):
        lines.append("no local edits")
    if s["hint"]:
        lines.append(f"hint: {s['hint']}")
    return "\n".join(lines) + "\n"
