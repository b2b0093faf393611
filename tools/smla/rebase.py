"""`rebase`: carry the patch series onto a newer vLLM.

Flow of `start` (see docs/rebase.md):
1. Check the tree: it must be an smla tree at the pin (fetched here when
   missing), clean, with the series applied and its commits equal to
   patches/ (same `git patch-id`), so no local work can be lost.
2. Bring the new base into the same repository:
   - a commit: fetched from the pin's repo or a `--source` mirror;
   - a release version: its PyPI sdist (sha256-verified) committed as a
     snapshot whose parent is the old base.
   Either way the old base's blobs stay in the repository, so `git am
   --3way` finds every patch's preimage.
3. Back up the pin file and patches/ byte for byte and write the state
   file (<tree>/.git/smla-rebase/state.json) before anything moves.
4. Replay the backed-up patches in order on a temporary branch
   (`smla-rebase`) started at the new base; each patch gets an outcome:
     unchanged   applies as is (`git apply --check`, no offsets)
     offsets     applies, some hunks moved (no fuzz, context intact)
     merged      needed a three-way merge, merged without conflict
     upstream    the change is already in the new base (nothing left)
     conflict    the merge conflicts: the run stops here
   and, after `--continue`, `resolved` (fixed by hand) or `skipped`
   (dropped by the user with `git am --skip`).
5. On success: the original branch moves to the result, the base tag to
   the new base, patches/ is re-exported, the pin rewritten, state removed.

`continue_` resumes after the user resolved the conflict (staged with `git
add`, or already committed with `git am --continue`); `abort` puts the pin
file, patches/ and the tree back as they were.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from smla import apply as apply_mod
from smla import cache, proc, report, source
from smla import export as export_mod
from smla import pin as pin_mod
from smla import series as series_mod
from smla.errors import FetchError, RebaseConflict, TestsFailed, TreeStateError, UsageError
from smla.fsutil import atomic_write_bytes, atomic_write_text
from smla.project import Project
from smla.series import SERIES_FILE

STATE_DIR = source.REBASE_STATE_DIR
WORK_BRANCH = "smla-rebase"
STATE_VERSION = 1

UNCHANGED = "unchanged"
OFFSETS = "offsets"
MERGED = "merged"
UPSTREAM = "upstream"
CONFLICT = "conflict"
RESOLVED = "resolved"
SKIPPED = "skipped"
PENDING = "pending"
DESCRIPTIONS = {
    UNCHANGED: "applied unchanged",
    OFFSETS: "applied with line offsets",
    MERGED: "merged three-way (no conflict)",
    UPSTREAM: "already upstream (dropped from the series)",
    CONFLICT: "CONFLICT",
    RESOLVED: "conflict, resolved by hand",
    SKIPPED: "conflict, dropped by the user (git am --skip)",
    PENDING: "not replayed yet",
}

_VERSION_TARGET = re.compile(r"^[0-9]+(\.[0-9]+)+([a-z0-9.+-]*)$")
_HEX = re.compile(r"^[0-9a-f]{7,40}$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


# --------------------------------------------------------------------------- data


@dataclass
class Target:
    """The new base: what the user asked for and what it resolved to."""

    spec: str
    kind: str  # "commit" or "version"
    commit: str  # full upstream commit id ("" only before resolution)
    version: str
    sdist: str
    sdist_sha256: str
    source: str  # tree source kind after the rebase: "git" or "sdist"
    notes: list[str] = field(default_factory=list)
    archive: str = ""  # local sdist path (version targets)
    fetch_from: str = ""  # repository the commit was fetched from (commit targets)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("archive",)}


@dataclass
class Outcome:
    name: str
    subject: str
    outcome: str = PENDING
    offsets: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # conflicted files
    hunks: list[str] = field(default_factory=list)  # hunks that did not apply as is
    commits: int = 0  # commits this patch produced on the new base
    new_names: list[str] = field(default_factory=list)
    detail: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "Outcome":
        return cls(**d)


@dataclass
class RebaseResult:
    status: str  # "clean", "conflict", "noop", "aborted"
    tree: str
    old: dict
    new: dict
    target: dict
    patches: list[Outcome]
    pin_before: dict
    pin_after: dict | None = None
    stopped_at: str | None = None
    export: dict | None = None
    tests: dict | None = None

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "tree": self.tree,
            "old_base": self.old,
            "new_base": self.new,
            "target": self.target,
            "patches": [p.to_dict() for p in self.patches],
            "counts": self.counts(),
            "pin": {"before": self.pin_before, "after": self.pin_after,
                    "changed": bool(self.pin_after) and self.pin_after != self.pin_before},
            "stopped_at": self.stopped_at,
            "export": self.export,
            "tests": self.tests,
        }

    def counts(self) -> dict:
        out: dict[str, int] = {}
        for p in self.patches:
            out[p.outcome] = out.get(p.outcome, 0) + 1
        return out

    def raise_for_status(self) -> None:
        """RebaseConflict when stopped on a conflict; TestsFailed when --test failed."""
        if self.status == "conflict":
            stopped = next(p for p in self.patches if p.outcome == CONFLICT)
            raise RebaseConflict(
                f"rebase stopped: patch {stopped.name} conflicts in {', '.join(stopped.files) or '?'}",
                hint=_resolve_hint(Path(self.tree)),
            )
        if self.tests is not None and not self.tests["passed"]:
            raise TestsFailed(
                f"the rebase succeeded, but the CPU suite failed against {self.tree} "
                f"(exit {self.tests['returncode']})",
                hint="see the test output above / in the report; fix the series in the tree and `smla export`",
            )


def _resolve_hint(tree: Path) -> str:
    return (
        f"resolve the conflicts in {tree} (edit, then `git -C {tree} add <files>`), "
        "then run `smla rebase --continue`; drop the patch with "
        f"`git -C {tree} am --skip` + `smla rebase --continue`; or give up with `smla rebase --abort`"
    )


# --------------------------------------------------------------------------- entry points


def start(
    project: Project,
    tree: Path,
    onto: str,
    *,
    source_spec: str = "auto",
    upstream_commit: str | None = None,
    run_tests: bool = False,
    echo=print,
) -> RebaseResult:
    """Rebase the series onto `onto` (a commit id or a release version)."""
    tree = tree.absolute()
    if source.rebase_in_progress(tree):
        st = _load_state(tree)
        raise TreeStateError(
            f"a rebase onto {st['target']['spec']} is already in progress in {tree}",
            hint="finish it with `smla rebase --continue`, or undo it with `smla rebase --abort`",
        )
    spec = onto.strip()
    if _VERSION_TARGET.match(spec):
        kind = "version"
    elif _HEX.match(spec.lower()):
        kind = "commit"
        spec = spec.lower()
    else:
        raise UsageError(
            f"--onto {onto!r} is neither a release version (like 0.17.0) nor a commit id (7-40 hex digits)"
        )
    if upstream_commit is not None and (kind != "version" or not _HEX40.match(upstream_commit)):
        raise UsageError("--upstream-commit takes 40 hex digits and goes with a version target only")

    old_pin = project.pin()
    series = series_mod.load(project.patches_dir)
    info = _prepare_tree(project, old_pin, series, tree, source_spec, echo)

    # Resolve and bring in the new base (only adds objects to the repository).
    if kind == "version":
        target = _resolve_version(spec, old_pin, source_spec, upstream_commit, echo)
    else:
        target = _resolve_commit(spec, old_pin, source_spec)
    old = {"base": info.base, "upstream_commit": info.upstream_commit, "version": info.version,
           "source": info.source}
    if target.commit == info.upstream_commit and target.version == info.version:
        echo(f"the tree is already at vLLM {target.version} ({target.commit[:12]}); nothing to rebase")
        outs = [Outcome(p.name, p.subject, UNCHANGED, new_names=[p.name]) for p in series.patches]
        return RebaseResult("noop", str(tree), old, dict(old), target.to_dict(), outs,
                            _pin_dict(old_pin), _pin_dict(old_pin))
    if kind == "version":
        new_base = _snapshot_base(tree, info.base, target, echo)
    else:
        new_base = _fetch_commit(tree, target)

    # Back up everything before the first visible change.
    sdir = _state_dir(tree)
    if sdir.exists():
        shutil.rmtree(sdir)
    (sdir / "patches").mkdir(parents=True)
    (sdir / "pin.txt").write_bytes(project.pin_file.read_bytes())
    backed_up = []
    for f in sorted(project.patches_dir.iterdir()):
        if f.is_file():
            shutil.copy2(f, sdir / "patches" / f.name)
            backed_up.append(f.name)
    branch = proc.git(tree, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip() or None
    state = {
        "version": STATE_VERSION,
        "tree": str(tree),
        "root": str(project.root),
        "pin_file": str(project.pin_file),
        "patches_dir": str(project.patches_dir),
        "backup_files": backed_up,
        "series": series.names(),
        "subjects": {p.name: p.subject for p in series.patches},
        "orig_branch": branch,
        "orig_head": proc.git_out(tree, "rev-parse", "HEAD"),
        "orig_base": info.base,
        "orig_config": {"smla.upstream": info.upstream_commit, "smla.version": info.version,
                        "smla.source": info.source},
        "old": old,
        "new_base": new_base,
        "target": target.to_dict(),
        "pin_before": _pin_dict(old_pin),
        "outcomes": [Outcome(p.name, p.subject).to_dict() for p in series.patches],
        "next": 0,
        "stop_head": None,
    }
    _save_state(tree, state)
    proc.git(tree, "checkout", "-q", "-B", WORK_BRANCH, new_base)
    echo(f"replaying {len(series.patches)} patches onto {target.spec} ({new_base[:12]})")
    return _replay(project, tree, state, run_tests, echo)


def continue_(project: Project, tree: Path, *, run_tests: bool = False, echo=print) -> RebaseResult:
    """Resume a stopped rebase once the user has resolved the conflict."""
    tree = tree.absolute()
    state = _load_state(tree)
    i = state["next"]
    out = Outcome.from_dict(state["outcomes"][i])
    if _am_in_progress(tree):
        unmerged = _unmerged(tree)
        if unmerged:
            raise RebaseConflict(
                f"still unresolved in {tree}: {', '.join(unmerged)}",
                hint=_resolve_hint(tree),
            )
        done = proc.git(tree, "am", "--continue", check=False)
        if done.returncode != 0:
            msg = (done.stdout + done.stderr).strip()
            hint = (f"stage your resolution with `git -C {tree} add <files>`; if nothing of the patch is "
                    f"left (already upstream), run `git -C {tree} am --skip`; then `smla rebase --continue`")
            raise RebaseConflict(f"cannot continue patch {out.name}: {msg.splitlines()[-1] if msg else 'git am failed'}",
                                 hint=hint)
    dirty = apply_mod.dirty_files(tree)
    if dirty:
        raise TreeStateError(
            f"{tree} has uncommitted changes ({', '.join(dirty[:5])}) after the conflict of {out.name}",
            hint="stage and commit the resolution (or `git am --continue`), or discard what does not belong",
        )
    made = _count(tree, state["stop_head"], "HEAD")
    out.commits = made
    out.outcome = RESOLVED if made else SKIPPED
    if not made:
        out.detail = "dropped during the conflict; its old text stays in the rebase report and git history"
    state["outcomes"][i] = out.to_dict()
    state["next"] = i + 1
    state["stop_head"] = None
    _save_state(tree, state)
    echo(f"  {out.outcome:<10} {out.name}")
    return _replay(project, tree, state, run_tests, echo)


def abort(project: Project, tree: Path, *, echo=print) -> RebaseResult:
    """Undo a stopped rebase: pin file, patches/ and the tree as before it."""
    tree = tree.absolute()
    state = _load_state(tree)
    sdir = _state_dir(tree)
    if _am_in_progress(tree):
        proc.git(tree, "am", "--quit")
    proc.git(tree, "reset", "-q", "--hard")
    proc.git(tree, "clean", "-fdq")
    if state["orig_branch"]:
        proc.git(tree, "checkout", "-q", "-f", "-B", state["orig_branch"], state["orig_head"])
    else:
        proc.git(tree, "checkout", "-q", "-f", "--detach", state["orig_head"])
    if state["orig_branch"] != WORK_BRANCH:
        proc.git(tree, "branch", "-q", "-D", WORK_BRANCH, check=False)
    proc.git(tree, "tag", "-f", source.BASE_TAG, state["orig_base"])
    for key, value in state["orig_config"].items():
        proc.git(tree, "config", key, value)
    _restore_files(Path(state["pin_file"]), Path(state["patches_dir"]), sdir, state["backup_files"])
    shutil.rmtree(sdir)
    outs = [Outcome.from_dict(o) for o in state["outcomes"]]
    return RebaseResult("aborted", str(tree), state["old"], state["old"], state["target"], outs,
                        state["pin_before"], state["pin_before"])


# --------------------------------------------------------------------------- the replay


def _replay(project: Project, tree: Path, state: dict, run_tests: bool, echo) -> RebaseResult:
    sdir = _state_dir(tree)
    outs = [Outcome.from_dict(o) for o in state["outcomes"]]
    for i in range(state["next"], len(outs)):
        patch = series_mod.parse_patch(sdir / "patches" / outs[i].name)
        out = outs[i]
        _replay_one(tree, patch, out)
        state["outcomes"][i] = out.to_dict()
        if out.outcome == CONFLICT:
            state["next"] = i
            state["stop_head"] = proc.git_out(tree, "rev-parse", "HEAD")
            _save_state(tree, state)
            echo(f"  {out.outcome:<10} {out.name}: {', '.join(out.files)}")
            return _result(state, outs, "conflict", stopped_at=out.name)
        state["next"] = i + 1
        _save_state(tree, state)
        echo(f"  {out.outcome:<10} {out.name}" + (f" ({'; '.join(out.offsets)})" if out.offsets else ""))
    return _finish(project, tree, state, outs, run_tests, echo)


def _replay_one(tree: Path, patch: series_mod.Patch, out: Outcome) -> None:
    path = patch.path.resolve()
    before = proc.git_out(tree, "rev-parse", "HEAD")
    check = proc.git(tree, "apply", "--check", "-v", "--", path, check=False)
    if check.returncode == 0:
        out.offsets = apply_mod.hunk_offsets(check.stderr + check.stdout)
        proc.git(tree, "am", "-q", "--keep-cr", "--committer-date-is-author-date", "--", path)
        out.outcome = OFFSETS if out.offsets else UNCHANGED
        out.commits = 1
        return
    if proc.git(tree, "apply", "--check", "-R", "--", path, check=False).returncode == 0:
        out.outcome = UPSTREAM
        out.detail = "the patch reverse-applies to the new base"
        return
    out.hunks = _failing_hunks(patch, tree)
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
    unmerged = _unmerged(tree)
    out.files = unmerged or sorted({h.split(" of ", 1)[1].split(" (", 1)[0] for h in out.hunks}) or list(patch.files)
    if unmerged:
        out.hunks = [h for h in out.hunks if any(f" of {f} (" in h for f in unmerged)] or out.hunks
    text = (merged.stdout + merged.stderr).strip()
    out.detail = next((ln.strip() for ln in text.splitlines() if "CONFLICT" in ln or ln.startswith("error:")),
                      text.splitlines()[-1] if text else "")


def _failing_hunks(patch: series_mod.Patch, tree: Path) -> list[str]:
    """Descriptions of every hunk that does not apply as is (git apply --reject lists them all)."""
    res = proc.git(tree, "apply", "--check", "--reject", "-v", "--", patch.path.resolve(), check=False)
    found = []
    for m in re.finditer(r"error: patch failed: (.+):(\d+)", res.stderr):
        hunk = patch.hunk_at(m.group(1), int(m.group(2)))
        desc = hunk.describe() if hunk else f"{m.group(1)} at line {m.group(2)}"
        if desc not in found:
            found.append(desc)
    for m in re.finditer(r"error: (\S+): (does not exist in index|No such file or directory|already exists in working directory)", res.stderr):
        desc = f"{m.group(1)}: {m.group(2)}"
        if desc not in found:
            found.append(desc)
    return found


def _finish(project: Project, tree: Path, state: dict, outs: list[Outcome], run_tests: bool, echo) -> RebaseResult:
    target = state["target"]
    branch = state["orig_branch"] or source.BRANCH
    proc.git(tree, "checkout", "-q", "-B", branch)
    if branch != WORK_BRANCH:
        proc.git(tree, "branch", "-q", "-D", WORK_BRANCH, check=False)
    proc.git(tree, "tag", "-f", source.BASE_TAG, state["new_base"])
    proc.git(tree, "config", "smla.upstream", target["commit"])
    proc.git(tree, "config", "smla.version", target["version"])
    proc.git(tree, "config", "smla.source", target["source"])

    patches_dir = Path(state["patches_dir"])
    if apply_mod.commits_above_base(tree):
        exported = export_mod.export(tree, patches_dir, prune=True, during_rebase=True).to_dict()
    else:  # every patch is upstream now: an empty series
        for stale in patches_dir.glob("*.patch"):
            stale.unlink()
        atomic_write_text(patches_dir / SERIES_FILE, "")
        exported = {"directory": str(patches_dir), "series": [], "written": [], "unchanged": [], "removed": []}
    names = iter(exported["series"])
    for o in outs:
        o.new_names = [next(names, "?") for _ in range(o.commits)]

    pin_file = Path(state["pin_file"])
    old_pin = pin_mod.load(pin_file)
    new_pin = old_pin.with_changes(commit=target["commit"], version=target["version"],
                                   sdist=target["sdist"], sdist_sha256=target["sdist_sha256"])
    pin_mod.save(pin_file, new_pin)
    new = {"base": state["new_base"], "upstream_commit": target["commit"], "version": target["version"],
           "source": target["source"]}
    shutil.rmtree(_state_dir(tree))
    state["new"] = new
    result = _result(state, outs, "clean")
    result.pin_after = _pin_dict(new_pin)
    result.export = exported
    echo(f"rebased onto vLLM {target['version']} ({target['commit'][:12]}); "
         f"pin updated, {len(exported['series'])} patches exported to {patches_dir}")
    if run_tests:
        result.tests = run_cpu_suite(project.root, tree, echo)
    return result


def run_cpu_suite(root: Path, tree: Path, echo=print) -> dict:
    """`pytest -m "not gpu"` of the toolkit against `tree`."""
    echo(f"running the CPU suite against {tree} ...")
    res = proc.run([sys.executable, "-m", "pytest", "-m", "not gpu", "-q", "-p", "no:cacheprovider"],
                   cwd=root, env={"SMLA_TREE": str(tree)}, check=False, timeout=3600)
    tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
    echo(tail)
    return {"command": 'python -m pytest -m "not gpu"', "returncode": res.returncode,
            "passed": res.returncode == 0, "tail": tail}


def _result(state: dict, outs: list[Outcome], status: str, stopped_at: str | None = None) -> RebaseResult:
    new = state.get("new") or {"base": state["new_base"], "upstream_commit": state["target"]["commit"],
                               "version": state["target"]["version"], "source": state["target"]["source"]}
    return RebaseResult(status, state.get("tree", ""), state["old"], new, state["target"], outs,
                        state["pin_before"], None, stopped_at)


# --------------------------------------------------------------------------- preparing


def _prepare_tree(project: Project, pin: pin_mod.Pin, series, tree: Path, source_spec: str, echo):
    info = source.read_tree_info(tree)
    if info is None:
        fetch_source = source_spec if source_spec in ("auto", "git", "sdist") or _is_local_repo(source_spec) else "auto"
        echo(f"no work tree at {tree}: fetching the pinned vLLM {pin.version} first")
        info = source.fetch(pin, tree, fetch_source, echo=echo)
    if info.upstream_commit != pin.commit:
        raise TreeStateError(
            f"work tree {tree} holds vLLM {info.version} ({info.upstream_commit[:12]}), not the pin's "
            f"{pin.version} ({pin.short}); a rebase starts from the pinned base",
            hint="run `smla fetch --force && smla apply` to rebuild the tree at the pin",
        )
    dirty = apply_mod.dirty_files(tree)
    if dirty:
        raise TreeStateError(
            f"work tree {tree} has uncommitted changes ({', '.join(dirty[:5])}); refusing to rebase",
            hint="commit them and `smla export` (or discard them), then rebase",
        )
    result = apply_mod.apply_series(series, tree, echo=lambda *_: None)
    _check_exported(tree, series, result)
    return source.read_tree_info(tree)


def _check_exported(tree: Path, series, result) -> None:
    """The tree's commits must carry exactly the patches of patches/ (same patch-id)."""
    commits = apply_mod.commits_above_base(tree)
    wanted = [p for p, o in zip(series.patches, result.outcomes) if o.state != apply_mod.UPSTREAM]
    ids_tree = [_patch_id(tree, proc.git(tree, "show", "--format=", "-p", c).stdout) for c, _ in commits]
    ids_files = [_patch_id(tree, p.path.read_text()) for p in wanted]
    if ids_tree != ids_files:
        raise TreeStateError(
            f"the commits in {tree} differ from patches/ (edited but not exported?); refusing to rebase",
            hint="run `smla export` to save your edits (or `smla fetch --force && smla apply` to drop them)",
        )


