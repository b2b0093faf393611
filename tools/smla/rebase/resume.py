"""Picking up a rebase that stopped for a reason other than a conflict.

The state (rebase/state.py) always says which step is in flight: `next` (the
patch being replayed, or len(series) while finishing) and `at` (the commit
that step started from), saved atomically before the step begins. A stop on a
conflict adds `stop_head`. So after Ctrl-C, SIGTERM or SIGKILL at any point
(the first checkout of the new base, inside `git am`, between two patches,
while finishing) `--continue` puts the work branch back at `at`, throws away
only what the interrupted step wrote, and replays from `next`.

`git am --abort` during a conflict stop is handled the same way: the patch's
merge was thrown away, so it is replayed again (and stops on its conflict
again) instead of being counted as dropped.
"""
from __future__ import annotations

from pathlib import Path

from smla import proc, treeinfo
from smla import series as series_mod
from smla.errors import TreeStateError, cmd
from smla.rebase import state as state_mod
from smla.rebase.replay import WORK_BRANCH


def interrupted(state: dict) -> bool:
    """True when no conflict stop is recorded: the last run was cut off mid-step."""
    return state.get("stop_head") is None


def am_aborted(tree: Path, state: dict) -> bool:
    """True when the user ran `git am --abort` at the conflict stop (HEAD back at the stop, no
    `git am` in progress, and the reflog's last entry is git's own "am --abort")."""
    if interrupted(state) or state_mod.am_in_progress(tree):
        return False
    if proc.git_out(tree, "rev-parse", "HEAD") != state["stop_head"]:
        return False
    last = proc.git(tree, "reflog", "-1", "--format=%gs", "HEAD", check=False).stdout.strip()
    return last == "am --abort"


def replay_stopped_patch_again(tree: Path, state: dict) -> str:
    """After `git am --abort`: mark the stopped patch as in flight from the stop; its name."""
    name = state["outcomes"][state["next"]]["name"]
    state["at"] = state["stop_head"]
    state["stop_head"] = None
    state_mod.save(tree, state)
    return name


def rewind(tree: Path, state: dict) -> str:
    """Put `smla-rebase` back at the start of the interrupted step; what is resumed, in words.

    Refuses (nothing changed) when the tree holds changes the step cannot have made: files outside
    the in-flight patch, or any change while finishing (that step writes no tree file)."""
    i, total = state["next"], len(state["outcomes"])
    at = state.get("at") or (state["new_base"] if i == 0 else None)
    if at is None:  # a state written before `at` was recorded
        raise TreeStateError(
            f"the rebase in {tree} was interrupted, and its state does not say where patch {i + 1} began",
            hint=f"undo it with {cmd('smla', 'rebase', '--abort')} and start it again",
        )
    lock = treeinfo.git_path(tree, "index.lock")
    if lock.exists():  # a git command killed with the rebase (SIGKILL) leaves it; git refuses to go on
        raise TreeStateError(
            f"the rebase in {tree} was interrupted while git held its index lock, and {lock} is left behind",
            hint=f"if no git command is running in that tree, remove it ({cmd('rm', lock)}), then "
                 f"{cmd('smla', 'rebase', '--continue')}",
        )
    branch = proc.git(tree, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
    starting = i == 0 and at == state["new_base"] and branch != WORK_BRANCH  # the first checkout
    if state_mod.am_in_progress(tree):
        proc.git(tree, "am", "--quit")  # keeps HEAD and the files; the step is redone below
    dirty = treeinfo.dirty_files(tree)
    if i < total:
        name = state["outcomes"][i]["name"]
        ours = set(series_mod.parse_patch(state_mod.backed_up_patch(tree, name)).files)
        what = f"patch {name}"
    else:
        name, ours, what = None, set(), "the finish (branch, tag, pin and patches/)"
    foreign = [] if starting else [d for d in dirty if _paths(d).isdisjoint(ours)]
    if foreign:
        raise TreeStateError(
            f"the rebase in {tree} was interrupted during {what}, and the tree has changes that step "
            f"did not make: {', '.join(foreign[:5])}" + (" ..." if len(foreign) > 5 else ""),
            hint=f"move or commit them elsewhere (`git -C {tree} status` lists them), then "
                 f"{cmd('smla', 'rebase', '--continue')}; or undo the rebase with {cmd('smla', 'rebase', '--abort')}",
        )
    untracked = proc.git(tree, "ls-files", "--others", "--exclude-standard", "-z").stdout.split("\0")
    for rel in filter(None, untracked):  # written by the interrupted step (checked above)
        (tree / rel).unlink(missing_ok=True)
    proc.git(tree, "checkout", "-q", "-f", "-B", WORK_BRANCH, at)
    left = treeinfo.dirty_files(tree)
    if left:
        raise TreeStateError(f"{tree} still has changes after going back to {at[:12]}: {', '.join(left[:5])}",
                             hint=f"`git -C {tree} status`; or {cmd('smla', 'rebase', '--abort')}")
    return f"resuming the interrupted rebase at {what} (from {at[:12]})"


def _paths(porcelain_path: str) -> set[str]:
    """The path(s) of a `git status --porcelain` entry ("a -> b" for a rename)."""
    return {p.strip().strip('"') for p in porcelain_path.split(" -> ")}
