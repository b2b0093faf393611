"""fetch: git remotes, sdists, the download cache and the pin file (real git, local HTTP)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from smla import treeinfo
from smla import cache, pin as pin_mod, proc, source
from smla.errors import ChecksumError, FetchError, PinError, TreeStateError

from conftest import line_dir
from gitfixtures import FILES, REPO_ROOT, make_sdist, make_upstream, pin_for, quiet


def _publish(index, name: str, data: bytes, sha: str, extra=None):
    """List `name` with the given sha256 (which need not match `data`)."""
    index.routes["/simple/vllm/"] = (json.dumps({"files": [{"filename": name, "url": f"{index.base}/files/{name}",
                                                             "hashes": {"sha256": sha}}]}).encode(), None)
    index.routes[f"/files/{name}"] = (data, extra)


def _cache_leftovers(tmp_path: Path) -> list[str]:
    d = tmp_path / "cache" / "downloads"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


# --- pin ------------------------------------------------------------------

def test_pin_loads_and_rejects_bad_values(tmp_path):
    good = line_dir() / "vllm-pin.txt"
    p = pin_mod.load(good)  # the repository's own pin loads, whatever it pins
    assert p.commit and p.version
    bad = tmp_path / "pin.txt"
    text = good.read_text()
    bad.write_text(text.replace(f"commit = {p.commit}", "commit = not-hex"))
    with pytest.raises(PinError, match="lowercase hex"):
        pin_mod.load(bad)
    bad.write_text(text + "colour = blue\n")
    with pytest.raises(PinError, match="unknown key 'colour'"):
        pin_mod.load(bad)
    bad.write_text("\n".join(l for l in text.splitlines() if not l.startswith("sdist_sha256")))
    with pytest.raises(PinError, match="missing key"):
        pin_mod.load(bad)


def test_pin_save_keeps_comments(tmp_path):
    src = line_dir() / "vllm-pin.txt"
    path = tmp_path / "pin.txt"
    path.write_text(src.read_text())
    p = pin_mod.load(path)
    pin_mod.save(path, p.with_changes(version="0.17.0", sdist="vllm-0.17.0.tar.gz"))
    assert pin_mod.load(path).version == "0.17.0"
    assert [l for l in path.read_text().splitlines() if l.startswith("#")] == \
        [l for l in src.read_text().splitlines() if l.startswith("#")]


# --- git source -----------------------------------------------------------

def test_fetch_from_local_remote_then_rerun_is_noop(tmp_path):
    upstream, commit = make_upstream(tmp_path)
    tree = tmp_path / "work" / "vllm"
    info = source.fetch(pin_for(upstream, commit), tree, "git", **quiet)
    assert info.upstream_commit == commit and info.source == "git"
    assert proc.git_out(tree, "rev-parse", "smla-base") == commit
    assert (tree / "vllm" / "registry.py").read_text() == "A = 1\nB = 2\nC = 3\n"
    said = []
    source.fetch(pin_for(upstream, commit), tree, "git", echo=said.append)
    assert "nothing to fetch" in said[0]


def test_fetch_refuses_tree_at_other_commit_unless_forced(tmp_path):
    upstream, first = make_upstream(tmp_path)
    tree = tmp_path / "tree"
    source.fetch(pin_for(upstream, first), tree, "git", **quiet)
    (upstream / "README.md").write_text("next\n")
    proc.git(upstream, "commit", "-qam", "next")
    second = proc.git_out(upstream, "rev-parse", "HEAD")
    with pytest.raises(TreeStateError, match="but the pin is"):
        source.fetch(pin_for(upstream, second), tree, "git", **quiet)
    info = source.fetch(pin_for(upstream, second), tree, "git", force=True, **quiet)
    assert info.upstream_commit == second and (tree / "README.md").read_text() == "next\n"


def test_fetch_unknown_commit_fails_and_leaves_nothing(tmp_path):
    upstream, _ = make_upstream(tmp_path)
    tree = tmp_path / "tree"
    with pytest.raises(FetchError):
        source.fetch(pin_for(upstream, "1" * 40), tree, "git", **quiet)
    assert not tree.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tree")]


def test_fetch_refuses_foreign_directory(tmp_path):
    upstream, commit = make_upstream(tmp_path)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "mine.txt").write_text("keep me")
    with pytest.raises(TreeStateError, match="not an smla work tree"):
        source.fetch(pin_for(upstream, commit), tree, "git", **quiet)
    assert (tree / "mine.txt").read_text() == "keep me"


# --- sdist source ---------------------------------------------------------

def test_auto_falls_back_to_sdist_when_remote_unreachable(tmp_path, index):
    sdist, sha = make_sdist(tmp_path)
    _publish(index, sdist.name, sdist.read_bytes(), sha)
    said = []
    tree = tmp_path / "tree"
    info = source.fetch(pin_for("http://127.0.0.1:9/nowhere.git", "2" * 40, sha), tree, "auto", echo=said.append)
    assert info.source == "sdist" and info.upstream_commit == "2" * 40
    assert any("unreachable" in s and "sdist" in s for s in said)
    assert (tree / "vllm" / "registry.py").is_file()
    assert proc.git(tree, "status", "--porcelain").stdout == ""
    # the base commit of an sdist is reproducible: same content, same id
    tree2 = tmp_path / "tree2"
    source.fetch(pin_for("http://127.0.0.1:9/nowhere.git", "2" * 40, sha), tree2, "sdist", **quiet)
    assert treeinfo.read_tree_info(tree2).base == info.base
    # second fetch into a new tree used the cache: the index may be gone
    index.routes.clear()
    tree3 = tmp_path / "tree3"
    source.fetch(pin_for("x", "2" * 40, sha), tree3, "sdist", **quiet)


def test_sdist_checksum_mismatch_leaves_no_cache_file(tmp_path, index):
    sdist, sha = make_sdist(tmp_path)
    _publish(index, sdist.name, b"not the sdist" * 100, sha)
    with pytest.raises(ChecksumError, match="sha256 mismatch"):
        source.fetch(pin_for("x", "3" * 40, sha), tmp_path / "tree", "sdist", **quiet)
    assert _cache_leftovers(tmp_path) == []
    assert not (tmp_path / "tree").exists()


def test_interrupted_download_leaves_no_corrupt_cache(tmp_path, index):
    sdist, sha = make_sdist(tmp_path)
    _publish(index, sdist.name, sdist.read_bytes() * 50, sha, {"truncate": True})
    with pytest.raises(FetchError):
        cache.fetch(f"{index.base}/files/{sdist.name}", tmp_path / "cache" / "downloads" / sdist.name, sha, quiet=True)
    assert _cache_leftovers(tmp_path) == []


def test_corrupt_cached_file_is_replaced(tmp_path, index):
    sdist, sha = make_sdist(tmp_path)
    _publish(index, sdist.name, sdist.read_bytes(), sha)
    dest = tmp_path / "cache" / "downloads" / sdist.name
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"garbage")
    cache.fetch(lambda: cache.pypi_file("vllm", sdist.name)[0], dest, sha, quiet=True)
    assert dest.read_bytes() == sdist.read_bytes()


def test_local_sdist_path_is_verified(tmp_path):
    sdist, sha = make_sdist(tmp_path)
    with pytest.raises(ChecksumError):
        source.fetch(pin_for("x", "4" * 40, "f" * 64), tmp_path / "tree", str(sdist), **quiet)
    info = source.fetch(pin_for("x", "4" * 40, sha), tmp_path / "tree", str(sdist), **quiet)
    assert info.source == "sdist"


def test_pin_without_sdist_is_fetched_with_git_only(tmp_path, index):
    upstream, commit = make_upstream(tmp_path)
    nightly = pin_for(upstream, commit).with_changes(sdist="none", sdist_sha256="none")
    with pytest.raises(FetchError, match="not a release"):
        source.fetch(nightly, tmp_path / "t1", "sdist", **quiet)
    unreachable = nightly.with_changes(repo="http://127.0.0.1:9/nowhere.git")
    with pytest.raises(FetchError, match="names no sdist"):
        source.fetch(unreachable, tmp_path / "t2", "auto", **quiet)
    assert source.fetch(nightly, tmp_path / "t3", "auto", **quiet).source == "git"
    with pytest.raises(PinError, match="both be 'none'"):
        nightly.with_changes(sdist_sha256="a" * 64)


def test_sdist_recording_another_commit_is_refused(tmp_path):
    files = {**FILES, "vllm/_version.py": "__commit_id__ = commit_id = 'gabcdef123'\n"}
    sdist, sha = make_sdist(tmp_path, files)
    with pytest.raises(FetchError, match="holds vLLM commit abcdef123"):
        source.fetch(pin_for("x", "4" * 40, sha), tmp_path / "tree", str(sdist), **quiet)
    info = source.fetch(pin_for("x", "abcdef123" + "0" * 31, sha), tmp_path / "tree", str(sdist),
                        **quiet)
    assert info.source == "sdist"


def test_tree_path_that_is_a_file_is_a_clear_error(tmp_path):
    upstream, commit = make_upstream(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TreeStateError, match="is a file"):
        source.fetch(pin_for(upstream, commit), tmp_path / "file", "git", **quiet)
