"""`apply`: put the series onto the work tree, all or nothing.

What to do is decided by smla.treestate (content, not Subjects):
  in sync                 nothing to do (rerun = no-op)
  patches missing at the  the missing patches are applied on top
  end of the series
  patches/ changed since  the patch commits are rebuilt from the base, and
  the tree was built      the changed patches are named (no work is lost:
                          every commit above the base carries a patch or
                          is recorded from an older patches/)
  both changed            refused, naming the patches and both ways out
  tree has commits not in refused when something would have to be applied
  patches/                (`smla export` saves them first); otherwise a no-op
The patches are applied one by one in a scratch git worktree (one commit per
patch, carrying the patch's header; committer date = author date so commit
ids are reproducible). Only when every patch went in does the real branch
move; on the first failure the tree is exactly as before. The applied state
is then recorded (treestate.record).

Per patch the outcome is one of:
  applied          newly committed
  already-applied  a commit above the base already carries it
  upstream         not needed: the change is already in the source (the
                   patch reverse-applies cleanly), reported, never applied twice
Zero fuzz by default: every context line must match (`git apply` never
fuzzes; `fuzz` > 0 lets that many context lines at each hunk edge differ).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from smla import lock, proc, treestate
from smla.errors import ApplyError, TreeStateError, cmd
from smla.pin import Pin
from smla.series import Patch, Series, check_no_symlinks
from smla.gitapply import failed_hunks, hunk_offsets, reverse_applies
from smla.treeinfo import ALREADY, APPLIED, PENDING, UPSTREAM, commit_all, dirty_files, require_tree


@dataclass
class PatchOutcome:
    name: str
    subject: str
    state: str
    offsets: list[str] = field(default_factory=list)
    commit: str | None = None
    inexact: bool = False  # applied with fuzz/offsets: the commit does not export to the file's bytes

    def to_dict(self) -> dict:
        return {"name": self.name, "subject": self.subject, "state": self.state, "offsets": self.offsets,
                "inexact": self.inexact}


@dataclass
class ApplyResult:
    tree: Path
    base: str
    head: str
    outcomes: list[PatchOutcome]
    rebuilt: bool = False
    changed_patches: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any(o.state == APPLIED for o in self.outcomes)

    def to_dict(self) -> dict:
        return {
            "tree": str(self.tree),
            "base": self.base,
            "head": self.head,
            "changed": self.changed,
            "rebuilt": self.rebuilt,
            "changed_patches": self.changed_patches,
            "patches": [o.to_dict() for o in self.outcomes],
        }


def apply_series(series: Series, tree: Path, *, force: bool = False, fuzz: int = 0, echo=print,
                 pin: Pin | None = None) -> ApplyResult:
    """Apply `series` (see the module doc); `pin`: refuse a tree whose base is not the pin's."""
    with lock.hold(tree):
        return _apply_locked(series, tree, force=force, fuzz=fuzz, echo=echo, pin=pin)


