"""`smla rebase` cut off mid-step (Ctrl-C, SIGTERM, SIGKILL) and picked up with `--continue`.

The interruptions are injected in-process (KeyboardInterrupt, which the CLI's edge turns into
`Interrupted`, exit 130) at the points a user hits: during the first checkout of the new base,
right after a patch went in but before the state was saved, inside the three-way merge that stops
on a conflict, and while finishing. After each, `--continue` must end where an uninterrupted
rebase ends. Also: `git am --abort` at a stop must not drop the patch silently.
"""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from smla import proc, treeinfo
from smla.cli import main
from smla.rebase import replay
from smla.rebase.report import CONFLICT

from gitfixtures import LINES, edit_lines, write_lines

CLEAN = {"Patch a": "unchanged", "Patch b": "offsets", "Patch c": "merged", "Patch d": "upstream",
         "Patch e": "unchanged"}


def smla(world, *args: str):
    return CliRunner().invoke(main, ["--root", str(world["root"]), "--tree", str(world["tree"]), "rebase", *args])


def outcomes(data: dict) -> dict[str, str]:
    return {p["subject"].split(":")[0]: p["outcome"] for p in data["patches"]}


def finished_like_a_clean_rebase(world, res) -> None:
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert outcomes(data) == CLEAN
    assert data["pin"]["after"]["commit"] == world["c1"]
    tree = world["tree"]
    assert len(treeinfo.commits_above_base(tree)) == 4  # d went upstream; nothing replayed twice
    assert proc.git(tree, "status", "--porcelain").stdout == ""
    assert proc.git_out(tree, "symbolic-ref", "--short", "HEAD") == treeinfo.BRANCH
    assert not (tree / ".git" / "smla-rebase").exists()
    series = (world["patches"] / "series").read_text().split()
    assert len(series) == 4


def ctrl_c_after_patch_b(monkeypatch):
    """Make the replay raise KeyboardInterrupt right after it has replayed "Patch b"; returns the
    real replay_one (put it back to go on)."""
    real = replay.replay_one

    def then_ctrl_c(tree, patch, out):
        real(tree, patch, out)
        if out.subject.startswith("Patch b"):
            raise KeyboardInterrupt

    monkeypatch.setattr(replay, "replay_one", then_ctrl_c)
    return real


def test_interrupt_during_the_first_checkout(rebase_world, monkeypatch):
    world = rebase_world
    tree, real_git = world["tree"], proc.git

    def half_checkout(cwd, *args, **kw):
        if args[:4] == ("checkout", "-q", "-B", replay.WORK_BRANCH):
            for rel in ("b.py", "c.py"):  # some files of the new base written, then Ctrl-C
                (tree / rel).write_text(real_git(tree, "show", f"{world['c1']}:{rel}").stdout)
            raise KeyboardInterrupt
        return real_git(cwd, *args, **kw)

    monkeypatch.setattr(proc, "git", half_checkout)
    res = smla(world, "--onto", world["c1"], "--source", str(world["up"]))
    assert res.exit_code == 130, res.output
    monkeypatch.setattr(proc, "git", real_git)
    assert proc.git(tree, "status", "--porcelain").stdout  # half-checked-out files
    # old code: --continue asked to commit the half-checked-out files (exit 7), or `rev-list None..HEAD`
    finished_like_a_clean_rebase(world, smla(world, "--continue", "--json"))


def test_interrupt_between_patches(rebase_world, monkeypatch):
    world = rebase_world
    real = ctrl_c_after_patch_b(monkeypatch)  # committed, the state not saved yet
    res = smla(world, "--onto", world["c1"], "--source", str(world["up"]))
    assert res.exit_code == 130, res.output
    monkeypatch.setattr(replay, "replay_one", real)
    again = smla(world, "--onto", world["c1"], "--source", str(world["up"]))
    assert again.exit_code == 7 and "was interrupted" in again.output and "--continue" in again.output
    # old code: `git rev-list --count None..HEAD` failed (exit 12)
    finished_like_a_clean_rebase(world, smla(world, "--continue", "--json"))


