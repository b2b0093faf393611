"""One writer per work tree: real concurrent smla processes, and fetch never removing a tree
it did not check (real git, a local HTTP index that holds the download open)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from smla import lock, source
from smla.errors import LockError, TreeStateError

from gitfixtures import make_project, make_sdist, make_upstream, pin_for, quiet


@pytest.fixture
def slow_index(index, tmp_path):
    """The local package index, whose sdist download blocks until `release` is set."""
    sdist, sha = make_sdist(tmp_path)
    release = threading.Event()
    index.publish("vllm", [(sdist.name, sdist.read_bytes())])
    index.routes[f"/files/{sdist.name}"] = (sdist.read_bytes(), {"wait": release})
    yield index.base, sha, release
    release.set()


def _smla(root: Path, tree: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "smla.cli", "--root", str(root), "--tree", str(tree), *args]


def test_concurrent_runs_on_one_tree_are_refused_with_the_holder_pid(tmp_path, slow_index):
    base, sha, release = slow_index
    root = make_project(tmp_path, "http://127.0.0.1:9/nowhere.git", "2" * 40, sdist_sha=sha)
    tree = tmp_path / "work" / "vllm"
    env = {**os.environ, "SMLA_INDEX_URL": f"{base}/simple", "SMLA_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.Popen(_smla(root, tree, "fetch", "--source", "sdist"), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while lock.holder(tree) != str(first.pid):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first fetch never took the lock"
            time.sleep(0.05)
        for args in (("fetch", "--source", "sdist"), ("patch", "--source", "sdist"), ("apply",), ("export",)):
            second = subprocess.run(_smla(root, tree, *args), env=env, capture_output=True, text=True,
                                    timeout=120)
            assert second.returncode == LockError.exit_code, (args, second.stderr)
            assert f"another smla run holds the lock on {tree} (pid {first.pid})" in second.stderr
        assert not tree.exists()  # nobody touched it while the first run worked
    finally:
        release.set()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert (tree / "vllm" / "registry.py").is_file()
    (tree / "mine.txt").write_text("written into the finished tree")
    again = subprocess.run(_smla(root, tree, "fetch", "--source", "sdist"), env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0 and "nothing to fetch" in again.stdout
    assert (tree / "mine.txt").read_text() == "written into the finished tree"
    assert not lock.lock_path(tree).exists()


def test_lock_is_reentrant_in_one_process_and_released(tmp_path):
    tree = tmp_path / "t"
    with lock.hold(tree):
        with lock.hold(tree):
            assert lock.holder(tree) == str(os.getpid())
        assert lock.lock_path(tree).exists()
    assert not lock.lock_path(tree).exists()


def test_fetch_rechecks_the_target_after_filling(tmp_path, monkeypatch):
    """A tree that appears while fetch fills its temp dir (a writer that ignores the lock) is
    never removed without --force; old code rmtree'd it."""
    upstream, commit = make_upstream(tmp_path)
    tree = tmp_path / "tree"
    real_fill = source._fill

    def fill_while_someone_else_writes(pin, repo, spec, echo):
        kind = real_fill(pin, repo, spec, echo)
        tree.mkdir()
        (tree / "theirs.txt").write_text("keep me")
        return kind

    monkeypatch.setattr(source, "_fill", fill_while_someone_else_writes)
    with pytest.raises(TreeStateError, match="not an smla work tree"):
        source.fetch(pin_for(upstream, commit), tree, "git", **quiet)
    assert (tree / "theirs.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tree.")]


def test_fetch_force_rechecks_unsaved_work_after_filling(tmp_path, monkeypatch):
    upstream, first = make_upstream(tmp_path)
    tree = tmp_path / "tree"
    source.fetch(pin_for(upstream, first), tree, "git", **quiet)
    calls = []

    def guard(t):
        calls.append(t)
        if len(calls) > 1:  # work appeared while filling
            raise TreeStateError("holds work")

    with pytest.raises(TreeStateError, match="holds work"):
        source.fetch(pin_for(upstream, first), tree, "git", force=True, guard=guard, **quiet)
    assert len(calls) == 2 and (tree / ".git").is_dir()
