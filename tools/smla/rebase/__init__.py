"""`rebase`: carry the patch series onto a newer vLLM.

Flow of `start` (see docs/rebase.md):
1. Check the tree: it must be an smla tree at the pin (fetched here when
   missing), clean, with the series applied and its commits equal to
   patches/ (by content: smla.treestate), so no local work can be lost.
2. Resolve the target and bring the new base into the same repository
   (rebase/target.py): a commit fetched from the pin's repo or a mirror, or
   a release's PyPI sdist committed as a child of the old base.
3. Back up the pin file and patches/ byte for byte and write the state
   file (rebase/state.py) before anything moves.
4. Replay the backed-up patches in order on `smla-rebase` (rebase/replay.py),
   classifying each (rebase/report.py).
5. On success: the original branch moves to the result, the base tag to
   the new base, patches/ is re-exported, the pin rewritten, state removed.

`continue_` resumes after the user resolved the conflict (staged with `git
add`, or already committed with `git am --continue`); `abort` puts the pin
file, patches/ and the tree back as they were.
"""
from __future__ import annotations

import sys
from pathlib import Path

from smla.apply import apply_series
from smla.export import export as export_patches
from smla import ids, keep, proc, source, treeinfo, treestate
from smla import pin as pin_mod
from smla import series as series_mod
from smla.errors import RebaseConflict, SmlaError, TreeStateError, UsageError, cmd
from smla.project import Project
from smla.rebase import replay, resume, state as state_mod
from smla.rebase import target as target_mod
from smla.rebase.replay import WORK_BRANCH
from smla.rebase.report import (  # noqa: F401  (text and RebaseResult: what the CLI and its tests take)
    RESOLVED, SKIPPED, UNCHANGED, Outcome, RebaseResult, resolve_hint, text, write_refusal, write_reports,
)
from smla.rebase.state import STATE_VERSION
from smla.rebase.target import Target


# --------------------------------------------------------------------------- entry points


def run(project: Project, tree: Path, *, onto: str | None = None, continue_: bool = False, abort: bool = False,
        source_spec: str = "auto", upstream_commit: str | None = None, run_tests: bool = False,
        report_dir: Path | None = None, report_name: str | None = None, echo=print
        ) -> tuple[RebaseResult, list[Path]]:
    """`smla rebase`: exactly one of `onto`, `continue_`, `abort`; then the reports.

    Returns the result and the report files written (where --report-dir, given now or remembered by
    the stopped rebase, says). A refused --onto leaves a report too (CI publishes it; an older report
    of that name must not look current); a refused --continue/--abort changed nothing, so the stop's
    report stays as it is."""
    if sum(map(bool, (onto, continue_, abort))) != 1:
        raise UsageError("give exactly one of --onto COMMIT|VERSION, --continue, --abort")
    reports = dict(report_dir=report_dir, report_name=report_name)
    try:
        if abort:
            result = _abort(project, tree, echo=echo, **reports)
        elif continue_:
            result = _continue(project, tree, run_tests=run_tests, echo=echo, **reports)
        else:
            result = start(project, tree, onto, source_spec=source_spec, upstream_commit=upstream_commit,
                           run_tests=run_tests, echo=echo, **reports)
    except SmlaError as exc:
        if onto and report_dir:
            write_refusal(exc, report_dir, report_name, action=f"--onto {onto}")
        raise
    written = (write_reports(result, Path(result.report_dir), result.report_name, root=project.root)
               if result.report_dir else [])
    return result, written