def test_interrupt_inside_the_conflicting_merge(rebase_world, monkeypatch):
    world = rebase_world
    tree, real = world["tree"], replay.replay_one

    def then_ctrl_c(t, patch, out):
        real(t, patch, out)
        if out.outcome == CONFLICT:  # `git am --3way` stopped; the stop not recorded yet
            raise KeyboardInterrupt

    monkeypatch.setattr(replay, "replay_one", then_ctrl_c)
    assert smla(world, "--onto", world["c2"], "--source", str(world["up"])).exit_code == 130
    monkeypatch.setattr(replay, "replay_one", real)
    stop = smla(world, "--continue")
    assert stop.exit_code == 11, stop.output  # the conflict, reported as a stop now
    assert "<<<<<<<" in (tree / "e.py").read_text()
    write_lines(tree, "e.py", edit_lines(LINES, l30="E patched on top of upstream"))
    proc.git(tree, "add", "--", "e.py")
    res = smla(world, "--continue", "--json")
    # old code: `git rev-list --count None..HEAD` failed (exit 12) after the resolution
    assert res.exit_code == 0, res.output
    assert outcomes(json.loads(res.stdout))["Patch e"] == "resolved"
    assert "+E patched on top of upstream" in (world["patches"] / "0004-Patch-e-conflicts.patch").read_text()


def test_interrupt_while_finishing(rebase_world, monkeypatch):
    world = rebase_world
    import smla.rebase as rebase_mod

    real = rebase_mod.export_patches

    def then_ctrl_c(*args, **kw):
        real(*args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(rebase_mod, "export_patches", then_ctrl_c)
    assert smla(world, "--onto", world["c1"], "--source", str(world["up"])).exit_code == 130
    monkeypatch.setattr(rebase_mod, "export_patches", real)
    # old code: IndexError (the state's `next` is past the last patch)
    finished_like_a_clean_rebase(world, smla(world, "--continue", "--json"))


def test_interrupted_rebase_keeps_changes_it_did_not_make(rebase_world, monkeypatch):
    world = rebase_world
    real = ctrl_c_after_patch_b(monkeypatch)
    assert smla(world, "--onto", world["c1"], "--source", str(world["up"])).exit_code == 130
    monkeypatch.setattr(replay, "replay_one", real)
    mine = world["tree"] / "a.py"
    mine.write_text("my own edit\n")
    res = smla(world, "--continue")
    assert res.exit_code == 7 and "a.py" in res.output, res.output
    assert mine.read_text() == "my own edit\n"  # not thrown away


def test_am_abort_at_a_stop_does_not_drop_the_patch(rebase_world):
    world = rebase_world
    tree = world["tree"]
    assert smla(world, "--onto", world["c2"], "--source", str(world["up"])).exit_code == 11
    proc.git(tree, "am", "--abort")
    res = smla(world, "--continue")
    # old code: exit 0, patch e reported `skipped` and gone from patches/
    assert res.exit_code == 11, res.output
    assert "git am --abort" in res.output and "am --skip" in res.output
    assert "<<<<<<<" in (tree / "e.py").read_text()
    proc.git(tree, "am", "--skip")  # dropping it is still one command away
    done = smla(world, "--continue", "--json")
    assert done.exit_code == 0, done.output
    assert outcomes(json.loads(done.stdout))["Patch e"] == "skipped"


def test_a_killed_gits_index_lock_is_named_with_the_command_that_removes_it(rebase_world, monkeypatch):
    world = rebase_world
    real = replay.replay_one

    def then_killed(tree, patch, out):
        real(tree, patch, out)
        if out.subject.startswith("Patch b"):
            (tree / ".git" / "index.lock").write_text("")  # what a git killed with SIGKILL leaves
            raise KeyboardInterrupt

    monkeypatch.setattr(replay, "replay_one", then_killed)
    assert smla(world, "--onto", world["c1"], "--source", str(world["up"])).exit_code == 130
    monkeypatch.setattr(replay, "replay_one", real)
    res = smla(world, "--continue")
    # old code: `git rev-list --count None..HEAD` (exit 12); a raw git "index.lock exists" error otherwise
    assert res.exit_code == 7 and "index.lock" in res.output, res.output
    rm = res.output.split("hint:", 1)[1].split("`")[1].split()
    assert rm[0] == "rm"
    Path(rm[1]).unlink()
    finished_like_a_clean_rebase(world, smla(world, "--continue", "--json"))


def test_an_interrupted_rebase_hints_continue_not_run_again(rebase_world, monkeypatch):
    """Ctrl-C mid-replay: the hint is the rebase's way on (`--continue`, `--abort`), not the generic
    "run the command again" (a new --onto is refused while the interrupted one is there)."""
    world = rebase_world
    ctrl_c_after_patch_b(monkeypatch)
    res = smla(world, "--onto", world["c1"], "--source", str(world["up"]))
    assert res.exit_code == 130, res.output
    hint = res.output.split("hint:", 1)[1]
    # old code: "run the command again: apply and fetch change the work tree only when complete, ..."
    assert "smla rebase --continue" in hint and "smla rebase --abort" in hint, res.output
    assert "run the command again" not in hint
