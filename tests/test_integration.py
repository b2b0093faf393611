"""The series on its pinned vLLM source: fetch, apply with zero fuzz, status, byte-exact export.

Pin-agnostic: everything comes from vllm-pin.txt (no version is named here),
and the source follows the pin: the cached PyPI sdist for a release pin, git
for a commit pin (`sdist = none`). The same checks run on a second project,
a commit pin on a small local git "vLLM", so both kinds of pin are covered
on every run.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from smla import apply as apply_mod, export as export_mod, proc, series, source, status as status_mod
from smla.pin import Pin
from smla.project import Project

from gitfixtures import REPO_ROOT, commit_change, make_upstream, quiet

ROOT = Path(os.environ.get("SMLA_ROOT") or REPO_ROOT)  # the toolkit checkout whose pin and series are checked


def source_for(pin: Pin) -> str:
    """How the suite fetches a pin: the (cached) sdist of a release, git for a commit pin."""
    return "sdist" if pin.has_sdist else "auto"


def commit_pin_project(tmp: Path) -> Project:
    """A toolkit root pinned to a commit (sdist = none) of a local git upstream, with a two-patch series."""
    upstream, commit = make_upstream(tmp)
    root = tmp / "project"
    (root / "lines" / "9.9.9" / "patches").mkdir(parents=True)
    (root / "lines" / "9.9.9" / "vllm-pin.txt").write_text(
        "# a commit pin (a nightly after `smla rebase --onto <commit>`)\n"
        f"repo = {upstream}\ncommit = {commit}\nversion = 9.9.9\nsdist = none\nsdist_sha256 = none\n"
    )
    project = Project(root, "9.9.9")
    tree = tmp / "authoring"
    source.fetch(project.pin(), tree, "git", **quiet)
    lines = (tree / "vllm/platforms/cuda.py").read_text().replace("line 20\n", "line 20 patched\n")
    commit_change(tree, {"vllm/platforms/cuda.py": lines}, "Patch the priority list",
                  "Why: the fixture's backend must be picked where upstream has none.")
    commit_change(tree, {"vllm/backend_new.py": "NEW = True\n"}, "Add the backend module",
                  "Why: the fixture's new backend lives in its own module.")
    export_mod.export(tree, project.patches_dir)
    return project


@pytest.fixture(scope="module", params=["pinned", "commit-pin"])
def fresh_tree(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    project = Project.at(ROOT) if request.param == "pinned" else commit_pin_project(tmp)  # the line under test
    pin = project.pin()
    tree = tmp / "vllm"
    info = source.fetch(pin, tree, source_for(pin), **quiet)
    return project, tree, info


def test_series_applies_to_the_pin_with_zero_fuzz_and_round_trips(fresh_tree, tmp_path):
    project, tree, info = fresh_tree
    pin = project.pin()
    assert (info.upstream_commit, info.version) == (pin.commit, pin.version)
    assert info.source == ("sdist" if pin.has_sdist else "git")
    s = series.load(project.patches_dir)
    result = apply_mod.apply_series(s, tree, fuzz=0, **quiet)
    assert [o.state for o in result.outcomes] == ["applied"] * len(s.patches)
    assert all(o.offsets == [] for o in result.outcomes), "the series must apply to the pin without offsets"

    st = status_mod.status(pin, tree, s)
    assert [p["name"] for p in st["patches"]] == s.names()
    assert {p["state"] for p in st["patches"]} == {"already-applied"}
    assert st["matches_pin"] and not st["uncommitted"] and not st["local_commits"]

    out = tmp_path / "patches"
    export_mod.export(tree, out)
    for name in [*s.names(), "series"]:
        assert (out / name).read_bytes() == (project.patches_dir / name).read_bytes(), name


def test_every_patch_has_a_header_saying_what_and_why(fresh_tree):
    project, _, _ = fresh_tree
    for p in series.load(project.patches_dir).patches:
        assert len(p.subject) > 10, p.name
        assert len(p.body) > 40, f"{p.name}: the header must say why"


def test_the_commit_pin_is_not_fetched_from_an_sdist(tmp_path):
    from smla.errors import FetchError

    pin = commit_pin_project(tmp_path).pin()
    assert not pin.has_sdist
    with pytest.raises(FetchError, match="not a release"):
        source.fetch(pin, tmp_path / "t", "sdist", **quiet)
    assert proc.git_out(Path(pin.repo), "rev-parse", "HEAD") == pin.commit
