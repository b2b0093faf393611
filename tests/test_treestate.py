"""The tree equals the series by content: pulled series changes, both-changed refusals,
status hints and `status --check`, non-ASCII Subjects (real temporary git repos)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from smla import treeinfo
from smla import apply as apply_mod, export as export_mod, proc, series, source, status as status_mod, treestate
from smla.cli import main
from smla.errors import ExportError, NotInSync, TreeStateError

import gitfixtures
from gitfixtures import commit_change, quiet, patches_dir, pin_file
KERNEL = "0001-Add-the-kernel-module.patch"


def load(root: Path) -> series.Series:
    return series.load(patches_dir(root))


def cli(root: Path, tree: Path, *args: str):
    return CliRunner().invoke(main, [*args, "--root", str(root), "--tree", str(tree)])


def teammate_changes_kernel(tmp_path: Path, root: Path, pin) -> None:
    """Another developer rewrites patch 0001 in their own tree and exports it to patches/
    (what `git pull` then brings to everyone else)."""
    mate = tmp_path / "mate"
    source.fetch(pin, mate, "git", **quiet)
    apply_mod.apply_series(load(root), mate, **quiet)
    later = proc.git_out(mate, "rev-list", "--reverse", "smla-base..HEAD").split()[1:]
    proc.git(mate, "reset", "-q", "--hard", "smla-base")
    commit_change(mate, {"vllm/ops/kernel.py": "def k():\n    return 2  # the fix\n"}, "Add the kernel module",
                  "Why: the backend needs a kernel.")
    for c in later:
        proc.git(mate, "cherry-pick", c)
    result = export_mod.export(mate, patches_dir(root))
    assert result.written == [KERNEL], result


@pytest.fixture
def applied(series_project):
    root, tree, pin = series_project
    apply_mod.apply_series(load(root), tree, **quiet)
    return root, tree, pin


def test_pulled_series_change_is_rebuilt_by_apply(applied, tmp_path):
    root, tree, pin = applied
    teammate_changes_kernel(tmp_path, root, pin)
    said = []
    result = apply_mod.apply_series(load(root), tree, echo=said.append)
    # old code: "all 3 patches already applied; nothing to do" and the old kernel stayed
    assert result.rebuilt and result.changed_patches == [KERNEL]
    assert any(KERNEL in s and "changed" in s and "rebuilding" in s for s in said), said
    assert "return 2  # the fix" in (tree / "vllm/ops/kernel.py").read_text()
    assert len(treeinfo.commits_above_base(tree)) == 3
    assert treestate.compare(tree, load(root)).in_sync
    again = []
    apply_mod.apply_series(load(root), tree, echo=again.append)
    assert "nothing to do" in again[0]


def test_make_patch_rebuilds_after_a_pull(applied, tmp_path):
    root, tree, pin = applied
    teammate_changes_kernel(tmp_path, root, pin)
    res = cli(root, tree, "patch", "--source", "git")  # what `make patch` runs
    assert res.exit_code == 0, res.output
    assert f"{KERNEL} (changed)" in res.output
    assert "return 2  # the fix" in (tree / "vllm/ops/kernel.py").read_text()


def test_fresh_tree_status_says_apply(series_project):
    root, tree, pin = series_project
    s = status_mod.status(pin, tree, load(root))
    assert s["state"] == "patches-newer" and {p["state"] for p in s["patches"]} == {"pending"}
    assert s["hint"].startswith("`smla apply` applies 0001-")


def test_status_tells_patches_newer_and_its_hint_loses_nothing(applied, tmp_path):
    root, tree, pin = applied
    teammate_changes_kernel(tmp_path, root, pin)
    pulled = (patches_dir(root) / KERNEL).read_bytes()
    s = status_mod.status(pin, tree, load(root))
    assert s["state"] == "patches-newer" and not s["in_sync"]
    assert s["changed_patches"] == [{"name": KERNEL, "change": "changed"}]
    assert s["local_commits"] == []  # old code: "committed but not exported"
    assert "smla apply" in s["hint"] and "export" not in s["hint"]
    assert "patches/ is newer than the tree" in status_mod.text(s)
    # the command the old hint pointed at is refused now: it would overwrite the pulled fix
    with pytest.raises(ExportError, match="patches/ changed since the tree"):
        export_mod.export(tree, patches_dir(root))
    assert (patches_dir(root) / KERNEL).read_bytes() == pulled
    # following the hint keeps the pulled fix
    apply_mod.apply_series(load(root), tree, **quiet)
    assert (patches_dir(root) / KERNEL).read_bytes() == pulled
    assert status_mod.status(pin, tree, load(root))["state"] == "in-sync"


def test_status_tells_tree_edits_and_hints_export(applied):
    root, tree, pin = applied
    commit_change(tree, {"vllm/new.py": "x = 1\n"}, "A local fix")
    s = status_mod.status(pin, tree, load(root))
    assert s["state"] == "tree-edited" and [c["subject"] for c in s["local_commits"]] == ["A local fix"]
    assert "`smla export`" in s["hint"]
    export_mod.export(tree, patches_dir(root))
    assert status_mod.status(pin, tree, load(root))["state"] == "in-sync"


def test_amended_patch_commit_is_an_edit_exported_in_place(applied):
    root, tree, pin = applied
    (tree / "vllm/registry.py").write_text("A = 1\nB = 2\nSPARSE = 10\nC = 3\n")
    proc.git(tree, "commit", "-qa", "--fixup", "HEAD~1")
    proc.git(tree, "-c", "sequence.editor=true", "rebase", "-q", "-i", "--autosquash", "smla-base",
             env={"GIT_SEQUENCE_EDITOR": "true"})
    st = treestate.compare(tree, load(root))
    assert st.kind == treestate.TREE_EDITED and [s for _, s in st.edited] == ["Register the backend"]
    assert st.dropped == []
    result = export_mod.export(tree, patches_dir(root))  # no --prune needed: the patch is rewritten
    assert result.written == ["0002-Register-the-backend.patch"]
    assert treestate.compare(tree, load(root)).in_sync


def test_both_changed_is_refused_naming_patches_and_both_ways_out(applied, tmp_path):
    root, tree, pin = applied
    local = commit_change(tree, {"vllm/new.py": "x = 1\n"}, "A local fix")
    teammate_changes_kernel(tmp_path, root, pin)
    head = proc.git_out(tree, "rev-parse", "HEAD")
    with pytest.raises(TreeStateError, match="both changed") as err:
        apply_mod.apply_series(load(root), tree, **quiet)
    msg, hint = err.value.message, err.value.hint
    assert KERNEL in msg and local[:12] in msg and "A local fix" in msg
    assert "smla export --force" in hint and "git -C" in hint and "branch" in hint and "cherry-pick" in hint
    assert proc.git_out(tree, "rev-parse", "HEAD") == head
    with pytest.raises(ExportError, match="patches/ changed since the tree"):
        export_mod.export(tree, patches_dir(root))
    s = status_mod.status(pin, tree, load(root))
    assert s["state"] == "diverged"
    assert "branch" in s["hint"] and "cherry-pick" in s["hint"] and "--force" not in s["hint"]
    # the status hint's first way keeps both: save the commit, take patches/, redo the commit, export
    proc.git(tree, "branch", "-f", "smla-saved", "HEAD")
    proc.git(tree, "reset", "--keep", "smla-base")
    apply_mod.apply_series(load(root), tree, **quiet)
    proc.git(tree, "cherry-pick", local)
    export_mod.export(tree, patches_dir(root))
    names = load(root).names()
    assert names[-1] == "0004-A-local-fix.patch" and "return 2  # the fix" in (tree / "vllm/ops/kernel.py").read_text()
    assert status_mod.status(pin, tree, load(root))["state"] == "in-sync"


def test_export_force_overwrites_on_purpose(applied, tmp_path):
    root, tree, pin = applied
    teammate_changes_kernel(tmp_path, root, pin)
    export_mod.export(tree, patches_dir(root), force=True)
    assert "return 2" not in (patches_dir(root) / KERNEL).read_text()
    assert treestate.compare(tree, load(root)).in_sync


def test_fetch_force_replaces_a_tree_that_only_lags_behind(applied, tmp_path):
    root, tree, pin = applied
    teammate_changes_kernel(tmp_path, root, pin)
    # old code refused: "committed but not exported" for the stale commit
    res = cli(root, tree, "fetch", "--force", "--source", "git")
    assert res.exit_code == 0, res.output
    assert treeinfo.commits_above_base(tree) == []


def test_status_check_exit_codes(applied, tmp_path):
    root, tree, pin = applied
    ok = cli(root, tree, "status", "--check")
    assert ok.exit_code == 0, ok.output
    assert cli(root, tree, "status").exit_code == 0
    teammate_changes_kernel(tmp_path, root, pin)
    newer = cli(root, tree, "status", "--check")
    assert newer.exit_code == NotInSync.exit_code == 7 and "patches-newer" in newer.output
    assert cli(root, tree, "status").exit_code == 0  # without --check: a report, exit 0
    assert cli(root, tree, "apply").exit_code == 0
    assert cli(root, tree, "status", "--check").exit_code == 0
    (tree / "README.md").write_text("dirty\n")
    js = cli(root, tree, "status", "--check", "--json")
    assert js.exit_code == 7 and json.loads(js.stdout)["uncommitted"] == ["README.md"]


def test_no_record_and_changed_commit_is_not_guessed(applied):
    """A tree made by an older smla (no record) whose commit differs from patches/: either side may
    have changed, so neither apply nor a plain export picks one."""
    root, tree, pin = applied
    treestate._record_path(tree).unlink()
    (tree / "vllm/registry.py").write_text("A = 1\nB = 2\nSPARSE = 11\nC = 3\n")
    proc.git(tree, "commit", "-qa", "--amend", "--no-edit")  # HEAD is patch 3: now it differs
    st = treestate.compare(tree, load(root))
    assert not st.has_record and st.kind == treestate.DIVERGED
    with pytest.raises(TreeStateError, match="both changed"):
        apply_mod.apply_series(load(root), tree, **quiet)


# --- non-ASCII Subjects (RFC 2047) -------------------------------------------

def test_non_ascii_subject_round_trips(tmp_path):
    subject = "Add the kernel module — fast path"
    root, tree, pin = gitfixtures.series_project(tmp_path, kernel_subject=subject)
    patch = load(root).patches[0]
    assert patch.subject == subject  # decoded, not "=?UTF-8?q?...?="
    assert "=?UTF-8?q?" in patch.path.read_text()
    before = {p.name: p.read_bytes() for p in (patches_dir(root)).iterdir()}
    apply_mod.apply_series(load(root), tree, **quiet)
    assert proc.git_out(tree, "log", "-1", "--format=%s", "HEAD~2") == subject
    said = []
    again = apply_mod.apply_series(load(root), tree, echo=said.append)  # old code: "commits not in the series"
    assert [o.state for o in again.outcomes] == ["already-applied"] * 3 and "nothing to do" in said[0]
    result = export_mod.export(tree, patches_dir(root))  # old code: "would drop 0001-..."
    assert result.written == [] and result.removed == []
    assert {p.name: p.read_bytes() for p in (patches_dir(root)).iterdir()} == before
    assert status_mod.status(pin, tree, load(root))["state"] == "in-sync"
