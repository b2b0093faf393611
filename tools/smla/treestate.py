"""Does the work tree equal the series? The one answer every command uses.

The work tree (tag `smla-base` + one commit per patch on branch `smla`) and
patches/ can each move on their own: a teammate's patches/ arrives with `git
pull`, a developer commits in the tree. Comparing Subjects cannot tell these
apart; this module compares content and remembers what was applied.

A commit *carries* a patch file when
  - the tree's record (below) says the commit was made from, or exported
    as, exactly these bytes (same sha256), or
  - `git format-patch` of the commit (smla's export options) gives exactly
    the file's bytes.
The tree *equals the series* when, in series order, every patch is carried
by one commit or is already in the base (`upstream`), no other commit sits
above the base, and nothing is uncommitted.

The record: `<git dir>/smla/applied.json`, written by fetch (empty series),
apply and export: the base, HEAD, and per patch its name, sha256 and the
commit that carries it (null: upstream). It says which series state the tree
was built from, so a difference can be put on the right side:
  changed   a patch is new or different in patches/ since the record and no
            commit carries it                           -> patches/ is newer
  stale     a recorded commit carries no current patch  -> patches/ is newer
  edited    a commit carries no patch and is not recorded -> tree work
  dropped   a patch unchanged since the record lost its commit -> tree edit
  pending   not applied yet (fresh tree), or no record to explain why (a
            tree made by an older smla, or its base moved, e.g. by a rebase)
  inexact   applied with fuzz or offsets (`apply --fuzz N`): its commit does
            not export to the file's bytes, so the record says so and the
            commit counts as tree work (`smla export` rewrites the patch)
Kinds (State.kind): in-sync, patches-newer (apply rebuilds), tree-edited
(export saves), diverged (both: refused, with both ways out).

API (all take the tree path and a loaded series.Series):
  compare(tree, series) -> State     the comparison; State.kind, .in_sync,
                                     .tree_work, .patches_newer, .advice()
  require_in_sync(tree, series, what, error=TreeStateError)
                                     raise unless equal (build-wheel, rebase)
  require_at_pin(pin, tree, what, error=TreeStateError)
                                     raise unless the tree's base is the pin's
                                     (the one check: fetch/patch, apply, export,
                                     build-wheel, rebase), with the way out
  check_replaceable(tree, series)    raise if replacing the tree loses work
  keep_work(load_series) -> guard    that check as the guard fetch --force
                                     and clean take
  record(tree, series, carried)      remember {patch name: commit or None}
                                     as the applied state (apply, export)
  record_empty(tree)                 a fresh tree holds no patches (fetch)
  render_commit, FORMAT_PATCH_ARGS
(the tree's plain facts, base tag, commits above it, dirty files: smla.treeinfo)
"""
from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from smla import proc
from smla.errors import SmlaError, TreeStateError, cmd
from smla.fsutil import atomic_write_text
from smla.pin import Pin
from smla.series import Patch, Series
from smla.treeinfo import (BASE_TAG, TreeInfo, base_commit, commit_all, commits_above_base, dirty_files, git_path,
                           read_tree_info, require_tree)

RECORD_VERSION = 1
IN_SYNC = "in-sync"
PATCHES_NEWER = "patches-newer"
TREE_EDITED = "tree-edited"
DIVERGED = "diverged"

FORMAT_PATCH_ARGS = (
    "format-patch",
    "--zero-commit",
    "--no-signature",
    "--no-numbered",
    "--abbrev=12",
    "--no-cover-letter",
    "--no-thread",
)


# ----------------------------------------------------------------- git queries


def render_commit(tree: Path, commit: str) -> bytes:
    """The bytes `smla export` writes for `commit` (b'' for an empty commit)."""
    with proc.git_tmpdir(tree) as tmp:
        proc.git(tree, *FORMAT_PATCH_ARGS, "-o", tmp, "-1", commit)
        files = sorted(Path(tmp).glob("*.patch"))
        return files[0].read_bytes() if files else b""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------- the record


def _record_path(tree: Path) -> Path:
    return git_path(tree, "smla/applied.json")