def _patch_id(tree: Path, text: str) -> str:
    out = proc.git(tree, "patch-id", "--stable", input=text).stdout.split()
    return out[0] if out else ""


def _is_local_repo(spec: str) -> bool:
    p = Path(spec).expanduser()
    return p.is_dir() and ((p / ".git").exists() or (p / "HEAD").is_file() and (p / "objects").is_dir())


def _resolve_commit(spec: str, pin: pin_mod.Pin, source_spec: str) -> Target:
    if source_spec == "sdist" or source_spec.endswith((".tar.gz", ".tgz")):
        raise UsageError("a commit target is fetched from git: use --source git|auto or a mirror PATH")
    url = pin.repo if source_spec in ("auto", "git") else source_spec
    commit = spec
    if _is_local_repo(url):
        url = str(Path(url).expanduser().resolve())
        found = proc.git(url, "rev-parse", "-q", "--verify", "--end-of-options", f"{spec}^{{commit}}", check=False)
        if found.returncode != 0:
            raise FetchError(f"commit {spec} is not in {url}", hint="check the id, or update the mirror")
        commit = found.stdout.strip()
    elif not _HEX40.match(spec):
        raise UsageError(f"--onto {spec}: give the full 40-hex commit id when fetching from {url}",
                         hint=f"e.g. `git ls-remote {url} refs/heads/main`")
    notes = [f"vLLM commit {commit[:12]} is not a release: the pin keeps version {pin.version} "
             f"(the last release) and sets sdist = none, so this pin is fetched with git only"]
    return Target(spec, "commit", commit, pin.version, pin_mod.NONE, pin_mod.NONE, "git", notes,
                  fetch_from=url)


