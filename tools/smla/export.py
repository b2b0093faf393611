"""`export`: regenerate patches/ from the commits above the base.

Deterministic: `git format-patch` with a zero commit id in the From line,
no signature, unnumbered subjects, 12-digit abbreviations, no user config;
files are numbered by position (NNNN-subject.patch), written atomically,
identical files are left untouched, stale ones are removed, and `series`
lists them in order. An export with nothing to export is refused.

Guards: export refuses a tree whose base is not the pin's (treestate.require_at_pin: the series
would be written against the wrong base); it validates every patch the commits make before it
writes anything (an empty commit, or one adding non-UTF-8 text, is named with the command that fixes
it); it refuses when patches/ changed since the tree was built (a pulled patch would be overwritten
with the tree's older commit) unless `force`, and to drop a listed patch no commit carries unless
`prune` (or `force`). Under all of them, the rule of smla.keep: a file of patches/ is overwritten or
deleted only when smla wrote those bytes (the tree's record, its commits, `known`), or when `force`
is given and patches/series lists it: a file the series does not list (a colleague's new patch) is
never deleted. Afterwards the tree's record says it equals patches/.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from smla import keep, lock, proc, treestate
from smla.errors import ExportError, SeriesError, TreeStateError, cmd
from smla.fsutil import atomic_write_bytes
from smla.pin import Pin
from smla.series import load, parse_patch, read_series_file, write_series_file
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
    during_rebase: bool = False, pin: Pin | None = None, known: Collection[str] = (),
) -> ExportResult:
    """Write the commits above the base as patches/ (see the module doc for the guards). `pin`: refuse
    a tree not at it; `known`: sha256 of further bytes the caller can restore (a rebase's backup)."""
    with lock.hold(tree):
        return _export_locked(tree, patches_dir, allow_dirty=allow_dirty, prune=prune, force=force,
                              during_rebase=during_rebase, pin=pin, known=known)


def _export_locked(tree: Path, patches_dir: Path, *, allow_dirty: bool, prune: bool, force: bool,
                   during_rebase: bool, pin: Pin | None, known: Collection[str]) -> ExportResult:
    if pin is not None:
        treestate.require_at_pin(pin, tree, "export", during_rebase=during_rebase)
    require_tree(tree, during_rebase=during_rebase)
    dirty = dirty_files(tree)
    if dirty and not allow_dirty:
        raise TreeStateError(
            f"work tree {tree} has uncommitted changes ({', '.join(dirty[:5])}); they would not be exported",
            hint="commit them in the work tree (one commit per concern), then export again",
        )
    rendered = render(tree)
    _validate(tree, patches_dir, rendered)
    if not force:
        _check_nothing_lost(tree, patches_dir, prune)
    _check_only_own_files(tree, patches_dir, rendered, force, known)
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
    if len(commits) == len(rendered):  # format-patch skips merge commits: then no record
        treestate.record(tree, load(patches_dir, allow_empty=True), dict(zip(rendered, (c for c, _ in commits))))
    return result


def _validate(tree: Path, patches_dir: Path, rendered: dict[str, bytes]) -> None:
    """Every patch the commits make must load as part of a series (smla.series), before anything is
    written: a commit that cannot be one is named with the command that fixes it."""
    commits = commits_above_base(tree)
    t = str(tree)
    for i, (name, data) in enumerate(rendered.items()):
        try:
            parse_patch(patches_dir / name, data)
        except SeriesError as exc:
            cid, subject = commits[i] if len(commits) == len(rendered) else ("HEAD", name)
            why = exc.message.split(": ", 1)[-1]
            if "no diff found" in why:
                why = "it changes nothing (an empty commit)"
                hint = (f"drop it with {cmd('git', '-C', t, 'rebase', '-q', '--onto', f'{cid}^', cid)} (or give it "
                        f"content: edit, then {cmd('git', '-C', t, 'commit', '-a', '--amend')} on it), then "
                        f"{cmd('smla', 'export')}")
            elif "not UTF-8" in why:
                where = _non_utf8_file(data)
                why = f"it adds text that is not UTF-8{f' to {where}' if where else ''}"
                hint = (f"re-encode {where or 'that file'} as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), fold that "
                        f"into the commit ({cmd('git', '-C', t, 'commit', '-a', '--fixup', cid)}, then "
                        f"{cmd('git', '-C', t, '-c', 'sequence.editor=:', 'rebase', '-i', '--autosquash', BASE_TAG)}), "
                        f"then {cmd('smla', 'export')}")
            else:
                hint = (f"fix the commit in the tree (edit, {cmd('git', '-C', t, 'commit', '-a', '--fixup', cid)}, "
                        f"{cmd('git', '-C', t, '-c', 'sequence.editor=:', 'rebase', '-i', '--autosquash', BASE_TAG)}), "
                        f"then {cmd('smla', 'export')}")
            raise ExportError(f"commit {cid[:12]} {subject!r} cannot be exported as a patch: {why}; "
                              f"nothing was written to {patches_dir}", hint=hint) from exc


def _non_utf8_file(data: bytes) -> str | None:
    """The file whose diff section holds the first byte that is not UTF-8 (None: the header does)."""
    for section in data.split(b"\ndiff --git a/")[1:]:
        try:
            section.decode("utf-8")
        except UnicodeDecodeError:
            return section.split(b" ", 1)[0].decode("utf-8", "replace")
    return None


def _check_only_own_files(tree: Path, patches_dir: Path, rendered: dict[str, bytes], force: bool,
                          known: Collection[str]) -> None:
    """smla.keep's rule for patches/: overwrite or delete only bytes smla wrote (the tree's record,
    its commits, `known`), or, forced, files patches/series lists."""
    plan: dict[str, bytes | None] = dict(rendered)
    plan.update({p.name: None for p in patches_dir.glob("*.patch") if p.name not in rendered})
    rec = treestate.read_record(tree)
    own = {keep.sha256(d) for d in rendered.values()} | set(known) | (
        {e["sha256"] for e in rec["patches"]} if rec else set())
    try:
        listed = read_series_file(patches_dir)
    except SeriesError:
        listed = []
    # A file neither the series lists nor the tree's commits make is deleted only when it holds what
    # smla recorded under that name: a copy of a patch under a name of the user's is the user's.
    recorded = {e["name"]: {e["sha256"]} for e in rec["patches"]} if rec else {}
    known_at = {n: recorded.get(n, set()) for n, new in plan.items() if new is None and n not in listed}
    bad = keep.unknown(patches_dir, plan, own, known_at)
    theirs = [n for n in bad if n not in listed]
    if theirs:
        hint = (f"list {', '.join(theirs)} in {patches_dir}/series and run {cmd('smla', 'apply')}, or move "
                + ("it" if len(theirs) == 1 else "them") + f" out of {patches_dir}; then {cmd('smla', 'export')}")
    else:
        them = "it" if len(bad) == 1 else "them"
        do = "does" if len(bad) == 1 else "do"
        hint = (f"to keep {them}, make {them} load if {them} {do} not ({cmd('smla', 'status')} says what is wrong) and "
                f"{cmd('smla', 'apply')}; to restore the committed {'file' if len(bad) == 1 else 'files'}, "
                f"{cmd('git', '-C', patches_dir, 'checkout', '--', *bad)}; to overwrite {them} with the tree's "
                f"commits, {cmd('smla', 'export', '--force')}")
    keep.refuse_unknown(patches_dir, plan, own, known_at=known_at, forced=listed if force else (), what="export",
                        error=ExportError, hint=hint)


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