def start(
    project: Project,
    tree: Path,
    onto: str,
    *,
    source_spec: str = "auto",
    upstream_commit: str | None = None,
    run_tests: bool = False,
    report_dir: Path | None = None,
    report_name: str | None = None,
    echo=print,
) -> RebaseResult:
    """Rebase the series onto `onto` (a commit id or a release version).

    `report_dir`/`report_name` are remembered in the state, so `--continue`
    and `--abort` write their reports to the same place (the CLI writes them).
    """
    tree = tree.absolute()
    if treeinfo.rebase_in_progress(tree):
        st = state_mod.load(tree)
        how = "was interrupted" if resume.interrupted(st) else "is already in progress"
        raise TreeStateError(
            f"a rebase onto {st['target']['spec']} {how} in {tree}",
            hint="finish it with `smla rebase --continue` (it picks up where it stopped), "
                 "or undo it with `smla rebase --abort`",
        )
    kind, spec = target_mod.parse(onto, upstream_commit)
    old_pin = project.pin()
    series = series_mod.load(project.patches_dir)
    info = _prepare_tree(project, old_pin, series, tree, source_spec, echo)

    target = target_mod.resolve(kind, spec, old_pin, source_spec, upstream_commit)
    older = target_mod.older_than(target, old_pin)
    if older:
        target.notes.append(older)
        echo(f"note: {older}")
    old = {"base": info.base, "upstream_commit": info.upstream_commit, "version": info.version,
           "source": info.source, "commit_kind": old_pin.commit_kind}
    if ids.same_commit(target.commit, info.upstream_commit) and target.version == info.version:
        result = _noop(project, tree, old_pin, series, old, target, echo)
        result.report_dir, result.report_name = _report_dir(report_dir), report_name
        return result
    new_base = target_mod.bring_in(tree, info.base, target, echo)

    # Back up everything before the first visible change.
    backed_up = state_mod.back_up(tree, project.pin_file, project.patches_dir)
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
        "pin_before": state_mod.pin_dict(old_pin),
        "outcomes": [Outcome(p.name, p.subject).to_dict() for p in series.patches],
        "next": 0,
        "at": new_base,  # where the step in flight starts (rebase/resume.py)
        "stop_head": None,
        "stops": [],
        "report": {"dir": _report_dir(report_dir), "name": report_name},
    }
    state_mod.save(tree, state)
    proc.git(tree, "checkout", "-q", "-B", WORK_BRANCH, new_base)
    echo(f"replaying {len(series.patches)} patches onto {target.spec} ({new_base[:12]})")
    return _replay(project, tree, state, run_tests, echo)


def continue_(project: Project, tree: Path, *, run_tests: bool = False, report_dir: Path | None = None,
              report_name: str | None = None, echo=print) -> RebaseResult:
    """Resume a stopped rebase once the user has resolved the conflict."""
    tree = tree.absolute()
    state = state_mod.load(tree)
    _remember_report(state, report_dir, report_name)
    if resume.am_aborted(tree, state):
        name = resume.replay_stopped_patch_again(tree, state)
        echo(f"`git am --abort` undid the merge of {name}; replaying it again (to drop it instead: "
             f"{cmd('git', '-C', tree, 'am', '--skip')} at the stop, then `smla rebase --continue`)")
    if resume.interrupted(state):  # Ctrl-C, SIGTERM or SIGKILL mid-step: redo that step
        echo(resume.rewind(tree, state))
        return _replay(project, tree, state, run_tests, echo)
    i = state["next"]
    out = Outcome.from_dict(state["outcomes"][i])
    if state_mod.am_in_progress(tree):
        unmerged = state_mod.unmerged(tree)
        if unmerged:
            raise RebaseConflict(f"still unresolved in {tree}: {', '.join(unmerged)}", hint=resolve_hint(tree))
        done = proc.git(tree, "am", "--continue", check=False)
        if done.returncode != 0:
            skip = cmd("git", "-C", tree, "am", "--skip")
            if proc.git(tree, "diff", "--cached", "--quiet", check=False).returncode == 0:
                # git am refuses an empty resolution with its own advice ("git am --abort"), which
                # would throw the whole rebase away: say what it means here instead.
                raise RebaseConflict(
                    f"the resolution of {out.name} is empty: nothing staged differs from the new base",
                    hint=f"if nothing of the patch is needed on the new base, drop it with {skip}, then "
                         f"`smla rebase --continue`; otherwise edit and stage the files "
                         f"({cmd('git', '-C', tree, 'add', '<files>')}) first",
                )
            msg = (done.stdout + done.stderr).strip()
            hint = (f"stage your resolution with {cmd('git', '-C', tree, 'add', '<files>')}; if nothing of the "
                    f"patch is left (already upstream), run {skip}; then `smla rebase --continue`")
            raise RebaseConflict(f"cannot continue patch {out.name}: "
                                 f"{msg.splitlines()[-1] if msg else 'git am failed'}", hint=hint)
    dirty = treeinfo.dirty_files(tree)
    if dirty:
        raise TreeStateError(
            f"{tree} has uncommitted changes ({', '.join(dirty[:5])}) after the conflict of {out.name}",
            hint="stage and commit the resolution (or `git am --continue`), or discard what does not belong",
        )
    made = int(proc.git_out(tree, "rev-list", "--count", f"{state['stop_head']}..HEAD"))
    out.commits = made
    out.outcome = RESOLVED if made else SKIPPED
    if not made:
        out.detail = "dropped during the conflict; its old text stays in the rebase report and git history"
    state["outcomes"][i] = out.to_dict()
    state["next"] = i + 1
    state["stop_head"] = None
    state["at"] = proc.git_out(tree, "rev-parse", "HEAD")
    state_mod.save(tree, state)
    echo(f"  {out.outcome:<10} {out.name}")
    return _replay(project, tree, state, run_tests, echo)


