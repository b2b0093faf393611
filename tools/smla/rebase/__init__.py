"""`rebase`: carry the patch series onto a newer vLLM.

A release target (`--onto 0.33.0`) opens a new release line, lines/<release>/, from the line
being rebased (rebase/newline.py), in its own work tree (work/<release>/vllm: a copy of the old
line's tree, or fetched at the old pin): the old line, its pin, patches/ and tree stay as they
are. A commit target keeps the release and rebases the line in place.

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
6. The semantic check (rebase/verify.py): imports, selection, the CPU
   tests; a broken result is status "broken" (exit 13). At a conflict stop
   the imports of the patches replayed so far are checked too.

`continue_` resumes after the user resolved the conflict (staged with `git
add`, or already committed with `git am --continue`); `abort` (rebase/abort.py)
puts the pin file, patches/ and the tree back as they were.
"""
from __future__ import annotations

from pathlib import Path

from smla.apply import apply_series
from smla.export import export as export_patches
from smla import ids, keep, lock, proc, source, treeinfo, treestate
from smla import pin as pin_mod
from smla import series as series_mod
from smla.errors import RebaseConflict, SmlaError, TreeStateError, UsageError, cmd
from smla.project import Project
from smla.rebase import newline, replay, resume, verify, state as state_mod
from smla.rebase import abort as abort_mod
from smla.rebase import target as target_mod
from smla.rebase.replay import WORK_BRANCH
from smla.rebase.report import (  # noqa: F401  (text and RebaseResult: what the CLI and its tests take)
    RESOLVED, SKIPPED, UNCHANGED, Outcome, RebaseResult, resolve_hint, text, write_refusal, write_reports,
)
from smla.rebase.state import STATE_VERSION
from smla.rebase.target import Target


# --------------------------------------------------------------------------- entry points


