"""`smla rebase` on small synthetic repositories (fast, offline).

An "upstream" git repo serves as the mirror. Base C0 holds five files; the
series has one patch per file, made in a tree and exported with
export.export. C1 moves upstream so that each patch lands in a different
outcome class; C2 adds a conflict on top of C1.
"""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from smla import treeinfo
from smla import cache, proc, source
from smla import export as export_mod
from smla.cli import main
from smla.pin import load as load_pin

from gitfixtures import LINES, edit_lines, write_lines


@pytest.fixture()
def world(rebase_world):
    """Upstream mirror (C0, C1 clean, C2 conflicting), a toolkit root with pin + patches, a patched tree."""
    return rebase_world


def smla(world, *args: str):
    res = CliRunner().invoke(main, ["--root", str(world["root"]), "--tree", str(world["tree"]), "rebase", *args])
    return res


def snapshot(root: Path) -> dict[str, bytes]:
    files = {"vllm-pin.txt": (root / "vllm-pin.txt").read_bytes()}
    for f in sorted((root / "patches").iterdir()):
        files[f"patches/{f.name}"] = f.read_bytes()
    return files


def outcomes(data: dict) -> dict[str, str]:
    return {p["subject"].split(":")[0]: p["outcome"] for p in data["patches"]}


def test_clean_rebase_classifies_every_patch(world, tmp_path):
    res = smla(world, "--onto", world["c1"], "--source", str(world["up"]), "--json",
               "--report-dir", str(tmp_path / "rep"))
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert outcomes(data) == {"Patch a": "unchanged", "Patch b": "offsets", "Patch c": "merged",
                              "Patch d": "upstream", "Patch e": "unchanged"}
    assert data["status"] == "clean"
    assert data["pin"]["after"]["commit"] == world["c1"] and data["pin"]["changed"]
    b = next(p for p in data["patches"] if p["subject"].startswith("Patch b"))
    assert b["offsets"] and "offset 3 lines" in b["offsets"][0]
    # pin, tag, tree config and patches/ follow the new base
    root, tree = world["root"], world["tree"]
    assert f"commit = {world['c1']}" in (root / "vllm-pin.txt").read_text()
    assert (root / "vllm-pin.txt").read_text().startswith("# test pin")
    assert proc.git_out(tree, "rev-parse", f"{treeinfo.BASE_TAG}^{{commit}}") == world["c1"]
    assert treeinfo.read_tree_info(tree).upstream_commit == world["c1"]
    assert proc.git_out(tree, "symbolic-ref", "--short", "HEAD") == treeinfo.BRANCH
    series = (root / "patches" / "series").read_text().split()
    assert len(series) == 4 and not any("upstream" in n for n in series)
    assert not (tree / ".git" / "smla-rebase").exists()
    # the exported series applies to the new base exactly (re-apply from scratch)
    fresh = tmp_path / "fresh"
    proc.git(tmp_path, "clone", "-q", "--", str(world["up"]), str(fresh))
    proc.git(fresh, "checkout", "-q", world["c1"])
    for name in series:
        proc.git(fresh, "apply", "--check", "--", str(root / "patches" / name))
        proc.git(fresh, "apply", "--", str(root / "patches" / name))
    # reports
    md = (tmp_path / "rep" / "rebase-report.md").read_text()
    assert "| `0003-Patch-c-merged.patch` |" in md and "**merged**" in md and "vllm-pin.txt" in md
    assert json.loads((tmp_path / "rep" / "rebase-report.json").read_text())["status"] == "clean"
    assert "unchanged" in (tmp_path / "rep" / "rebase-report.txt").read_text()