def abort(project: Project, tree: Path, *, report_dir: Path | None = None, report_name: str | None = None,
          echo=print) -> RebaseResult:
    """Undo a stopped rebase: pin file, patches/ and the tree as before it."""
    tree = tree.absolute()
    state = state_mod.load(tree)
    _remember_report(state, report_dir, report_name)
    if state_mod.am_in_progress(tree):
        proc.git(tree, "am", "--quit")
    proc.git(tree, "reset", "-q", "--hard")
    kept = _keep_untracked(tree, state["orig_head"])
    if state["orig_branch"]:
        proc.git(tree, "checkout", "-q", "-f", "-B", state["orig_branch"], state["orig_head"])
    else:
        proc.git(tree, "checkout", "-q", "-f", "--detach", state["orig_head"])
    if state["orig_branch"] != WORK_BRANCH:
        proc.git(tree, "branch", "-q", "-D", WORK_BRANCH, check=False)
    proc.git(tree, "tag", "-f", treeinfo.BASE_TAG, state["orig_base"])
    for key, value in state["orig_config"].items():
        proc.git(tree, "config", key, value)
    kept += state_mod.restore_files(tree, Path(state["pin_file"]), Path(state["patches_dir"]),
                                    state["backup_files"])
    state_mod.remove(tree)
    outs = [Outcome.from_dict(o) for o in state["outcomes"]]
    result = RebaseResult("aborted", str(tree), state["old"], state["old"], state["target"], outs,
                          state["pin_before"], state["pin_before"], stops=state.get("stops", []), kept=kept)
    result.report_dir, result.report_name = state.get("report", {}).get("dir"), state.get("report", {}).get("name")
    return result


_abort, _continue = abort, continue_  # for run(), whose flags carry these names


def _keep_untracked(tree: Path, orig_head: str) -> list[str]:
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


def _report_dir(d: Path | None) -> str | None:
    return str(d.absolute()) if d is not None else None


def _remember_report(state: dict, report_dir: Path | None, report_name: str | None) -> None:
    """An explicit --report-dir/--report-name on --continue/--abort replaces the remembered one."""
    rep = state.setdefault("report", {"dir": None, "name": None})
    if report_dir is not None:
        rep["dir"] = _report_dir(report_dir)
    if report_name is not None:
        rep["name"] = report_name


# --------------------------------------------------------------------------- replay and finish