def run(project: Project, tree: Path | None, *, onto: str | None = None, continue_: bool = False,
        abort: bool = False, source_spec: str = "auto", upstream_commit: str | None = None, run_tests: bool = True,
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
    if (abort or continue_) and tree is None:
        _stopped_on_another_line(project, "--abort" if abort else "--continue")
    try:
        if abort:
            with lock.hold(tree or project.default_tree):
                result = _abort(project, tree or project.default_tree, echo=echo, **reports)
        elif continue_:
            with lock.hold(tree or project.default_tree):
                result = _continue(project, tree or project.default_tree, run_tests=run_tests, echo=echo, **reports)
        else:
            result = start(project, tree, onto, source_spec=source_spec, upstream_commit=upstream_commit,
                           run_tests=run_tests, echo=echo, **reports)
    except SmlaError as exc:
        if onto and report_dir:
            write_refusal(exc, report_dir, report_name, action=f"--onto {onto}")
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C / SIGTERM: the CLI's edge makes it Interrupted, with this hint
        stopped = _stopped_trees(project, tree)
        if stopped:
            line = ["--line", stopped[0][0]] if tree is None else []
            exc.hint = (f"the rebase stopped mid-step in {stopped[0][1]}: {cmd('smla', *line, 'rebase', '--continue')} "
                        f"picks it up where it stopped, {cmd('smla', *line, 'rebase', '--abort')} undoes it")
        raise
    written = (write_reports(result, Path(result.report_dir), result.report_name, root=project.root)
               if result.report_dir else [])
    return result, written


def _stopped_trees(project: Project, tree: Path | None) -> list[tuple[str, Path]]:
    """(line, tree) of each stopped rebase this command could have left: in `tree`, else in a line's tree."""
    if tree is not None:
        return [(project.line, tree)] if treeinfo.rebase_in_progress(tree) else []
    return [(ln, project.on(ln).default_tree) for ln in project.lines()
            if treeinfo.rebase_in_progress(project.on(ln).default_tree)]


def _stopped_on_another_line(project: Project, flag: str) -> None:
    """--continue/--abort on a line whose tree has no stopped rebase, while another line's has one (a
    release target works in the line it opens; `--line`, $SMLA_LINE or make's VLLM= picked the old
    one): name that line, instead of "no rebase in progress"."""
    if treeinfo.rebase_in_progress(project.default_tree):
        return
    others = [ln for ln, _ in _stopped_trees(project, None) if ln != project.line]
    if others:
        raise TreeStateError(
            f"no rebase in progress on line {project.line} ({project.default_tree}); the one stopped is on line "
            + " and ".join(others) + f" ({project.on(others[0]).default_tree})",
            hint=" or ".join(cmd("smla", "--line", ln, "rebase", flag) for ln in others)
                 + (f" (make: {cmd('make', 'rebase', f'VLLM={others[0]}', f'ARGS={flag}')})" if len(others) == 1 else ""),
        )


def start(
    project: Project,
    tree: Path | None,
    onto: str,
    *,
    source_spec: str = "auto",
    upstream_commit: str | None = None,
    run_tests: bool = True,
    report_dir: Path | None = None,
    report_name: str | None = None,
    echo=print,
) -> RebaseResult:
    """Rebase the series onto `onto` (a commit id or a release version).

    `report_dir`/`report_name` are remembered in the state, so `--continue`
    and `--abort` write their reports to the same place (the CLI writes them).
    """
    kind, spec = target_mod.parse(onto, upstream_commit)
    old_pin = project.pin()
    series = series_mod.load(project.patches_dir)
    # A release other than the line's own opens a new line; a commit (or the same release) stays in it.
    dest = newline.destination(project, kind, spec, old_pin)
    tree = (tree or dest.default_tree).absolute()
    if treeinfo.rebase_in_progress(tree):
        st = state_mod.load(tree)
        how = "was interrupted" if resume.interrupted(st) else "is already in progress"
        raise TreeStateError(
            f"a rebase onto {st['target']['spec']} {how} in {tree}",
            hint="finish it with `smla rebase --continue` (it picks up where it stopped), "
                 "or undo it with `smla rebase --abort`",
        )
    with lock.hold(tree), newline.opening_tree(project, dest, tree) as opening:
        return _start(project, dest, tree, kind, spec, old_pin, series, source_spec=source_spec,
                      upstream_commit=upstream_commit, run_tests=run_tests, report_dir=report_dir,
                      report_name=report_name, opening=opening, echo=echo)


def _start(project: Project, dest: Project, tree: Path, kind: str, spec: str, old_pin: pin_mod.Pin, series, *,
           source_spec: str, upstream_commit: str | None, run_tests: bool, report_dir: Path | None,
           report_name: str | None, opening: newline.Opening, echo) -> RebaseResult:
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
        result.report_dir, result.report_name = state_mod.report_path(report_dir), report_name
        return result
    new_base = target_mod.bring_in(tree, info.base, target, echo)

    # Back up everything before the first visible change; a new line starts as a copy of this one.
    backed_up = state_mod.back_up(tree, project.pin_file, project.patches_dir)
    try:
        opened, state = _begin(project, dest, tree, info, old_pin, old, new_base, target, series, backed_up,
                               report_dir, report_name, opening, echo)
    except BaseException:
        # Stopped (Ctrl-C included) before the replay began, where --continue cannot pick it up (the tree
        # this run made goes with its state, in opening_tree; or no state was saved): the line it opened
        # goes too. destination() refused an existing line, so this one is the run's own.
        if (dest.line != project.line and not opening.kept and dest.line_dir.exists()
                and (opening.created or not treeinfo.rebase_in_progress(tree))):
            newline.remove_opened_line(dest.line_dir, project.line_dir)
        raise
    echo(f"replaying {len(series.patches)} patches onto {target.spec} ({new_base[:12]})"
         + (f" as the new line lines/{dest.line}/ (tree {tree})" if opened else ""))
    return _replay(project, tree, state, run_tests, echo)


def _begin(project: Project, dest: Project, tree: Path, info, old_pin: pin_mod.Pin, old: dict, new_base: str,
           target: Target, series, backed_up, report_dir: Path | None, report_name: str | None,
           opening: newline.Opening, echo) -> tuple[Path | None, dict]:
    """Open the new line (if any), save the state and check out the new base: the rebase has begun
    (opening.keep()). The opened line's directory (or None) and the state."""
    opened = newline.open_line(project, dest, echo) if dest.line != project.line else None
    branch = proc.git(tree, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip() or None
    state = {
        "version": STATE_VERSION,
        "tree": str(tree),
        "root": str(project.root),
        "pin_file": str(dest.pin_file),
        "patches_dir": str(dest.patches_dir),
        "line": {"from": project.line, "to": dest.line, "opened": opened is not None},
        "opened_line": str(opened) if opened else None,
        "tree_created": opening.created,
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
        "report": {"dir": state_mod.report_path(report_dir), "name": report_name},
    }
    state_mod.save(tree, state)
    proc.git(tree, "checkout", "-q", "-B", WORK_BRANCH, new_base)
    opening.keep()  # from here on, --abort decides what happens to a tree this run created
    return opened, state


def continue_(project: Project, tree: Path, *, run_tests: bool = True, report_dir: Path | None = None,
              report_name: str | None = None, echo=print) -> RebaseResult:
    """Resume a stopped rebase once the user has resolved the conflict."""
    tree = tree.absolute()
    state = state_mod.load(tree)
    state_mod.remember_report(state, report_dir, report_name)
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
            raise RebaseConflict(f"still unresolved in {tree}: {', '.join(unmerged)}",
                                 hint=resolve_hint(tree, state.get("line")))
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


_abort, _continue = abort_mod.abort, continue_  # for run(), whose flags carry these names


# --------------------------------------------------------------------------- replay and finish


def _replay(project: Project, tree: Path, state: dict, run_tests: bool, echo) -> RebaseResult:
    outs, stopped = replay.run(tree, state, echo)
    if stopped is not None:
        done = outs[:state["next"]]
        checks = verify.check(project.root, tree, state, done, complete=False, run_tests=False,
                              line=_line(state), echo=echo)
        result = _result(state, outs, "conflict", stopped_at=stopped.name)
        result.checks = checks
        return result
    return _finish(project, tree, state, outs, run_tests, echo)


def _line(state: dict) -> str:
    return (state.get("line") or {}).get("to") or state["target"]["version"]


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
    if state.get("opened_line"):  # a new line: removing it (and its tree) undoes the rebase
        new_line = state["line"]["to"]
        result.undo = [state_mod.shell("smla", "--line", new_line, *smla_args, "clean", "--discard"),
                       state_mod.shell("rm", "-r", "--", state["opened_line"])]
    else:
        result.undo = state_mod.undo_commands(project.root, pin_file, patches_dir, undo_dir, before,
                                              [*exported["series"], series_mod.SERIES_FILE], smla_args)
    result.pin_after = state_mod.pin_dict(new_pin)
    result.export = exported
    result.range_diff = rdiff.stdout if rdiff.returncode == 0 else ""
    echo(f"rebased onto vLLM {target['version']} ({new_pin.commit_label()}); "
         f"pin updated, {len(exported['series'])} patches exported to {patches_dir}")
    checks = verify.check(project.root, tree, state, outs, complete=True, run_tests=run_tests,
                          line=_line(state), echo=echo)
    result.checks, result.tests = checks, checks.get("tests")
    if checks["broken"]:
        result.status = "broken"
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


def _result(state: dict, outs: list[Outcome], status: str, stopped_at: str | None = None) -> RebaseResult:
    new = state.get("new") or {"base": state["new_base"], "upstream_commit": state["target"]["commit"],
                               "version": state["target"]["version"], "source": state["target"]["source"],
                               "commit_kind": state["target"].get("commit_kind", pin_mod.FULL)}
    rep = state.get("report") or {}
    return RebaseResult(status, state.get("tree", ""), state["old"], new, state["target"], outs,
                        state["pin_before"], None, stopped_at, stops=list(state.get("stops", [])),
                        report_dir=rep.get("dir"), report_name=rep.get("name"), line=state.get("line"))


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

