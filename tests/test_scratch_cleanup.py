"""What smla leaves behind when interrupted while cleaning up: scratch worktrees beside the tree
(work/.smla-*) and temporary files, with real processes and signals.

A stand-in `git` on PATH (the real one for everything else) hangs inside `git worktree remove`,
so the test can signal smla at exactly that moment.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from smla import proc, treeinfo
from smla.cli import main

# Hangs in `git worktree remove` of the run the test started (SMLA_TEST_MARKER set). Asked to, it
# first leaves what a removal cut short can leave: the files without their .git, which git no
# longer lists as a worktree once pruned.
SLOW_REMOVE = """#!/bin/sh
case "$*" in
  *"worktree remove"*)
    if [ -n "$SMLA_TEST_MARKER" ] && [ ! -e "$SMLA_TEST_MARKER" ]; then
      for last; do :; done
      if [ -n "$SMLA_TEST_DROP_DOTGIT" ]; then rm -f "$last/.git" && {git} worktree prune; fi
      touch "$SMLA_TEST_MARKER"
      sleep 3
    fi ;;
esac
exec {git} "$@"
"""


def _leftovers(tree: Path) -> list[str]:
    return sorted(p.name for p in tree.parent.iterdir() if p.name.startswith(".smla-"))


def _start(root: Path, tree: Path, tmp_path: Path, *args: str, drop_dotgit: bool = False):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "git"
    fake.write_text(SLOW_REMOVE.format(git=shutil.which("git")))
    fake.chmod(0o755)
    marker = tmp_path / "in-remove"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "SMLA_TEST_MARKER": str(marker)}
    if drop_dotgit:
        env["SMLA_TEST_DROP_DOTGIT"] = "1"
    p = subprocess.Popen([sys.executable, "-m", "smla.cli", "--root", str(root), "--tree", str(tree), *args],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "smla never reached the removal of its scratch worktree"
        time.sleep(0.02)
    return p


def _finish(p: subprocess.Popen) -> tuple[int, str]:
    try:
        _out, err = p.communicate(timeout=60)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return p.returncode, err


def test_ctrl_c_while_apply_removes_its_scratch_worktree(series_project, tmp_path):
    root, tree, _ = series_project
    p = _start(root, tree, tmp_path, "apply")
    os.killpg(p.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole process group
    rc, err = _finish(p)
    # old code: the Ctrl-C cut the removal short and work/.smla-apply-* stayed
    assert _leftovers(tree) == [], err
    assert rc in (0, 130), err  # the removal finishes first, then the Ctrl-C counts
    assert proc.git_out(tree, "worktree", "list", "--porcelain").count("worktree ") == 1


@pytest.mark.parametrize("then", ["apply", "clean"])
def test_a_scratch_without_git_left_by_kill_9_is_swept(series_project, tmp_path, then):
    root, tree, _ = series_project
    p = _start(root, tree, tmp_path, "apply", drop_dotgit=True)
    os.killpg(p.pid, signal.SIGKILL)
    _finish(p)
    left = _leftovers(tree)
    assert left and not (tree.parent / left[0] / ".git").exists()  # files, no .git, not listed
    assert left[0] not in proc.git_out(tree, "worktree", "list", "--porcelain")
    res = CliRunner().invoke(main, ["--root", str(root), "--tree", str(tree), then])
    assert res.exit_code == 0, res.output
    # old code: never swept (only a .git pointing into the tree marked it as smla's)
    assert _leftovers(tree) == []
    if then == "apply":
        assert len(treeinfo.commits_above_base(tree)) == 3


def test_no_temporary_file_goes_to_the_system_temp_dir(series_project, tmp_path, monkeypatch):
    root, tree, _ = series_project
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    seen: list[str] = []
    real = proc.git

    def spy(cwd, *args, **kw):
        res = real(cwd, *args, **kw)
        seen.extend(str(p.relative_to(systmp)) for p in systmp.rglob("*"))
        return res

    monkeypatch.setattr(proc, "git", spy)
    for args in (["apply"], ["status"], ["export"]):
        res = CliRunner().invoke(main, ["--root", str(root), "--tree", str(tree), *args])
        assert res.exit_code == 0, res.output
    # old code: the temporary index of the upstream check and the exported patches went to /tmp
    assert seen == []


def test_temporary_files_of_a_dead_run_are_swept(series_project):
    root, tree, _ = series_project
    dead = tree / ".git" / proc.TMP_DIR / "999999999-x1"
    dead.mkdir(parents=True)
    (dead / "index").write_bytes(b"DIRC")
    mine = tree / ".git" / proc.TMP_DIR / f"{os.getpid()}-x2"  # a live run's: kept
    mine.mkdir()
    res = CliRunner().invoke(main, ["--root", str(root), "--tree", str(tree), "apply"])
    assert res.exit_code == 0, res.output
    assert not dead.exists() and mine.exists()