def _replay(project: Project, tree: Path, state: dict, run_tests: bool, echo) -> RebaseResult:
    outs, stopped = replay.run(tree, state, echo)
    if stopped is not None:
        return _result(state, outs, "conflict", stopped_at=stopped.name)
    return _finish(project, tree, state, outs, run_tests, echo)


def _finish(project: Project, tree: Path, state: dict, outs: list[Outcome], run_tests: bool, echo) -> RebaseResult:
    target = state["target"]
    commit_kind = target.get("commit_kind", pin_mod.FULL)
    pin_file, patches_dir = Path(state["pin_file"]), Path(state["patches_dir"])
    before = state["backup_files"]
    # What was made or edited in patches/ during a stop is moved aside (and named) before the export.
    kept = state_mod.keep_changes(tree, pin_file, patches_dir, before, move_new=True)
    known = {keep.sha256(state_mod.backed_up_patch(tree, n).read_bytes()) for n in before}
    branch = state["orig_branch"] or treeinfo.BRANCH
    proc.git(tree, "checkout", "-q", "-B", branch)
    if branch != WORK_BRANCH:
        proc.git(tree, "branch", "-q", "-D", WORK_BRANCH, check=False)
    proc.git(tree, "tag", "-f", treeinfo.BASE_TAG, state["new_base"])
    _set_tree_config(tree, target["commit"], target["version"], target["source"])

    if treeinfo.commits_above_base(tree):
        exported = export_patches(tree, patches_dir, prune=True, during_rebase=True, known=known).to_dict()
    else:  # every patch is upstream now: an empty series
        for stale in patches_dir.glob("*.patch"):
            stale.unlink()
        series_mod.write_series_file(patches_dir, [])
        exported = {"directory": str(patches_dir), "series": [], "written": [], "unchanged": [], "removed": []}
    names = iter(exported["series"])
    for o in outs:
        o.new_names = [next(names, "?") for _ in range(o.commits)]
    rdiff = proc.git(tree, "range-diff", "--no-color", f"{state['orig_base']}..{state['orig_head']}",
                     f"{state['new_base']}..HEAD", check=False)

    old_pin = pin_mod.load(pin_file)
    new_pin = old_pin.with_changes(commit=target["commit"], version=target["version"], sdist=target["sdist"],
                                   sdist_sha256=target["sdist_sha256"], commit_kind=commit_kind)
    pin_mod.save(pin_file, new_pin)
    new = {"base": state["new_base"], "upstream_commit": target["commit"], "version": target["version"],
           "source": target["source"], "commit_kind": commit_kind}
    undo_dir = state_mod.keep_for_undo(tree)
    state_mod.remove(tree)
    state["new"] = new
    result = _result(state, outs, "clean")
    result.kept = kept
    smla_args = [] if tree == project.default_tree.absolute() else ["--tree", str(tree)]
    result.undo = state_mod.undo_commands(project.root, pin_file, patches_dir, undo_dir, before,
                                          [*exported["series"], series_mod.SERIES_FILE], smla_args)
    result.pin_after = state_mod.pin_dict(new_pin)
    result.export = exported
    result.range_diff = rdiff.stdout if rdiff.returncode == 0 else ""
    echo(f"rebased onto vLLM {target['version']} ({new_pin.commit_label()}); "
         f"pin updated, {len(exported['series'])} patches exported to {patches_dir}")
    if run_tests:
        result.tests = run_cpu_suite(project.root, tree, echo)
    return result


def _set_tree_config(tree: Path, commit: str, version: str, kind: str) -> None:
    proc.git(tree, "config", "smla.upstream", commit)
    proc.git(tree, "config", "smla.version", version)
    proc.git(tree, "config", "smla.source", kind)


