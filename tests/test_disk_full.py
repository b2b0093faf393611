"""A full disk, where the toolkit writes most: unpacking the sdist and git checking out the tree.

The disk is made "full" by the failures a full disk gives (an OSError with errno ENOSPC from the
unpacking; git's one `unable to write file` line per file, with the filesystem's free space
reported as zero), so no real filesystem has to be filled. Each must say that the disk is full,
name where, and never blame the verified cached sdist.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
from collections import namedtuple
from pathlib import Path

import pytest
from click.testing import CliRunner

from smla import cache, proc
from smla.cli import main

from gitfixtures import make_project, make_sdist


def cli(root: Path, tree: Path, *args: str):
    return CliRunner().invoke(main, ["--root", str(root), "--tree", str(tree), *args])


def test_disk_full_while_unpacking_blames_the_disk_not_the_cached_sdist(tmp_path, index, monkeypatch):
    sdist, sha = make_sdist(tmp_path)
    index.publish("vllm", [(sdist.name, sdist.read_bytes())])
    root = make_project(tmp_path, "http://127.0.0.1:9/nowhere.git", "2" * 40, sdist_sha=sha)

    def full(self, path, *args, **kwargs):
        (Path(path) / "partial").write_text("x")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(path) / "vllm-9.9.9" / "big.py"))

    monkeypatch.setattr(tarfile.TarFile, "extractall", full)
    res = cli(root, tmp_path / "work" / "vllm", "fetch", "--source", "sdist")
    assert res.exit_code == 15, res.output  # old code: exit 4, hint "delete it and fetch again"
    assert "no space left on the device" in res.output and "df -h" in res.output
    assert "delete" not in res.output
    assert (cache.downloads_dir() / sdist.name).is_file()  # the verified download is kept
    assert not (tmp_path / "work" / "vllm").exists()


FAKE_GIT = """#!/bin/sh
# git, except that checking out a scratch worktree fails as on a full disk (or, with {what}=create,
# as in a directory it may not write: git names the cause then)
case "$*" in
  *"worktree add"*)
    i=0
    while [ $i -lt 3000 ]; do echo "error: unable to {what} file vllm/file$i.py{why}" >&2; i=$((i+1)); done
    echo "fatal: {last}" >&2
    exit 128 ;;
esac
exec {git} "$@"
"""


def fake_git(bindir: Path, last: str, what: str = "write", why: str = "") -> None:
    fake = bindir / "git"
    fake.write_text(FAKE_GIT.format(git=shutil.which("git"), last=last, what=what, why=why))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("last, free", [("Could not reset index file to revision 'HEAD'.", 0),
                                        ("cannot write: No space left on device", 10 << 30),
                                        # git removed the partial worktree: the disk has room again
                                        ("Could not reset index file to revision 'HEAD'.", 95 << 20)])
def test_disk_full_while_applying_says_so_in_a_few_lines(series_project, tmp_path, monkeypatch, last, free):
    root, tree, _ = series_project
    head = proc.git_out(tree, "rev-parse", "HEAD")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_git(bindir, last)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(100 << 30, (100 << 30) - free, free))
    res = cli(root, tree, "apply")
    # old code: exit 12 with 3,000 lines of `unable to write file`, and the hint "run with -v"
    assert res.exit_code == 15, res.output[-2000:]
    assert "no space left on the device" in res.output and "df -h" in res.output
    assert len(res.output.splitlines()) < 10
    assert "-v" not in res.output.split("hint:", 1)[1]
    monkeypatch.undo()
    assert proc.git_out(tree, "rev-parse", "HEAD") == head
    assert not [p for p in tree.parent.iterdir() if p.name.startswith(".smla-")]


def test_a_file_git_may_not_create_is_not_called_a_full_disk(series_project, tmp_path, monkeypatch):
    root, tree, _ = series_project
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_git(bindir, "Could not reset index file", what="create", why=": Permission denied")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    res = cli(root, tree, "apply")
    assert res.exit_code == 15 and "could not write" in res.output and "no space" not in res.output
    assert "permissions" in res.output and len(res.output.splitlines()) < 10