def _resolve_version(spec: str, pin: pin_mod.Pin, source_spec: str, given: str | None, echo) -> Target:
    name = f"vllm-{spec}.tar.gz"
    url, sha = cache.pypi_file("vllm", name)
    if not re.fullmatch(r"[0-9a-f]{64}", sha or ""):
        raise FetchError(f"the package index gives no sha256 for {name}")
    archive = cache.fetch(url, cache.cache_dir() / "downloads" / name, sha, what=name)
    short = source.sdist_commit(archive)
    notes = []
    commit = None
    if given:
        if short and not given.startswith(short):
            raise UsageError(f"--upstream-commit {given} does not match the sdist's recorded commit {short}")
        commit = given
        notes.append(f"upstream commit {given[:12]} given with --upstream-commit"
                     + (f" (matches the sdist's {short})" if short else " (the sdist records none)"))
    elif short:
        commit = _full_commit(short, spec, pin, source_spec)
        if commit:
            notes.append(f"the sdist records commit {short} (vllm/_version.py); resolved to {commit}")
    if commit is None:
        raise UsageError(
            f"cannot tell the full upstream commit of vLLM {spec}: its sdist records "
            + (f"only the abbreviated id {short!r} (vllm/_version.py)" if short else "no commit id")
            + ", and neither a mirror nor the pin's repo could resolve it; the pin needs all 40 hex digits",
            hint=f"pass --upstream-commit <40-hex> (from `git ls-remote {pin.repo} refs/tags/v{spec}^{{}}`), "
                 "or --source <local vLLM mirror>",
        )
    return Target(spec, "version", commit, spec, name, sha, "sdist", notes, archive=str(archive))