def _noop(project: Project, tree: Path, old_pin: pin_mod.Pin, series, old: dict, target: Target, echo) -> RebaseResult:
    """Already at the target. When the target names the full commit of an abbreviated pin, complete it."""
    outs = [Outcome(p.name, p.subject, UNCHANGED, new_names=[p.name]) for p in series.patches]
    new_pin = old_pin
    new = dict(old)
    # What resolving the target said the pin would get (sdist = none, an abbreviated commit) does not
    # happen on a no-op: only the source facts stay, and what really happens is said below.
    target.notes = [n for n in target.notes if n.startswith("source:")]
    if not old_pin.commit_is_full and target.commit_kind == pin_mod.FULL:
        new_pin = old_pin.with_changes(commit=target.commit, commit_kind=pin_mod.FULL)
        pin_mod.save(project.pin_file, new_pin)
        proc.git(tree, "config", "smla.upstream", target.commit)
        new.update(upstream_commit=target.commit, commit_kind=pin_mod.FULL)
        target.notes.append(f"the pin's abbreviated commit {old_pin.commit} is now the full id {target.commit}")
        echo(f"the tree is already at vLLM {target.version}; the pin's commit {old_pin.commit} (abbreviated) "
             f"is now the full id {target.commit}")
    else:
        target.notes.append(f"the tree is already at vLLM {target.version} ({old_pin.commit_label()}): "
                            "nothing rebased, the pin and patches/ are unchanged")
        echo(f"the tree is already at vLLM {target.version} ({old_pin.commit_label()}); nothing to rebase; "
             "the pin and patches/ are unchanged")
    return RebaseResult("noop", str(tree), old, new, target.to_dict(), outs,
                        state_mod.pin_dict(old_pin), state_mod.pin_dict(new_pin))


def run_cpu_suite(root: Path, tree: Path, echo=print) -> dict:
    """`pytest -m "not gpu"` of the toolkit against `tree` (the new pin is already written)."""
    echo(f"running the CPU suite against {tree} ...")
    res = proc.run([sys.executable, "-m", "pytest", "-m", "not gpu", "-q", "-p", "no:cacheprovider"],
                   cwd=root, env={"SMLA_TREE": str(tree), "SMLA_ROOT": str(root)},
                   check=False, timeout=3600)
    tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
    echo(tail)
    return {"command": 'python -m pytest -m "not gpu"', "returncode": res.returncode,
            "passed": res.returncode == 0, "tail": tail}


def _result(state: dict, outs: list[Outcome], status: str, stopped_at: str | None = None) -> RebaseResult:
    new = state.get("new") or {"base": state["new_base"], "upstream_commit": state["target"]["commit"],
                               "version": state["target"]["version"], "source": state["target"]["source"],
                               "commit_kind": state["target"].get("commit_kind", pin_mod.FULL)}
    rep = state.get("report") or {}
    return RebaseResult(status, state.get("tree", ""), state["old"], new, state["target"], outs,
                        state["pin_before"], None, stopped_at, stops=list(state.get("stops", [])),
                        report_dir=rep.get("dir"), report_name=rep.get("name"))


# --------------------------------------------------------------------------- preparing


def _prepare_tree(project: Project, pin: pin_mod.Pin, series, tree: Path, source_spec: str, echo):
    info = treeinfo.read_tree_info(tree)
    if info is None:
        fetch_source = (source_spec if source_spec in ("auto", "git", "sdist") or source.is_local_repo(source_spec)
                        else "auto")
        echo(f"no work tree at {tree}: fetching the pinned vLLM {pin.version} first")
        info = source.fetch(pin, tree, fetch_source, echo=echo)
    treestate.require_at_pin(pin, tree, "rebase (a rebase starts from the pinned base)")
    dirty = treeinfo.dirty_files(tree)
    if dirty:
        raise TreeStateError(
            f"work tree {tree} has uncommitted changes ({', '.join(dirty[:5])}); refusing to rebase",
            hint="commit them and `smla export` (or discard them), then rebase",
        )
    apply_series(series, tree, echo=lambda *_: None)  # a changed patches/ is applied first
    # The commits above the base must carry exactly patches/ (by content): no unexported work can be lost.
    treestate.require_in_sync(tree, series, "rebase")
    return treeinfo.read_tree_info(tree)

