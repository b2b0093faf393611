"""vllm-pin.txt: the optional `commit_kind` (issue 11: a release pinned from PyPI alone)."""
from __future__ import annotations

import pytest

from smla import pin as pin_mod
from smla.errors import PinError

BASE = """# a pin
repo = https://github.com/vllm-project/vllm.git
commit = {commit}
version = 0.26.0
sdist = {sdist}
sdist_sha256 = {sha}
"""
SHA = "23e9fa19d7e20ce7dcc1c074d41503e2116d23f19e688f5d5ea91b741f958502"


def write(tmp_path, extra: str = "", commit: str = "f2654939e", sdist: str = "vllm-0.26.0.tar.gz", sha: str = SHA):
    p = tmp_path / "vllm-pin.txt"
    p.write_text(BASE.format(commit=commit, sdist=sdist, sha=sha) + extra)
    return p


def test_abbreviated_commit_needs_commit_kind(tmp_path):
    with pytest.raises(PinError, match="needs `commit_kind = abbreviated`"):
        pin_mod.load(write(tmp_path))
    p = pin_mod.load(write(tmp_path, "commit_kind = abbreviated\n"))
    assert (p.commit, p.commit_is_full, p.commit_label()) == ("f2654939e", False, "f2654939e (abbreviated)")


@pytest.mark.parametrize("commit,extra,sdist,sha,message", [
    ("f2654939e", "commit_kind = short\n", "vllm-0.26.0.tar.gz", SHA, "commit_kind must be"),
    ("f2654", "commit_kind = abbreviated\n", "vllm-0.26.0.tar.gz", SHA, "7-39 lowercase hex"),
    ("f2654939e69b4069b13977e9aef3e31d4dcaf051", "commit_kind = abbreviated\n", "vllm-0.26.0.tar.gz", SHA,
     "7-39 lowercase hex"),
    ("F2654939E", "commit_kind = abbreviated\n", "vllm-0.26.0.tar.gz", SHA, "7-39 lowercase hex"),
    ("f2654939e", "commit_kind = abbreviated\n", "none", "none", "needs an sdist"),
    ("f2654939e", "commit_kind = abbreviated\ncommit_kind = full\n", "vllm-0.26.0.tar.gz", SHA, "duplicate key"),
])
def test_validation_stays_strict(tmp_path, commit, extra, sdist, sha, message):
    with pytest.raises(PinError, match=message):
        pin_mod.load(write(tmp_path, extra, commit=commit, sdist=sdist, sha=sha))


def test_full_pin_without_the_key_is_full(tmp_path):
    p = pin_mod.load(write(tmp_path, commit="f2654939e69b4069b13977e9aef3e31d4dcaf051"))
    assert p.commit_is_full and p.commit_kind == "full"


def test_save_adds_and_keeps_the_key(tmp_path):
    path = write(tmp_path, commit="f2654939e69b4069b13977e9aef3e31d4dcaf051")
    full = pin_mod.load(path)
    pin_mod.save(path, full.with_changes(commit="4ba787ec9", commit_kind="abbreviated", version="0.33.0",
                                          sdist="vllm-0.33.0.tar.gz"))
    text = path.read_text()
    assert "commit = 4ba787ec9\ncommit_kind = abbreviated\nversion = 0.33.0\nsdist = vllm-0.33.0.tar.gz\n" in text and text.startswith("# a pin")
    again = pin_mod.load(path)
    assert (again.commit, again.commit_kind) == ("4ba787ec9", "abbreviated")
    pin_mod.save(path, again.with_changes(commit="4" * 40, commit_kind="full"))
    assert pin_mod.load(path).commit_is_full and "commit_kind = full" in path.read_text()
    # a full pin written from scratch gets no commit_kind line
    path2 = write(tmp_path / "x" if (tmp_path / "x").mkdir() is None else tmp_path,
                  commit="f2654939e69b4069b13977e9aef3e31d4dcaf051")
    pin_mod.save(path2, pin_mod.load(path2).with_changes(version="0.26.1", sdist="vllm-0.26.1.tar.gz"))
    assert "commit_kind" not in path2.read_text()