def _full_commit(short: str, version: str, pin: pin_mod.Pin, source_spec: str) -> str | None:
    if _HEX40.match(short):
        return short
    if _is_local_repo(source_spec):
        found = proc.git(Path(source_spec).expanduser(), "rev-parse", "-q", "--verify", "--end-of-options",
                         f"{short}^{{commit}}", check=False)
        if found.returncode == 0:
            return found.stdout.strip()
    remote = source_spec if source_spec not in ("auto", "git", "sdist") else pin.repo
    if _is_local_repo(remote) or Path(remote).suffix in (".gz", ".tgz"):
        return None
    tag = f"refs/tags/v{version}"
    res = proc.git(Path.cwd(), "ls-remote", "--", remote, tag, f"{tag}^{{}}", check=False, timeout=60)
    for line in res.stdout.splitlines():
        cid = line.split("\t", 1)[0]
        if cid.startswith(short) and _HEX40.match(cid):
            return cid
    return None


def _snapshot_base(tree: Path, old_base: str, target: Target, echo) -> str:
    """Commit the sdist as a child of the old base (in a scratch worktree); return its id."""
    echo(f"committing {target.sdist} as the new base (child of {old_base[:12]})")
    scratch = Path(tempfile.mkdtemp(prefix=".smla-rebase-base-", dir=tree.parent))
    scratch.rmdir()
    proc.git(tree, "worktree", "add", "-q", "--no-checkout", "--detach", scratch, old_base)
    try:
        source.unpack_sdist(Path(target.archive), scratch)
        return source.commit_snapshot(
            scratch,
            f"vLLM {target.version} (sdist {target.sdist})\n\nUpstream-Commit: {target.commit}\n"
            f"Previous-Base: {old_base}\n",
        )
    finally:
        proc.git(tree, "worktree", "remove", "--force", scratch, check=False)
        shutil.rmtree(scratch, ignore_errors=True)
        proc.git(tree, "worktree", "prune", check=False)


