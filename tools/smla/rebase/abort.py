"""`smla rebase --abort`: put a stopped rebase back (rebase/__init__.py starts and finishes one).

The tree returns to its branch, head, base tag and config as before the rebase; the pin file and
patches/ come back from the backup (a commit target), or the line the rebase opened goes again (a
release target: the old line was never touched). What the user made during the stop is kept and
named, never deleted (smla.keep).
"""
from __future__ import annotations

from pathlib import Path

from smla import keep, proc, treeinfo
from smla.project import Project
from smla.rebase import newline, state as state_mod
from smla.rebase.replay import WORK_BRANCH
from smla.rebase.report import Outcome, RebaseResult


def abort(project: Project, tree: Path, *, report_dir: Path | None = None, report_name: str | None = None,
          echo=print) -> RebaseResult:
    """Undo a stopped rebase: pin file, patches/ and the tree as before it."""
    tree = tree.absolute()
    state = state_mod.load(tree)
    state_mod.remember_report(state, report_dir, report_name)
    if state_mod.am_in_progress(tree):
        proc.git(tree, "am", "--quit")
    proc.git(tree, "reset", "-q", "--hard")
    kept = in_tree = keep_untracked(tree, state["orig_head"])
    if state["orig_branch"]:
        proc.git(tree, "checkout", "-q", "-f", "-B", state["orig_branch"], state["orig_head"])
    else:
        proc.git(tree, "checkout", "-q", "-f", "--detach", state["orig_head"])
    if state["orig_branch"] != WORK_BRANCH:
        proc.git(tree, "branch", "-q", "-D", WORK_BRANCH, check=False)
    proc.git(tree, "tag", "-f", treeinfo.BASE_TAG, state["orig_base"])
    for key, value in state["orig_config"].items():
        proc.git(tree, "config", key, value)
    if state.get("opened_line"):  # the line this rebase opened goes again; the old line was never touched
        old_line = Path(state["root"]) / "lines" / state["line"]["from"]
        kept = kept + newline.remove_opened_line(Path(state["opened_line"]), old_line)
    else:
        kept = kept + state_mod.restore_files(tree, Path(state["pin_file"]), Path(state["patches_dir"]),
                                        state["backup_files"])
    state_mod.remove(tree)
    if state.get("tree_created") and not in_tree:  # a tree holding what the user made during the stop stays
        newline.remove_tree(tree)
    elif state.get("tree_created"):
        kept.append(f"{tree} was made by this rebase, but holds files made during the stop: kept")
    outs = [Outcome.from_dict(o) for o in state["outcomes"]]
    result = RebaseResult("aborted", str(tree), state["old"], state["old"], state["target"], outs,
                          state["pin_before"], state["pin_before"], stops=state.get("stops", []), kept=kept)
    result.report_dir, result.report_name = state.get("report", {}).get("dir"), state.get("report", {}).get("name")
    result.line = state.get("line")
    return result


def keep_untracked(tree: Path, orig_head: str) -> list[str]:
    """Untracked files made during the stop stay where they are (smla.keep); one that the original
    branch tracks, where checking it out would overwrite it, is moved aside first. Lines naming each."""
    out = proc.git(tree, "ls-files", "--others", "--exclude-standard", "-z").stdout
    made = sorted(p for p in out.split("\0") if p)
    if not made:
        return []
    tracked = set(proc.git(tree, "ls-tree", "-r", "--name-only", "-z", orig_head).stdout.split("\0"))
    dirs = {d for t in tracked for d in _parents(t)}
    kept = []
    for rel in made:
        if rel in tracked or rel in dirs or any(d in tracked for d in _parents(rel)):
            kept.append(f"{tree / rel} was made during the rebase: kept as {keep.move_aside(tree / rel)}")
        else:
            kept.append(f"{tree / rel} was made during the rebase: kept (untracked)")
    return kept


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