def read_record(tree: Path) -> dict | None:
    """The record, or None when missing, unreadable or made on another base."""
    try:
        data = json.loads(_record_path(tree).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        return None
    return data if data.get("base") == base_commit(tree) else None


def record(tree: Path, series: Series, carried: Mapping[str, str | None], inexact: frozenset[str] = frozenset()
           ) -> None:
    """Remember that the tree's commits carry `series`: {patch name: commit id, or None = upstream}.
    Patches in `inexact` went in with fuzz or offsets: their commits were made from the file but do
    not export to its bytes."""
    entries = []
    for p in series.patches:
        if p.name in carried:
            entry = {"name": p.name, "sha256": _sha(p.path.read_bytes()), "commit": carried.get(p.name)}
            if p.name in inexact:
                entry["inexact"] = True
            entries.append(entry)
    _write(tree, entries)


def record_empty(tree: Path) -> None:
    """A freshly fetched tree: no patch applied."""
    _write(tree, [])


def _write(tree: Path, entries: list[dict]) -> None:
    data = {
        "version": RECORD_VERSION,
        "base": proc.git_out(tree, "rev-parse", f"{BASE_TAG}^{{commit}}"),
        "head": proc.git_out(tree, "rev-parse", "HEAD"),
        "patches": entries,
    }
    path = _record_path(tree)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


# ----------------------------------------------------------------- comparison


@dataclass
class State:
    tree: Path
    base: str
    head: str
    has_record: bool
    patch_names: list[str]
    commits: list[tuple[str, str]]
    carried: dict[str, str] = field(default_factory=dict)  # patch name -> commit id
    upstream: list[str] = field(default_factory=list)
    changed: dict[str, str] = field(default_factory=dict)  # patch name -> "changed" | "new"
    removed: list[str] = field(default_factory=list)  # recorded patches patches/ no longer lists
    stale: list[tuple[str, str]] = field(default_factory=list)
    edited: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    order_ok: bool = True
    uncommitted: list[str] = field(default_factory=list)
    inexact: list[str] = field(default_factory=list)  # patches whose commit went in with fuzz/offsets

    # -- the questions commands ask

    @property
    def patches_newer(self) -> bool:
        """patches/ holds changes the tree's commits lack (since the recorded state)."""
        return bool(self.changed or self.stale or not self.order_ok)

    @property
    def tree_work(self) -> bool:
        """The tree holds work that is not in patches/ (replacing it would lose it)."""
        return bool(self.edited or self.uncommitted)

    @property
    def missing(self) -> list[str]:
        """Patches no commit carries and the base does not hold, in series order."""
        gone = {*self.changed, *self.dropped, *self.pending}
        return [n for n in self.patch_names if n in gone]

    @property
    def in_sync(self) -> bool:
        return not (self.missing or self.stale or self.edited or self.uncommitted or not self.order_ok)

    @property
    def kind(self) -> str:
        if self.in_sync:
            return IN_SYNC
        if self.edited and (self.patches_newer or self.pending):
            return DIVERGED  # without a record (pending), a changed commit may be either side's
        if self.patches_newer or self.pending:
            return PATCHES_NEWER
        return TREE_EDITED

    def changed_text(self) -> str:
        """'0001-a.patch (changed), 0006-b.patch (new), 0003-c.patch (removed)'."""
        parts = [f"{n} ({how})" for n, how in self.changed.items()] + [f"{n} (removed)" for n in self.removed]
        if not parts and not self.order_ok:
            parts.append("the order in patches/series")
        return ", ".join(parts) or "-"

    def edited_text(self) -> str:
        return ", ".join(f"{c[:12]} {s!r}" for c, s in self.edited) or "-"

    def advice(self) -> str | None:
        """The next command(s) to run; never one that throws work away."""
        t = str(self.tree)
        kind = self.kind
        if kind == IN_SYNC:
            return None
        if kind == DIVERGED:
            return both_ways_out(self, lossless_only=True)
        out = []
        if kind == PATCHES_NEWER:
            if self.uncommitted:
                out.append(f"commit or stash the uncommitted changes in {t}, then")
            out.append(f"{cmd('smla', 'apply')} rebuilds the patch commits from patches/" if self.patches_newer
                       else f"{cmd('smla', 'apply')} applies {', '.join(self.pending)}")
            return " ".join(out)
        if self.uncommitted:
            out.append(f"commit the uncommitted changes ({commit_all(t)}), then "
                       f"{cmd('smla', 'export')}")
        elif self.inexact and len(self.inexact) == len(self.edited):
            out.append(f"{cmd('smla', 'export')} rewrites {', '.join(self.inexact)} from the commits they made "
                       "(applied with fuzz or offsets, they differ from the files)")
        elif self.edited:
            out.append(f"{cmd('smla', 'export')} saves the tree's commits to patches/")
        if self.dropped:
            out.append(f"{cmd('smla', 'apply')} puts back {', '.join(self.dropped)}, or "
                       f"{cmd('smla', 'export', '--prune')} removes "
                       + ("it" if len(self.dropped) == 1 else "them") + " from patches/")
        return "; ".join(out) or None


def both_ways_out(st: State, *, lossless_only: bool = False) -> str:
    """Hint for a tree and a patches/ that both changed: keep both (save the tree's commits on a
    branch, take patches/, cherry-pick them back, export) or, unless `lossless_only`, overwrite
    the changed patches with the tree's commits."""
    t = str(st.tree)
    ids = [c for c, _ in st.edited]
    keep_both = (
        f"{cmd('git', '-C', t, 'branch', '-f', 'smla-saved', 'HEAD')} (keeps them), "
        f"{cmd('git', '-C', t, 'reset', '--keep', BASE_TAG)}, {cmd('smla', 'apply')}, "
        f"{cmd('git', '-C', t, 'cherry-pick', *ids)}, {cmd('smla', 'export')}"
    )
    if lossless_only:
        return f"take patches/ and redo your commits on top: {keep_both}"
    return (
        f"either take patches/ and redo your commits on top: {keep_both}; "
        f"or keep the tree's commits and overwrite {st.changed_text()} in patches/: "
        f"{cmd('smla', 'export', '--force')}"
    )


def compare(tree: Path, series: Series) -> State:
    """Compare the tree's commits above the base with `series` (see the module doc)."""
    base = proc.git_out(tree, "rev-parse", f"{BASE_TAG}^{{commit}}")
    head = proc.git_out(tree, "rev-parse", "HEAD")
    commits = commits_above_base(tree)
    rec = read_record(tree)
    data = {p.name: p.path.read_bytes() for p in series.patches}
    sha = {n: _sha(b) for n, b in data.items()}
    st = State(tree, base, head, rec is not None, list(data), commits, uncommitted=dirty_files(tree))

    rec_entries = rec["patches"] if rec else []
    rec_by_commit = {e["commit"]: e for e in rec_entries if e.get("commit")}
    rec_shas = {e["sha256"]: e for e in rec_entries}
    rec_names = {e["name"]: e for e in rec_entries}

    commit_patch: dict[str, str] = {}
    for cid, subject in commits:
        name = None
        e = rec_by_commit.get(cid)
        if e is not None and not e.get("inexact"):
            name = next((n for n in data if sha[n] == e["sha256"] and n not in st.carried), None)
        if name is None:
            rendered = render_commit(tree, cid)
            name = next((n for n in data if data[n] == rendered and n not in st.carried), None)
        if name is not None:
            st.carried[name] = cid
            commit_patch[cid] = name
        elif e is not None and e.get("inexact"):  # made from the file with fuzz: tree work, not stale
            st.edited.append((cid, subject))
            st.inexact.append(e["name"])
        elif cid in rec_by_commit:
            st.stale.append((cid, subject))
        else:
            st.edited.append((cid, subject))

    order = {n: i for i, n in enumerate(data)}
    seq = [order[commit_patch[c]] for c, _ in commits if c in commit_patch]
    st.order_ok = seq == sorted(seq)

    unexplained: list[Patch] = []
    for p in series.patches:
        if p.name in st.carried:
            continue
        e = rec_shas.get(sha[p.name])
        if e is not None and e.get("commit") is None:
            st.upstream.append(p.name)
        elif e is not None:
            st.dropped.append(p.name)
        else:
            unexplained.append(p)
    in_base = upstream_in_base(tree, base, unexplained)
    for p in unexplained:
        if p.name in in_base:
            st.upstream.append(p.name)
        elif rec_entries:  # the tree was built from an earlier patches/
            st.changed[p.name] = "changed" if p.name in rec_names else "new"
        else:
            st.pending.append(p.name)
    # A recorded patch whose commit was rewritten in the tree (same Subject) is edited, not dropped.
    edited_subjects = {s for _, s in st.edited}
    st.dropped = [p.name for p in series.patches if p.name in st.dropped and p.subject not in edited_subjects]
    st.upstream.sort(key=order.__getitem__)
    current = set(sha.values())
    st.removed = [e["name"] for e in rec_entries
                  if e["name"] not in data and e["sha256"] not in current and e.get("commit")]
    return st


def upstream_in_base(tree: Path, base: str, patches: list[Patch]) -> set[str]:
    """Names of `patches` whose change the base already holds (reverse-applies to it), checked
    in a temporary index: the work tree and its index are not touched."""
    if not patches:
        return set()
    found = set()
    with proc.git_tmpdir(tree) as tmp:
        env = {"GIT_INDEX_FILE": str(tmp / "index")}
        proc.git(tree, "read-tree", base, env=env)
        for p in patches:
            res = proc.git(tree, "apply", "--cached", "--check", "-R", "--", p.path.resolve(), env=env, check=False)
            if res.returncode == 0:
                found.add(p.name)
    return found


# ----------------------------------------------------------------- guards


def require_in_sync(tree: Path, series: Series, what: str, error: type[SmlaError] = TreeStateError) -> State:
    """Raise `error` unless the tree equals the series (for commands that must not build the wrong thing)."""
    st = compare(tree, series)
    if not st.in_sync:
        raise error(f"cannot {what}: {describe(st)}", hint=st.advice())
    return st


def require_at_pin(pin: Pin, tree: Path, what: str, error: type[SmlaError] = TreeStateError, *,
                   during_rebase: bool = False) -> TreeInfo:
    """The tree's TreeInfo when its upstream commit is the pin's; otherwise `error` (patches/ and the
    pin belong together: applying or exporting the series on another base writes the wrong thing),
    with the way out: rebuild the tree at the pin, saving its unexported work first when it has any."""
    info = require_tree(tree, during_rebase=during_rebase)
    err = pin_mismatch(pin, info, what, error)
    if err is not None:
        raise err
    return info


def pin_mismatch(pin: Pin, info: TreeInfo, what: str, error: type[SmlaError] = TreeStateError) -> SmlaError | None:
    """require_at_pin's error (None when the tree is at the pin): `status` shows its hint."""
    if info.upstream_commit == pin.commit:
        return None
    tree = info.path
    t = str(tree)
    rebuild = f"{cmd('smla', 'fetch', '--force')}, then {cmd('smla', 'apply')}"
    if _unexported(tree):
        saved = str(tree.parent / f"{tree.name}-saved-commits")
        hint = (f"the tree holds work not in patches/: save its commits with "
                f"{cmd('git', '-C', t, 'format-patch', '-o', saved, f'{BASE_TAG}..HEAD')} (commit any uncommitted "
                f"change first), rebuild the tree at the pin with {cmd('smla', 'fetch', '--force', '--discard')}, "
                f"then {cmd('smla', 'apply')}, and carry them over with "
                f"`git -C {shlex.quote(t)} am -3 {shlex.quote(saved)}/*.patch`, then {cmd('smla', 'export')}")
    else:
        hint = f"rebuild the tree at the pin (it holds no work that patches/ lacks): {rebuild}"
    return error(f"cannot {what}: work tree {tree} holds vLLM {info.version} ({info.upstream_commit[:12]}), "
                 f"but the pin is {pin.version} ({pin.commit_label()}), and patches/ go with the pin", hint=hint)


def _unexported(tree: Path) -> bool:
    """Does the tree hold uncommitted changes, or commits above the base that no record explains?"""
    rec = read_record(tree)
    recorded = {e.get("commit") for e in rec["patches"]} if rec else set()
    return bool(dirty_files(tree)) or any(c not in recorded for c, _ in commits_above_base(tree))


def describe(st: State) -> str:
    """One sentence: how the tree and patches/ differ."""
    parts = []
    if st.patches_newer:
        parts.append(f"patches/ changed since the tree {st.tree} was built ({st.changed_text()})")
    if st.edited:
        parts.append(f"the tree {st.tree} has commits not in patches/ ({st.edited_text()})"
                     + (f"; {', '.join(st.inexact)} went in with fuzz or offsets" if st.inexact else ""))
    if st.uncommitted:
        shown = ", ".join(st.uncommitted[:5]) + (" ..." if len(st.uncommitted) > 5 else "")
        parts.append(f"the tree {st.tree} has uncommitted changes ({shown})")
    if st.dropped:
        parts.append(f"the tree lacks {', '.join(st.dropped)} (unchanged in patches/)")
    if st.pending:
        parts.append(f"not applied: {', '.join(st.pending)}")
    return "; ".join(parts) or "the tree equals the series"


Guard = Callable[[Path], None]


def keep_work(load_series: Callable[[], Series]) -> Guard:
    """The one guard protocol of commands that replace or remove a tree (fetch --force, clean): a
    callable taking the tree that raises when that would lose work not in patches/ (check_replaceable).
    The series is loaded when the guard runs, only for a tree that exists."""
    return lambda tree: check_replaceable(tree, load_series())


def check_replaceable(tree: Path, series: Series) -> None:
    """Refuse to replace a tree holding work not saved in patches/ (uncommitted or unexported commits).
    A tree that only lags behind patches/ loses nothing and may be replaced."""
    if read_tree_info(tree) is None:
        return
    st = compare(tree, series)
    lost = [f"uncommitted change: {f}" for f in st.uncommitted] + [
        f"commit not in patches/: {c[:12]} {s}" for c, s in st.edited]
    if lost:
        raise TreeStateError(
            f"work tree {tree} holds work that is not in patches/: " + "; ".join(lost[:5])
            + (" ..." if len(lost) > 5 else ""),
            hint=f"save it (commit, then {cmd('smla', 'export')}), or add --discard to throw it away",
        )
