"""Replaying the backed-up patches, in series order, on the temporary branch `smla-rebase`.

Each patch is classified (see rebase/report.py): a plain `git apply
--check` decides unchanged/offsets; a patch that reverse-applies is
upstream; otherwise `git am --3way` merges it (merged), finds nothing left
(upstream) or stops on a conflict. The state is saved after every patch, so
a stop can be resumed with `--continue`.
"""
from __future__ import annotations

from pathlib import Path

from smla import apply as apply_mod
from smla import gitops, proc
from smla import series as series_mod
from smla.rebase import state as state_mod
from smla.rebase.report import CONFLICT, MERGED, OFFSETS, UNCHANGED, UPSTREAM, Outcome

WORK_BRANCH = "smla-rebase"


def run(tree: Path, state: dict, echo) -> tuple[list[Outcome], Outcome | None]:
    """Replay from state["next"]; (all outcomes, the conflicting one or None when all went in)."""
    outs = [Outcome.from_dict(o) for o in state["outcomes"]]
    for i in range(state["next"], len(outs)):
        patch = series_mod.parse_patch(state_mod.backed_up_patch(tree, outs[i].name))
        out = outs[i]
        replay_one(tree, patch, out)
        state["outcomes"][i] = out.to_dict()
        if out.outcome == CONFLICT:
            state["next"] = i
            state["stop_head"] = proc.git_out(tree, "rev-parse", "HEAD")
            state_mod.save(tree, state)
            echo(f"  {out.outcome:<10} {out.name}: {', '.join(out.files)}")
            return outs, out
        state["next"] = i + 1
        state_mod.save(tree, state)
        echo(f"  {out.outcome:<10} {out.name}" + (f" ({'; '.join(out.offsets)})" if out.offsets else ""))
    return outs, None


def replay_one(tree: Path, patch: series_mod.Patch, out: Outcome) -> None:
    path = patch.path.resolve()
    before = proc.git_out(tree, "rev-parse", "HEAD")
    check = proc.git(tree, "apply", "--check", "-v", "--", path, check=False)
    if check.returncode == 0:
        out.offsets = apply_mod.hunk_offsets(check.stderr + check.stdout)
        proc.git(tree, "am", "-q", "--keep-cr", "--committer-date-is-author-date", "--", path)
        out.outcome = OFFSETS if out.offsets else UNCHANGED
        out.commits = 1
        return
    if apply_mod.reverse_applies(tree, patch):
        out.outcome = UPSTREAM
        out.detail = "the patch reverse-applies to the new base"
        return
    # --reject makes git report every failing hunk, not only the first.
    rejected = proc.git(tree, "apply", "--check", "--reject", "-v", "--", path, check=False)
    out.hunks = gitops.apply_errors(patch, rejected.stderr)
    merged = proc.git(tree, "am", "--3way", "--keep-cr", "--committer-date-is-author-date", "--", path,
                      check=False)
    if merged.returncode == 0:
        if proc.git_out(tree, "rev-parse", "HEAD") == before:
            out.outcome = UPSTREAM
            out.detail = "empty after the three-way merge"
        else:
            out.outcome = MERGED
            out.commits = 1
        return
    out.outcome = CONFLICT
    unmerged = state_mod.unmerged(tree)
    out.files = unmerged or sorted({h.split(" of ", 1)[1].split(" (", 1)[0] for h in out.hunks
                                    if " of " in h}) or list(patch.files)
    if unmerged:
        out.hunks = [h for h in out.hunks if any(f" of {f} (" in h for f in unmerged)] or out.hunks
    text = (merged.stdout + merged.stderr).strip()
    out.detail = next((ln.strip() for ln in text.splitlines() if "CONFLICT" in ln or ln.startswith("error:")),
                      text.splitlines()[-1] if text else "")