def _apply_locked(series: Series, tree: Path, *, force: bool, fuzz: int, echo, pin: Pin | None) -> ApplyResult:
    info = require_tree(tree) if pin is None else treestate.require_at_pin(pin, tree, "apply patches/")
    proc.sweep_scratch(tree)  # what a killed earlier run left beside the tree
    dirty = dirty_files(tree)
    check_no_symlinks(series, tree)
    st = treestate.compare(tree, series)
    if st.kind == treestate.DIVERGED:
        raise TreeStateError(
            f"both changed: patches/ changed since the tree was built ({st.changed_text()}), and the tree "
            f"{tree} has commits not in patches/ ({st.edited_text()}); refusing to choose",
            hint=treestate.both_ways_out(st),
        )
    names = st.patch_names
    missing = st.missing
    last_carried = max((names.index(n) for n in st.carried), default=-1)
    rebuild = bool(st.stale) or not st.order_ok or any(names.index(n) < last_carried for n in missing)
    if st.edited and (missing or rebuild):
        raise TreeStateError(
            f"work tree {tree} has commits that are not in patches/ ({st.edited_text()}), "
            f"and {', '.join(missing) or 'the series'} would have to be applied under them",
            hint=f"run {cmd('smla', 'export')} to turn them into patches, or {cmd('smla', 'status')} to inspect",
        )
    outcomes = [PatchOutcome(p.name, p.subject, PENDING) for p in series.patches]
    for o in outcomes:
        if o.name in st.carried:
            o.state, o.commit = ALREADY, st.carried[o.name]
        elif o.name in st.upstream:
            o.state = UPSTREAM
    changed = [f"{n} ({how})" for n, how in st.changed.items()] + [f"{n} (removed)" for n in st.removed]
    head = proc.git_out(tree, "rev-parse", "HEAD")
    shown = ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
    if not missing and not rebuild:
        upstream = sum(o.state == UPSTREAM for o in outcomes)
        note = f" ({upstream} already upstream)" if upstream else ""
        echo(f"all {len(outcomes)} patches already applied to {tree}{note}; nothing to do")
        if dirty:  # nothing to apply: uncommitted edits can stay (and be tested: make test, explain)
            echo(f"note: the tree has uncommitted changes ({shown}), not in patches/ until committed "
                 f"({commit_all(tree)}) and exported ({cmd('smla', 'export')})")
        if st.edited:
            echo(f"note: the tree also has {len(st.edited)} commit(s) not in patches/: "
                 f"{cmd('smla', 'export')} saves them")
        else:
            treestate.record(tree, series, {o.name: o.commit for o in outcomes})
        return ApplyResult(tree, info.base, head, outcomes)

    if dirty and not force:
        raise TreeStateError(
            f"work tree {tree} has uncommitted changes ({shown}), and "
            f"{', '.join(missing) or 'the patch commits'} would have to be applied under them",
            hint=f"commit them ({commit_all(tree)}) and run {cmd('smla', 'export')}; "
                 f"or set them aside ({cmd('git', '-C', tree, 'stash', '--include-untracked')}); or apply over them with "
                 f"{cmd('smla', 'apply', '--force')} (through make: {cmd('make', 'patch', 'ARGS=--force')})",
        )
    # Keep the longest run of commits from the base that carries the series in order; rebuild the rest.
    start, kept, j = info.base, 0, 0
    by_commit = {c: n for n, c in st.carried.items()}
    for cid, _ in st.commits:
        while j < len(names) and names[j] in st.upstream:
            j += 1
        if j >= len(names) or by_commit.get(cid) != names[j]:
            break
        start, kept, j = cid, kept + 1, j + 1
    rebuild = kept < len(st.commits)
    if changed:
        echo(f"patches/ changed since the tree was built: {', '.join(changed)}"
             + (f"; rebuilding the patch commits from {names[j] if j < len(names) else 'the end'} on"
                if rebuild else ""))
    elif rebuild:
        echo(f"the tree's commits are out of order with patches/series; rebuilding from "
             f"{names[j] if j < len(names) else 'the end'} on")
    todo = []
    for i, (p, o) in enumerate(zip(series.patches, outcomes)):
        if i >= j:
            o.state, o.commit = PENDING, None
            todo.append((p, o))
    with proc.scratch_worktree(tree, start, prefix=".smla-apply-") as scratch:
        for patch, outcome in todo:
            _apply_one(patch, outcome, scratch, fuzz, tree)
        new_head = proc.git_out(scratch, "rev-parse", "HEAD")
    if new_head != head:
        how = ("reset", "-q", "--keep", new_head) if rebuild else ("merge", "-q", "--ff-only", new_head)
        moved = proc.git(tree, *how, check=False)
        if moved.returncode != 0:
            raise ApplyError(
                f"patches apply, but the work tree could not be updated: {moved.stderr.strip()}",
                hint="your uncommitted changes conflict with the series; commit or discard them",
            )
    inexact = frozenset(o.name for o in outcomes if o.inexact)
    treestate.record(tree, series, {o.name: o.commit for o in outcomes}, inexact=inexact)
    for o in outcomes:
        echo(_line(o))
    if inexact:
        echo(f"note: {', '.join(sorted(inexact))} went in with fuzz or offsets, so the tree no longer equals "
             f"patches/: {cmd('smla', 'export')} rewrites "
             + ("it" if len(inexact) == 1 else "them") + " from the tree (`smla status` shows it)")
    return ApplyResult(tree, info.base, proc.git_out(tree, "rev-parse", "HEAD"), outcomes,
                       rebuilt=rebuild, changed_patches=[c.split(" ", 1)[0] for c in changed])