def _fetch_commit(tree: Path, target: Target) -> str:
    url, commit = target.fetch_from, target.commit
    if proc.git(tree, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode != 0:
        shallow = proc.git(tree, "fetch", "-q", "--depth", "1", "--", url, commit, check=False, timeout=1800)
        if shallow.returncode != 0:
            full = proc.git(tree, "fetch", "-q", "--", url, "+refs/heads/*:refs/remotes/upstream/*",
                            check=False, timeout=7200)
            if full.returncode != 0:
                raise FetchError(f"cannot fetch {commit} from {url}: "
                                 f"{(full.stderr or shallow.stderr).strip().splitlines()[-1:]}")
        if proc.git(tree, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode != 0:
            raise FetchError(f"commit {commit} is not in {url}", hint="check the commit id and the repository")
    return commit


# --------------------------------------------------------------------------- state


def state_path(tree: Path) -> Path | None:
    if not (tree / ".git").exists():
        return None
    return _state_dir(tree) / "state.json"


def _state_dir(tree: Path) -> Path:
    rel = proc.git_out(tree, "rev-parse", "--git-path", STATE_DIR)
    p = Path(rel)
    return p if p.is_absolute() else tree / p


def _load_state(tree: Path) -> dict:
    p = state_path(tree)
    if p is None or not p.is_file():
        raise TreeStateError(f"no rebase in progress in {tree}", hint="start one with `smla rebase --onto ...`")
    try:
        state = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise TreeStateError(f"{p} is corrupt ({exc})",
                             hint=f"inspect it, or remove {p.parent} and reset the tree by hand") from exc
    if state.get("version") != STATE_VERSION:
        raise TreeStateError(f"{p} was written by another version of smla")
    state["tree"] = str(tree)
    return state


def _save_state(tree: Path, state: dict) -> None:
    state = dict(state)
    state["tree"] = str(tree)
    atomic_write_text(_state_dir(tree) / "state.json", json.dumps(state, indent=2, sort_keys=True) + "\n")


def _restore_files(pin_file: Path, patches_dir: Path, sdir: Path, names: list[str]) -> None:
    atomic_write_bytes(pin_file, (sdir / "pin.txt").read_bytes())
    patches_dir.mkdir(parents=True, exist_ok=True)
    for f in patches_dir.iterdir():
        if f.is_file() and f.name not in names:
            f.unlink()
    for name in names:
        atomic_write_bytes(patches_dir / name, (sdir / "patches" / name).read_bytes())
        shutil.copystat(sdir / "patches" / name, patches_dir / name)


def _am_in_progress(tree: Path) -> bool:
    rel = proc.git_out(tree, "rev-parse", "--git-path", "rebase-apply")
    p = Path(rel) if Path(rel).is_absolute() else tree / rel
    return p.is_dir()


def _unmerged(tree: Path) -> list[str]:
    out = proc.git(tree, "diff", "--name-only", "--diff-filter=U").stdout
    return sorted({ln for ln in out.splitlines() if ln})


def _count(tree: Path, a: str, b: str) -> int:
    return int(proc.git_out(tree, "rev-list", "--count", f"{a}..{b}"))


def _pin_dict(p: pin_mod.Pin) -> dict:
    return {"repo": p.repo, "commit": p.commit, "version": p.version, "sdist": p.sdist,
            "sdist_sha256": p.sdist_sha256}


# --------------------------------------------------------------------------- reports


def text(r: RebaseResult) -> str:
    d = r.to_dict()
    old, new = d["old_base"], d["new_base"]
    if r.status == "aborted":
        return (f"rebase onto {r.target['spec']} aborted: {r.tree} is back at {_label(old, None)} "
                "with its original branch; pin file and patches/ restored byte for byte\n")
    lines = [f"rebase {r.status}: {_label(old, None)} -> {_label(new, r.target)} in {r.tree}"]
    for p in r.patches:
        extra = []
        if p.offsets:
            extra.append("; ".join(p.offsets))
        if p.files:
            extra.append("files: " + ", ".join(p.files))
        if p.new_names and p.new_names != [p.name]:
            extra.append("now " + ", ".join(p.new_names))
        lines.append(f"  {p.outcome:<10} {p.name}" + (f"  ({' | '.join(extra)})" if extra else ""))
        lines += [f"               {h}" for h in (p.hunks if p.outcome == CONFLICT else [])]
    counts = ", ".join(f"{n} {k}" for k, n in sorted(d["counts"].items()))
    lines.append(f"summary: {counts}")
    for note in r.target.get("notes", []):
        lines.append(f"note: {note}")
    if r.status == "conflict":
        lines.append(f"next: {_resolve_hint(Path(r.tree))}")
    if r.pin_after and d["pin"]["changed"]:
        lines.append("pin: " + ", ".join(f"{k} {r.pin_before[k]} -> {v}" for k, v in r.pin_after.items()
                                          if r.pin_before[k] != v))
    if r.tests:
        lines.append(f"tests: {'passed' if r.tests['passed'] else 'FAILED'} ({r.tests['command']})")
    return "\n".join(lines) + "\n"


def _label(base: dict, target: dict | None, q: str = "") -> str:
    """vLLM 0.17.0 (abc) for a release, vLLM commit abc for a commit target."""
    c = f"{q}{base['upstream_commit'][:12]}{q}"
    if target is not None and target.get("kind") == "commit":
        return f"vLLM commit {c}"
    return f"vLLM {base['version']} ({c})"


def markdown(r: RebaseResult) -> str:
    d = r.to_dict()
    old, new = d["old_base"], d["new_base"]
    title = {"clean": "Rebase the sparse-MLA series", "conflict": "Rebase CONFLICT",
             "noop": "Nothing to rebase", "aborted": "Rebase aborted"}[r.status]
    out = [f"## {title}: {_label(old, None, '`')} → {_label(new, r.target, '`')}", ""]
    out.append(f"Target `{r.target['spec']}` ({r.target['kind']}); old base `{old['upstream_commit'][:12]}` "
               f"({old['source']}), new base `{new['upstream_commit'][:12]}` ({new['source']}).")
    out.append("")
    rows = []
    for p in r.patches:
        notes = []
        if p.offsets:
            notes.append("; ".join(p.offsets))
        if p.files:
            notes.append("files: " + ", ".join(f"`{f}`" for f in p.files))
        if p.hunks and p.outcome in (CONFLICT, RESOLVED, MERGED):
            notes.append("hunks: " + "; ".join(h.replace("|", "\\|") for h in p.hunks))
        if p.detail:
            notes.append(p.detail.replace("|", "\\|"))
        rows.append([f"`{p.name}`", p.subject.replace("|", "\\|"), f"**{p.outcome}**",
                     ", ".join(f"`{n}`" for n in p.new_names) or "—", "<br>".join(notes) or ""])
    out.append(report.md_table(["patch", "subject", "outcome", "exported as", "notes"], rows))
    out.append("Outcomes: " + ", ".join(f"{n} {k}" for k, n in sorted(d["counts"].items())) + ".")
    out.append("")
    if r.pin_after and d["pin"]["changed"]:
        out += ["### `vllm-pin.txt`", "", "```diff"]
        for k, v in r.pin_after.items():
            if r.pin_before[k] != v:
                out += [f"- {k} = {r.pin_before[k]}", f"+ {k} = {v}"]
        out += ["```", ""]
    if r.target.get("notes"):
        out += [f"- {n}" for n in r.target["notes"]] + [""]
    if r.status == "conflict":
        out += ["### Needs a human", "", f"The rebase stopped at `{r.stopped_at}`. {_resolve_hint(Path(r.tree))}.", ""]
    if r.tests:
        out += [f"### Tests: {'passed' if r.tests['passed'] else 'FAILED'}", "",
                f"`{r.tests['command']}` exited {r.tests['returncode']}.", "", "```", r.tests["tail"], "```", ""]
    return "\n".join(out)


def write_reports(r: RebaseResult, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "rebase-report.json", directory / "rebase-report.md", directory / "rebase-report.txt"]
    report.write(paths[0], report.to_json(r.to_dict()))
    report.write(paths[1], markdown(r))
    report.write(paths[2], text(r))
    return paths
