"""The real series on the real pinned vLLM source (the PyPI sdist, cached between runs)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from smla import apply as apply_mod, export as export_mod, series, source, status as status_mod
from smla.project import Project

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fresh_tree(tmp_path_factory):
    project = Project(ROOT)
    tree = tmp_path_factory.mktemp("real") / "vllm"
    info = source.fetch(project.pin(), tree, "sdist", echo=lambda *_: None)
    return project, tree, info


def test_real_series_applies_with_zero_fuzz_and_round_trips(fresh_tree, tmp_path):
    project, tree, info = fresh_tree
    pin = project.pin()
    assert info.upstream_commit == pin.commit and info.version == pin.version == "0.16.0"
    s = series.load(project.patches_dir)
    result = apply_mod.apply_series(s, tree, fuzz=0, echo=lambda *_: None)
    assert [o.state for o in result.outcomes] == ["applied"] * len(s.patches)
    assert all(o.offsets == [] for o in result.outcomes), "the series must apply to the pin without offsets"

    st = status_mod.status(pin, tree, s)
    assert [p["name"] for p in st["patches"]] == s.names()
    assert {p["state"] for p in st["patches"]} == {"already-applied"}
    assert st["matches_pin"] and not st["unexported"] and not st["uncommitted"] and not st["local_commits"]

    out = tmp_path / "patches"
    export_mod.export(tree, out)
    for name in [*s.names(), "series"]:
        assert (out / name).read_bytes() == (project.patches_dir / name).read_bytes(), name


def test_every_patch_has_a_header_saying_what_and_why():
    s = series.load(Project(ROOT).patches_dir)
    for p in s.patches:
        assert len(p.subject) > 10, p.name
        assert len(p.body) > 40, f"{p.name}: the header must say why"