def _line(o: PatchOutcome) -> str:
    extra = f" ({'; '.join(o.offsets)})" if o.offsets else ""
    return f"  {o.state:<16} {o.name}{extra}"


def _apply_one(patch: Patch, outcome: PatchOutcome, worktree: Path, fuzz: int, tree: Path) -> None:
    ctx = [f"-C{max(0, 3 - fuzz)}"] if fuzz else []
    check = proc.git(worktree, "apply", "--check", "-v", *ctx, "--", patch.path.resolve(), check=False)
    if check.returncode == 0:
        outcome.offsets = hunk_offsets(check.stderr + check.stdout)
        # --keep-non-patch: git strips only "[PATCH]" from the Subject, not a "[Kernel]" / "[Model]"
        # prefix (vLLM-style titles), so export writes the patch back under its own name.
        proc.git(worktree, "am", "-q", "--keep-cr", "--keep-non-patch", "--committer-date-is-author-date",
                 *ctx, "--", patch.path.resolve())
        outcome.state = APPLIED
        outcome.commit = proc.git_out(worktree, "rev-parse", "HEAD")
        if fuzz or outcome.offsets:  # the commit may differ from the file: say so in the record
            outcome.inexact = treestate.render_commit(worktree, outcome.commit) != patch.path.read_bytes()
        return
    if reverse_applies(worktree, patch):
        outcome.state = UPSTREAM
        return
    raise failure(patch, check.stderr, tree, proc.git_out(worktree, "rev-parse", "HEAD"))


def failure(patch: Patch, stderr: str, tree: Path, tried_on: str) -> ApplyError:
    """An ApplyError naming the patch, file, hunk and line from `git apply` stderr. `tried_on`: the
    commit the patch was tried on (the base and the patches before it); the hint shows that commit's
    file, since the tree's HEAD may hold more patches (or an older version of this one)."""
    fails = failed_hunks(patch, stderr)
    at_head = tried_on == proc.git_out(tree, "rev-parse", "HEAD")
    where_file = "the tree's" if at_head else f"the series' state before it (commit {tried_on[:12]}), in"
    if fails and fails[0].line is not None:
        where = f"{fails[0]}, at line {fails[0].line} of {where_file} {fails[0].file}"
    elif fails:
        where = str(fails[0])
    else:
        where = stderr.strip().splitlines()[-1] if stderr.strip() else "?"
    if at_head:
        see = f"See the failing hunk with {cmd('git', '-C', tree, 'apply', '--check', '-v', patch.path.resolve())}"
    elif fails:
        see = (f"The file as the patch found it: {cmd('git', '-C', tree, 'show', f'{tried_on}:{fails[0].file}')}"
               + (f" (line {fails[0].line})" if fails[0].line is not None else ""))
    else:
        see = f"The patch was tried on commit {tried_on[:12]} ({cmd('git', '-C', tree, 'show', '--stat', tried_on)})"
    return ApplyError(
        f"patch {patch.name} ({patch.subject}) does not apply: {where}",
        hint=(
            f"the tree is unchanged. {see}; "
            f"if upstream moved, carry the series with {cmd('smla', 'rebase')}, "
            f"or fix the patch in a tree and {cmd('smla', 'export')}"
        ),
    )