def test_conflict_then_continue(world, tmp_path):
    before = snapshot(world["root"])
    res = smla(world, "--onto", world["c2"], "--source", str(world["up"]), "--report-dir", str(tmp_path / "rep"))
    assert res.exit_code == 11, res.output
    assert "conflict" in res.output and "e.py" in res.output
    data = json.loads((tmp_path / "rep" / "rebase-report.json").read_text())
    e = next(p for p in data["patches"] if p["subject"].startswith("Patch e"))
    assert e["outcome"] == "conflict" and e["files"] == ["e.py"] and "hunk #1 of e.py" in e["hunks"][0]
    assert data["stopped_at"] == e["name"]
    assert snapshot(world["root"]) == before  # nothing published yet
    tree = world["tree"]
    assert (tree / ".git" / "smla-rebase" / "state.json").is_file()
    assert "<<<<<<<" in (tree / "e.py").read_text()
    # a second start is refused while stopped
    again = smla(world, "--onto", world["c2"], "--source", str(world["up"]))
    assert again.exit_code == 7
    # continuing with the conflict unresolved is refused
    assert smla(world, "--continue").exit_code == 11
    write_lines(tree, "e.py", edit_lines(LINES, l30="E patched on top of upstream"))
    proc.git(tree, "add", "--", "e.py")
    res = smla(world, "--continue", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert outcomes(data)["Patch e"] == "resolved"
    assert data["pin"]["after"]["commit"] == world["c2"]
    last = (world["root"] / "patches" / "0004-Patch-e-conflicts.patch").read_text()
    assert "+E patched on top of upstream" in last and "-E upstream" in last
    assert not (tree / ".git" / "smla-rebase").exists()


def test_conflict_then_abort_restores_bytes(world):
    before = snapshot(world["root"])
    tree = world["tree"]
    head = proc.git_out(tree, "rev-parse", "HEAD")
    base = proc.git_out(tree, "rev-parse", f"{treeinfo.BASE_TAG}^{{commit}}")
    assert smla(world, "--onto", world["c2"], "--source", str(world["up"])).exit_code == 11
    # the user fiddles with patches/ and the pin in the meantime
    (world["root"] / "patches" / "0001-Patch-a-unchanged.patch").write_text("garbage")
    (world["root"] / "patches" / "stray.txt").write_text("x")
    (world["root"] / "vllm-pin.txt").write_text("broken")
    res = smla(world, "--abort")
    assert res.exit_code == 0, res.output
    after = snapshot(world["root"])
    assert {k: after[k] for k in before} == before  # what the rebase backed up, byte for byte
    # what the user made or edited meanwhile is kept and named, never deleted (docs/errors.md)
    assert {k: after[k] for k in after if k not in before} == {
        "patches/0001-Patch-a-unchanged.patch.smla-kept": b"garbage", "patches/stray.txt": b"x"}
    assert (world["root"] / "vllm-pin.txt.smla-kept").read_text() == "broken"
    for name in ("0001-Patch-a-unchanged.patch.smla-kept", "stray.txt", "vllm-pin.txt.smla-kept"):
        assert name in res.output
    assert proc.git_out(tree, "rev-parse", "HEAD") == head
    assert proc.git_out(tree, "rev-parse", f"{treeinfo.BASE_TAG}^{{commit}}") == base
    assert proc.git_out(tree, "symbolic-ref", "--short", "HEAD") == treeinfo.BRANCH
    assert proc.git(tree, "status", "--porcelain").stdout == ""
    assert "smla-rebase" not in proc.git_out(tree, "branch", "--list")
    assert treeinfo.read_tree_info(tree).upstream_commit == world["c0"]
    assert smla(world, "--abort").exit_code == 7  # nothing left to abort


def test_skip_during_conflict_reports_skipped(world):
    assert smla(world, "--onto", world["c2"], "--source", str(world["up"])).exit_code == 11
    proc.git(world["tree"], "am", "--skip")
    res = smla(world, "--continue", "--json")
    assert res.exit_code == 0, res.output
    assert outcomes(json.loads(res.output))["Patch e"] == "skipped"


def test_dirty_tree_refused(world):
    before = snapshot(world["root"])
    (world["tree"] / "a.py").write_text("local edit\n")
    res = smla(world, "--onto", world["c1"], "--source", str(world["up"]))
    assert res.exit_code == 7 and "uncommitted" in res.output
    assert snapshot(world["root"]) == before


def test_unexported_commit_refused(world):
    tree = world["tree"]
    write_lines(tree, "a.py", edit_lines(LINES, l5="A patched differently"))
    proc.git(tree, "commit", "-q", "--amend", "--no-edit", "-a")  # amends patch e's commit: edits e + a
    res = smla(world, "--onto", world["c1"], "--source", str(world["up"]))
    assert res.exit_code == 7 and "commits not in patches/" in res.output and "smla export" in res.output


@pytest.mark.parametrize("onto,code", [("not-a-target", 2), ("0" * 40, 4), ("deadbee", 4)])
def test_unknown_commit(world, onto, code):
    before = snapshot(world["root"])
    res = smla(world, "--onto", onto, "--source", str(world["up"]))
    assert res.exit_code == code, res.output
    assert snapshot(world["root"]) == before
    assert not (world["tree"] / ".git" / "smla-rebase").exists()


def test_unknown_version(world, monkeypatch):
    from smla.errors import FetchError

    def missing(project, filename):
        raise FetchError(f"{filename} is not on the package index")

    monkeypatch.setattr(cache, "pypi_file", missing)
    before = snapshot(world["root"])
    res = smla(world, "--onto", "0.99.0")
    assert res.exit_code == 4 and "vllm-0.99.0.tar.gz is not on the package index" in res.output
    assert snapshot(world["root"]) == before


def _fake_sdist(world, commit_id: str | None) -> bytes:
    """An sdist of C1 as vllm-0.0.2.tar.gz recording `commit_id` in vllm/_version.py (None: no _version.py)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name in "abcde":
            data = proc.git(world["up"], "show", f"{world['c1']}:{name}.py").stdout.encode()
            info = tarfile.TarInfo(f"vllm-0.0.2/{name}.py")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if commit_id is not None:
            data = f"__version__ = version = '0.0.2'\n__commit_id__ = commit_id = '{commit_id}'\n".encode()
            info = tarfile.TarInfo("vllm-0.0.2/vllm/_version.py")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_version_target_via_sdist(world, index):
    data = _fake_sdist(world, "g" + world["c1"][:9])
    index.publish("vllm", [("vllm-0.0.2.tar.gz", data)])
    sha = hashlib.sha256(data).hexdigest()
    res = smla(world, "--onto", "0.0.2", "--source", str(world["up"]), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    # the _version.py the sdist adds is new to the tree; a..e behave as for C1
    assert outcomes(data) == {"Patch a": "unchanged", "Patch b": "offsets", "Patch c": "merged",
                              "Patch d": "upstream", "Patch e": "unchanged"}
    pin = data["pin"]["after"]
    assert pin == {**pin, "commit": world["c1"], "commit_kind": "full", "version": "0.0.2",
                   "sdist": "vllm-0.0.2.tar.gz", "sdist_sha256": sha}
    assert "commit_kind" not in (world["root"] / "vllm-pin.txt").read_text()  # full: the key stays out
    tree = world["tree"]
    base = proc.git_out(tree, "rev-parse", f"{treeinfo.BASE_TAG}^{{commit}}")
    assert proc.git_out(tree, "rev-parse", f"{base}^") == world["c0"]  # child of the old base
    assert treeinfo.read_tree_info(tree).source == "sdist"


def test_rebase_with_the_package_index_alone_records_the_abbreviated_commit(world, index, tmp_path):
    """Issue 11: no git remote, no mirror: the pin gets the sdist's abbreviation, marked as such."""
    data = _fake_sdist(world, "gabcdef123")
    index.publish("vllm", [("vllm-0.0.2.tar.gz", data)])
    sha = hashlib.sha256(data).hexdigest()
    res = smla(world, "--onto", "0.0.2", "--source", "sdist", "--json", "--report-dir", str(tmp_path / "rep"))
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["pin"]["after"] == {**report["pin"]["after"], "commit": "abcdef123",
                                      "commit_kind": "abbreviated", "sdist_sha256": sha}
    assert any("abbreviated commit abcdef123" in n for n in report["target"]["notes"])
    assert "abbreviated" in (tmp_path / "rep" / "rebase-report.md").read_text()
    pin = load_pin(world["root"] / "vllm-pin.txt")  # the written pin validates
    assert (pin.commit, pin.commit_kind, pin.sdist_sha256) == ("abcdef123", "abbreviated", sha)
    text = (world["root"] / "vllm-pin.txt").read_text()
    assert "commit = abcdef123\ncommit_kind = abbreviated\n" in text
    tree = world["tree"]
    assert treeinfo.read_tree_info(tree).upstream_commit == "abcdef123"
    assert "Upstream-Commit: abcdef123 (abbreviated)" in proc.git_out(tree, "log", "-1", "--format=%B", "smla-base")

    # what needs the full id says so: a git fetch of this pin
    from smla.errors import FetchError

    with pytest.raises(FetchError, match="abbreviated commit abcdef123.*full 40-hex"):
        source.fetch(pin, tmp_path / "t-git", "git", echo=lambda *_: None)
    said = []
    assert source.fetch(pin, tmp_path / "t-auto", "auto", echo=said.append).source == "sdist"
    assert any("abbreviated" in s and "sdist" in s for s in said)
    # status, apply and the next rebase work on the abbreviated pin
    assert smla(world, "--onto", "0.0.2", "--source", "sdist").exit_code == 0  # nothing to rebase

    # completing the pin later: the full id must extend the abbreviation
    res = smla(world, "--onto", "0.0.2", "--upstream-commit", "1" * 40)
    assert res.exit_code == 2 and "does not match" in res.output
    full = "abcdef123" + "0" * 31
    res = smla(world, "--onto", "0.0.2", "--upstream-commit", full, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["status"] == "noop"
    pin = load_pin(world["root"] / "vllm-pin.txt")
    assert (pin.commit, pin.commit_kind) == (full, "full")
    assert treeinfo.read_tree_info(tree).upstream_commit == full


def test_version_target_resolved_from_upstream_commit(world, index):
    data = _fake_sdist(world, "gabcdef123")
    index.publish("vllm", [("vllm-0.0.2.tar.gz", data)])
    before = snapshot(world["root"])
    res = smla(world, "--onto", "0.0.2", "--upstream-commit", "1" * 40)
    assert res.exit_code == 2 and "does not match" in res.output
    assert snapshot(world["root"]) == before
    res = smla(world, "--onto", "0.0.2", "--upstream-commit", "abcdef123" + "0" * 31, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["pin"]["after"]["commit"] == "abcdef123" + "0" * 31


def test_version_target_without_any_commit_id_needs_upstream_commit(world, index):
    index.publish("vllm", [("vllm-0.0.2.tar.gz", _fake_sdist(world, None))])
    before = snapshot(world["root"])
    res = smla(world, "--onto", "0.0.2", "--source", "sdist")
    assert res.exit_code == 2 and "records no commit id" in res.output and "--upstream-commit" in res.output
    assert snapshot(world["root"]) == before


def test_missing_tree_is_fetched_and_patched_first(world, tmp_path):
    import shutil

    shutil.rmtree(world["tree"])
    res = smla(world, "--onto", world["c1"], "--source", str(world["up"]), "--json")
    assert res.exit_code == 0, res.output
    assert outcomes(json.loads(res.output))["Patch c"] == "merged"


def test_exactly_one_action(world):
    assert smla(world).exit_code == 2
    assert smla(world, "--onto", world["c1"], "--abort").exit_code == 2
    assert smla(world, "--continue").exit_code == 7  # nothing in progress


SUITE = '''
import os
from pathlib import Path

from smla import treeinfo
from smla.pin import load


def test_the_tree_is_at_the_new_pin():
    root, tree = Path(os.environ["SMLA_ROOT"]), Path(os.environ["SMLA_TREE"])
    assert treeinfo.read_tree_info(tree).upstream_commit == load(root / "vllm-pin.txt").commit
    assert FAIL == 0
'''


@pytest.mark.parametrize("fail", [0, 1])
def test_rebase_test_runs_the_suite_against_the_rebased_tree(world, fail):
    """`--test`: the suite of the toolkit root runs after the pin moved, against the new tree (fail: exit 13)."""
    (world["root"] / "tests").mkdir()
    (world["root"] / "tests" / "test_pinned.py").write_text(SUITE.replace("FAIL == 0", f"{fail} == 0"))
    res = smla(world, "--onto", world["c1"], "--source", str(world["up"]), "--test", "--json")
    report, _ = json.JSONDecoder().raw_decode(res.output[res.output.index("{"):])
    assert report["tests"]["passed"] is (not fail) and report["status"] == "clean"
    assert res.exit_code == (13 if fail else 0), res.output  # 13: TestsFailed
    assert "1 passed" in report["tests"]["tail"] or "1 failed" in report["tests"]["tail"]


# --- findings of the real 0.16.0 -> 0.26.0 run (notes/rebase-findings.md) -----------------------


def test_reports_follow_the_rebase_across_continue(world, tmp_path):
    """F2/F3/F5/F6/F7: --report-dir and --report-name are remembered, every stop is kept, the range-diff
    shows the resolution, and the written reports carry paths relative to the root."""
    rep = tmp_path / "rep"
    res = smla(world, "--onto", world["c2"], "--source", str(world["up"]), "--report-dir", str(rep),
               "--report-name", "auto")
    assert res.exit_code == 11, res.output
    name = f"rebase-0.0.1-to-{world['c2'][:12]}"
    stop = json.loads((rep / f"{name}.json").read_text())
    assert stop["status"] == "conflict" and [s["patch"] for s in stop["stops"]] == ["0005-Patch-e-conflicts.patch"]
    write_lines(world["tree"], "e.py", edit_lines(LINES, l30="E patched on top of upstream"))
    proc.git(world["tree"], "add", "--", "e.py")
    res = smla(world, "--continue")  # no --report-dir: the remembered one is used
    assert res.exit_code == 0, res.output
    final = json.loads((rep / f"{name}.json").read_text())
    assert final["status"] == "clean"
    assert final["stops"] == stop["stops"]  # the stop is still in the final report
    assert final["tree"] == "work/vllm" and final["export"]["directory"] == "patches"
    assert str(world["root"]) not in (rep / f"{name}.md").read_text()
    assert "+E patched on top of upstream" in final["range_diff"] and "Conflict stops" in (rep / f"{name}.md").read_text()
    assert sorted(p.name for p in rep.iterdir()) == [f"{name}.json", f"{name}.md", f"{name}.txt"]


def test_abort_reports_to_the_remembered_place(world, tmp_path):
    rep = tmp_path / "rep"
    assert smla(world, "--onto", world["c2"], "--source", str(world["up"]), "--report-dir", str(rep),
                "--report-name", "auto").exit_code == 11
    assert smla(world, "--abort").exit_code == 0
    name = f"rebase-0.0.1-to-{world['c2'][:12]}"
    assert json.loads((rep / f"{name}.json").read_text())["status"] == "aborted"
    assert sorted(p.name for p in rep.iterdir()) == [f"{name}.json", f"{name}.md", f"{name}.txt"]


def test_conflict_lists_only_the_hunks_with_markers(world, tmp_path):
    """F4: a hunk that fails plain apply but merges cleanly is not reported as conflicting."""
    tree, root, up = world["tree"], world["root"], world["up"]
    write_lines(tree, "e.py", edit_lines(LINES, l5="E early patched", l30="E patched"))
    proc.git(tree, "commit", "-q", "--amend", "--no-edit", "-a")
    export_mod.export(tree, root / "patches")
    write_lines(up, "e.py", edit_lines(LINES, l3="e context moved upstream", l30="E upstream"))
    proc.git(up, "commit", "-q", "-am", "C3")
    c3 = proc.git_out(up, "rev-parse", "HEAD")
    res = smla(world, "--onto", c3, "--source", str(up), "--json")
    assert res.exit_code == 11
    data, _ = json.JSONDecoder().raw_decode(res.output[res.output.index("{"):])
    e = next(p for p in data["patches"] if p["subject"].startswith("Patch e"))
    assert e["outcome"] == "conflict" and e["files"] == ["e.py"]
    assert len(e["hunks"]) == 1 and e["hunks"][0].startswith("hunk #2 of e.py"), e["hunks"]
    assert "merged without conflict markers: hunk #1 of e.py" in e["detail"]
    # and git agrees: the merged file has the first change and markers only around line 30
    text = (tree / "e.py").read_text()
    assert "E early patched" in text.split("<<<<<<<")[0]


def test_patches_that_only_add_files_are_flagged(world, tmp_path):
    """F1: a new-file patch always applies; the report says that this proves nothing about its code."""
    tree, root = world["tree"], world["root"]
    (tree / "new_backend.py").write_text("import a\n")
    proc.git(tree, "add", "--", "new_backend.py")
    proc.git(tree, "commit", "-q", "-m", "Patch f: a new module\n\nWhy: test.")
    export_mod.export(tree, root / "patches")
    res = smla(world, "--onto", world["c1"], "--source", str(world["up"]), "--report-dir", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "r" / "rebase-report.json").read_text())
    flags = {p["subject"].split(":")[0]: p["new_files_only"] for p in data["patches"]}
    assert flags["Patch f"] is True and flags["Patch a"] is False
    md = (tmp_path / "r" / "rebase-report.md").read_text()
    assert "adds new files only" in md and "--test" in md


def test_conflict_hunks_when_two_hunks_add_the_same_line(tmp_path):
    """F4, as in the real 0.26.0 -> 0.33.0 run: both hunks of the CUDA-priority patch add the same
    enum line; only the one inside the conflict block is reported."""
    import unidiff

    from smla import series as series_mod
    from smla.rebase import replay

    repo = tmp_path / "r"
    repo.mkdir()
    proc.git(repo, "init", "-q")
    base = ["def a():", "    return [", "        SM120,", "    ]", *[f"# filler {i}" for i in range(12)],
            "def b():", "    return [", "        MLA,", "        FLASHMLA_SPARSE,", "    ]"]
    write_lines(repo, "f.py", base)
    proc.git(repo, "add", "f.py")
    proc.git(repo, "commit", "-qm", "base")
    patched = list(base)
    patched.insert(3, "        TRITON_SPARSE,")
    patched.insert(len(patched) - 1, "        TRITON_SPARSE,")
    write_lines(repo, "f.py", patched)
    proc.git(repo, "commit", "-qam", "Add TRITON_SPARSE\n\nWhy: test.")
    text = proc.git(repo, "format-patch", "-1", "--stdout").stdout
    path = tmp_path / "0001-x.patch"
    path.write_text(text)
    # the merge: hunk 1 went in, hunk 2 conflicts with an upstream rewrite of b()
    merged = ["def a():", "    return [", "        SM120,", "        TRITON_SPARSE,", "    ]",
              *[f"# filler {i}" for i in range(12)], "def b():", "    return [",
              "<<<<<<< HEAD", "        *tail,", "=======", "        MLA,", "        FLASHMLA_SPARSE,",
              "        TRITON_SPARSE,", ">>>>>>> Add TRITON_SPARSE", "    ]"]
    write_lines(repo, "f.py", merged)
    patch = series_mod.parse_patch(path)
    got = replay.hunks_with_markers(repo, patch, unidiff.PatchSet(text), ["f.py"])
    assert len(got) == 1 and got[0].startswith("hunk #2 of f.py"), got


def test_empty_resolution_says_skip_not_abort(world):
    """F15(b): staging the new base's version of the file (nothing left of the patch) must not end
    with git am's own advice to abort; the tool says to skip the patch."""
    tree = world["tree"]
    assert smla(world, "--onto", world["c2"], "--source", str(world["up"])).exit_code == 11
    write_lines(tree, "e.py", edit_lines(LINES, l30="E upstream"))  # keep upstream's line: the patch is dropped
    proc.git(tree, "add", "--", "e.py")
    res = smla(world, "--continue")
    assert res.exit_code == 11
    assert "resolution of 0005-Patch-e-conflicts.patch is empty" in res.output
    assert "am --skip" in res.output and "git am --abort" not in res.output
    proc.git(tree, "am", "--skip")
    res = smla(world, "--continue", "--json")
    assert res.exit_code == 0 and outcomes(json.loads(res.output))["Patch e"] == "skipped"


def test_commit_target_report_has_no_credentials(world, tmp_path):
    from smla.rebase.target import Target

    t = Target("x", "commit", "1" * 40, "0.0.1", "none", "none", "git",
               fetch_from="https://bot:s3cret@github.example/vllm.git")
    assert "s3cret" not in json.dumps(t.to_dict()) and "***@github.example" in t.to_dict()["fetch_from"]


def test_a_refusal_writes_a_report_too(world, tmp_path):
    """F14: a rebase refused before it starts still leaves a report saying why (CI publishes it)."""
    rep = tmp_path / "rep"
    (world["tree"] / "a.py").write_text("dirty\n")
    res = smla(world, "--onto", world["c1"], "--source", str(world["up"]), "--report-dir", str(rep))
    assert res.exit_code == 7
    data = json.loads((rep / "rebase-report.json").read_text())
    assert data["status"] == "refused" and data["error"]["exit_code"] == 7 and "uncommitted" in data["error"]["message"]
    assert "Rebase refused" in (rep / "rebase-report.md").read_text()
    # a refused --continue changes nothing, so the stop's report stays
    proc.git(world["tree"], "checkout", "--", "a.py")
    assert smla(world, "--onto", world["c2"], "--source", str(world["up"]), "--report-dir", str(rep)).exit_code == 11
    assert smla(world, "--continue").exit_code == 11  # still unresolved
    assert json.loads((rep / "rebase-report.json").read_text())["status"] == "conflict"


def test_reword_while_resolving(world):
    """F8: a patch can be reworded during the rebase: finish `git am` yourself, amend the message,
    then `smla rebase --continue`; the new subject names the exported patch."""
    tree = world["tree"]
    assert smla(world, "--onto", world["c2"], "--source", str(world["up"])).exit_code == 11
    write_lines(tree, "e.py", edit_lines(LINES, l30="E patched on top of upstream"))
    proc.git(tree, "add", "--", "e.py")
    proc.git(tree, "am", "--continue")
    proc.git(tree, "commit", "-q", "--amend", "-m", "Patch e: reworded for the new base\n\nWhy: upstream moved.")
    res = smla(world, "--continue", "--json")
    assert res.exit_code == 0, res.output
    e = next(p for p in json.loads(res.output)["patches"] if p["subject"].startswith("Patch e"))
    assert e["outcome"] == "resolved" and e["new_names"] == ["0004-Patch-e-reworded-for-the-new-base.patch"]
    assert (world["root"] / "patches" / "0004-Patch-e-reworded-for-the-new-base.patch").is_file()
    assert not (world["root"] / "patches" / "0005-Patch-e-conflicts.patch").exists()


def test_json_conflict_stop_is_one_json_object(world):
    """stdout under --json is one object: the report, with the stop's `error` (kind, hint, exit code)."""
    res = smla(world, "--onto", world["c2"], "--source", str(world["up"]), "--json")
    assert res.exit_code == 11
    data = json.loads(res.stdout)  # old code: the report, then a second document (the error)
    assert data["status"] == "conflict" and data["stopped_at"]
    assert data["error"]["kind"] == "RebaseConflict" and data["error"]["exit_code"] == 11
    assert "--continue" in data["error"]["hint"]
