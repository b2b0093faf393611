"""Replaying the backed-up patches, in series order, on the temporary branch `smla-rebase`.

Each patch is classified (see rebase/report.py): a plain `git apply
--check` decides unchanged/offsets; a patch that reverse-applies is
upstream; otherwise `git am --3way` merges it (merged), finds nothing left
(upstream) or stops on a conflict. The state is saved after every patch, so
a stop, or an interruption anywhere, can be resumed with `--continue`.
"""
from __future__ import annotations

from pathlib import Path

import unidiff

from smla import gitapply, proc
from smla import series as series_mod
from smla.rebase import state as state_mod
from smla.rebase.report import CONFLICT, MERGED, OFFSETS, UNCHANGED, Outcome
from smla.treeinfo import UPSTREAM

WORK_BRANCH = "smla-rebase"


def run(tree: Path, state: dict, echo) -> tuple[list[Outcome], Outcome | None]:
    """Replay from state["next"]; (all outcomes, the conflicting one or None when all went in).

    The state on disk names the step in flight at every moment: `next` and `at` (the HEAD it starts
    from) are saved before a patch is tried, and again once it went in (rebase/resume.py)."""
    outs = [Outcome.from_dict(o) for o in state["outcomes"]]
    for i in range(state["next"], len(outs)):
        patch = series_mod.parse_patch(state_mod.backed_up_patch(tree, outs[i].name))
        out = outs[i]
        replay_one(tree, patch, out)
        state["outcomes"][i] = out.to_dict()
        if out.outcome == CONFLICT:
            state["next"] = i
            state["stop_head"] = proc.git_out(tree, "rev-parse", "HEAD")
            state.setdefault("stops", []).append(
                {"patch": out.name, "files": out.files, "hunks": out.hunks, "detail": out.detail})
            state_mod.save(tree, state)
            echo(f"  {out.outcome:<10} {out.name}: {', '.join(out.files)}")
            return outs, out
        state["next"] = i + 1
        state["at"] = proc.git_out(tree, "rev-parse", "HEAD")  # where the next step starts (rebase/resume.py)
        state_mod.save(tree, state)
        echo(f"  {out.outcome:<10} {out.name}" + (f" ({'; '.join(out.offsets)})" if out.offsets else ""))
    return outs, None


def replay_one(tree: Path, patch: series_mod.Patch, out: Outcome) -> None:
    path = patch.path.resolve()
    before = proc.git_out(tree, "rev-parse", "HEAD")
    parsed = unidiff.PatchSet(path.read_text(encoding="utf-8"))
    out.new_files_only = bool(len(parsed)) and all(pf.is_added_file for pf in parsed)
    check = proc.git(tree, "apply", "--check", "-v", "--", path, check=False)
    if check.returncode == 0:
        out.offsets = gitapply.hunk_offsets(check.stderr + check.stdout)
        proc.git(tree, "am", "-q", "--keep-cr", "--keep-non-patch", "--committer-date-is-author-date", "--", path)
        out.outcome = OFFSETS if out.offsets else UNCHANGED
        out.commits = 1
        return
    if gitapply.reverse_applies(tree, patch):
        out.outcome = UPSTREAM
        out.detail = "the patch reverse-applies to the new base"
        return
    # --reject makes git report every failing hunk, not only the first.
    rejected = proc.git(tree, "apply", "--check", "--reject", "-v", "--", path, check=False)
    out.hunks = [f.description for f in gitapply.failed_hunks(patch, rejected.stderr)]
    merged = proc.git(tree, "am", "--3way", "--keep-cr", "--keep-non-patch", "--committer-date-is-author-date",
                      "--", path,
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
    text = (merged.stdout + merged.stderr).strip()
    out.detail = next((ln.strip() for ln in text.splitlines() if "CONFLICT" in ln or ln.startswith("error:")),
                      text.splitlines()[-1] if text else "")
    if unmerged:
        failing = [h for h in out.hunks if any(f" of {f} (" in h for f in unmerged)] or out.hunks
        marked = hunks_with_markers(tree, patch, parsed, unmerged)
        if marked:
            clean = [h for h in failing if h not in marked]
            out.hunks = marked
            if clean:
                out.detail += f" (merged without conflict markers: {'; '.join(clean)})"
        else:
            out.hunks = failing
            out.detail += " (no hunk of the patch matches the conflict markers: a file-level conflict)"


def hunks_with_markers(tree: Path, patch: series_mod.Patch, parsed: unidiff.PatchSet, files: list[str]) -> list[str]:
    """The patch's hunks that git could not merge: those not found, merged, outside the conflict blocks.

    The working file is read with every conflict block (<<<<<<< ... >>>>>>>)
    blanked out. A hunk counts as merged when each run of its added lines,
    with the post-image line before and after it (or, for a pure deletion,
    the two lines around the removed run), appears there contiguously;
    otherwise it is one of the conflicting hunks. Empty when the files hold
    no conflict blocks at all (a file-level conflict).
    """
    found: list[str] = []
    for pf in parsed:
        rel = pf.path
        if rel not in files:
            continue
        try:
            work = (tree / rel).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        outside: list[str | None] = []
        inside = False
        for line in work:
            if line.startswith("<<<<<<<"):
                inside = True
            if inside:
                outside.append(None)  # no match may span or touch a conflict block
            else:
                outside.append(line.strip())
            if line.startswith(">>>>>>>"):
                inside = False
        if all(x is not None for x in outside):
            continue
        for index, h in enumerate(pf, 1):
            if not all(_contiguous(outside, needle) for needle in _needles(h)):
                desc = next((x.describe() for x in patch.hunks if x.file == rel and x.index == index), None)
                found.append(desc or f"hunk #{index} of {rel}")
    return found


def _needles(hunk) -> list[list[str]]:
    """Per run of changed lines: the post-image lines that must end up adjacent in a clean merge."""
    lines = list(hunk)
    needles = []
    i = 0
    while i < len(lines):
        if lines[i].is_context:
            i += 1
            continue
        j = i
        while j < len(lines) and not lines[j].is_context:
            j += 1
        run = [ln.value.strip() for ln in lines[i:j] if ln.is_added]
        before = next((ln.value.strip() for ln in reversed(lines[:i]) if not ln.is_removed), None)
        after = next((ln.value.strip() for ln in lines[j:] if not ln.is_removed), None)
        needle = [x for x in (before, *run, after) if x is not None]
        if len(needle) >= 2 or run:
            needles.append(needle)
        i = j
    return needles


def _contiguous(haystack: list[str | None], needle: list[str]) -> bool:
    n = len(needle)
    return any(haystack[k:k + n] == needle for k in range(len(haystack) - n + 1))
