"""apply / export / status / series validation on real temporary git repos."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from smla import treeinfo
from smla import apply as apply_mod, export as export_mod, proc, series, source, status as status_mod
from smla.cli import main
from smla.errors import ApplyError, ExportError, SeriesError, TreeStateError

from gitfixtures import commit_change, make_project, pin_for, quiet, patches_dir, pin_file


def load(root: Path) -> series.Series:
    return series.load(patches_dir(root))


def subjects(tree: Path) -> list[str]:
    return [s for _, s in treeinfo.commits_above_base(tree)]


def test_apply_commits_one_per_patch_and_rerun_is_noop(series_project):
    root, tree, _ = series_project
    result = apply_mod.apply_series(load(root), tree, **quiet)
    assert [o.state for o in result.outcomes] == ["applied"] * 3
    assert subjects(tree) == ["Add the kernel module", "Register the backend", "Prefer the backend on CUDA"]
    body = proc.git_out(tree, "log", "-1", "--format=%b", "HEAD~2")
    assert body == "Why: the backend needs a kernel."
    head = proc.git_out(tree, "rev-parse", "HEAD")
    said = []
    again = apply_mod.apply_series(load(root), tree, echo=said.append)
    assert [o.state for o in again.outcomes] == ["already-applied"] * 3
    assert "nothing to do" in said[0]
    assert proc.git_out(tree, "rev-parse", "HEAD") == head


def test_applied_commit_ids_are_reproducible(series_project, tmp_path):
    root, tree, pin = series_project
    apply_mod.apply_series(load(root), tree, **quiet)
    other = tmp_path / "other"
    source.fetch(pin, other, "git", **quiet)
    apply_mod.apply_series(load(root), other, **quiet)
    assert proc.git_out(tree, "rev-parse", "HEAD") == proc.git_out(other, "rev-parse", "HEAD")


def test_partly_applied_tree_gets_the_rest(series_project):
    root, tree, _ = series_project
    apply_mod.apply_series(load(root), tree, **quiet)
    proc.git(tree, "reset", "-q", "--hard", "HEAD~2")
    result = apply_mod.apply_series(load(root), tree, **quiet)
    assert [o.state for o in result.outcomes] == ["already-applied", "applied", "applied"]
    assert len(subjects(tree)) == 3


def test_conflict_names_patch_file_hunk_and_leaves_tree_untouched(series_project):
    root, tree, _ = series_project
    # upstream moved under the third patch: change the lines its hunk needs, as a base-level edit
    cuda = tree / "vllm/platforms/cuda.py"
    cuda.write_text(cuda.read_text().replace("line 19\n", "line nineteen\n"))
    proc.git(tree, "commit", "-qam", "local drift")
    proc.git(tree, "tag", "-f", "smla-base")
    head = proc.git_out(tree, "rev-parse", "HEAD")
    with pytest.raises(ApplyError) as err:
        apply_mod.apply_series(load(root), tree, **quiet)
    msg = err.value.message
    assert "0003-Prefer-the-backend-on-CUDA.patch" in msg
    assert "vllm/platforms/cuda.py" in msg and "hunk #1" in msg and "line 17" in msg
    assert str(tree) in err.value.hint
    # all or nothing: the first two patches (which would apply) were not committed either
    assert proc.git_out(tree, "rev-parse", "HEAD") == head
    assert treeinfo.dirty_files(tree) == []
    assert proc.git_out(tree, "worktree", "list").count("\n") == 0


def test_dirty_tree_is_refused_unless_forced(series_project):
    root, tree, _ = series_project
    (tree / "README.md").write_text("my edit\n")
    with pytest.raises(TreeStateError, match="uncommitted changes"):
        apply_mod.apply_series(load(root), tree, **quiet)
    assert subjects(tree) == []
    apply_mod.apply_series(load(root), tree, force=True, **quiet)
    assert len(subjects(tree)) == 3 and (tree / "README.md").read_text() == "my edit\n"


def test_patch_already_upstream_is_reported_not_reapplied(series_project, tmp_path):
    root, tree, _ = series_project
    # the registry change landed upstream: make the base contain it
    (tree / "vllm/registry.py").write_text("A = 1\nB = 2\nSPARSE = 9\nC = 3\n")
    proc.git(tree, "commit", "-qam", "upstream merged it")
    proc.git(tree, "tag", "-f", "smla-base")
    result = apply_mod.apply_series(load(root), tree, **quiet)
    assert [o.state for o in result.outcomes] == ["applied", "upstream", "applied"]
    assert (tree / "vllm/registry.py").read_text().count("SPARSE") == 1
    head = proc.git_out(tree, "rev-parse", "HEAD")
    said = []
    again = apply_mod.apply_series(load(root), tree, echo=said.append)  # rerun: still a no-op
    assert [o.state for o in again.outcomes] == ["already-applied", "upstream", "already-applied"]
    assert "1 already upstream" in said[0] and proc.git_out(tree, "rev-parse", "HEAD") == head
    # exporting now would lose the upstream patch: only with --prune
    with pytest.raises(ExportError, match="would drop 0002-Register-the-backend.patch"):
        export_mod.export(tree, patches_dir(root))


def test_export_is_byte_stable_and_reproduces_the_series(series_project):
    root, tree, _ = series_project
    patches = patches_dir(root)
    before = {p.name: p.read_bytes() for p in patches.iterdir()}
    mtimes = {p.name: p.stat().st_mtime_ns for p in patches.iterdir()}
    apply_mod.apply_series(load(root), tree, **quiet)
    result = export_mod.export(tree, patches)
    assert result.written == [] and len(result.unchanged) == 3
    assert {p.name: p.read_bytes() for p in patches.iterdir()} == before
    assert {p.name: p.stat().st_mtime_ns for p in patches.iterdir()} == mtimes
    text = (patches / "0001-Add-the-kernel-module.patch").read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: [PATCH] Add the kernel module" in text and "\n-- \n" not in text


def test_vllm_style_subject_prefix_survives_apply_and_export(tmp_path):
    """A "[Kernel] ..." Subject (vLLM's PR-title style, the 0.33.0 line's patches) is kept by apply,
    so export writes the series back byte for byte under the same names."""
    import gitfixtures

    root, tree, _ = gitfixtures.series_project(tmp_path, kernel_subject="[Kernel] Add the kernel module")
    patches = patches_dir(root)
    before = {p.name: p.read_bytes() for p in patches.iterdir()}
    assert "0001-Kernel-Add-the-kernel-module.patch" in before
    apply_mod.apply_series(load(root), tree, **quiet)
    assert proc.git_out(tree, "log", "-1", "--format=%s", "HEAD~2") == "[Kernel] Add the kernel module"
    result = export_mod.export(tree, patches)
    assert result.written == [] and {p.name: p.read_bytes() for p in patches.iterdir()} == before


def test_export_after_edit_rewrites_only_changed_files_and_drops_stale(series_project):
    root, tree, _ = series_project
    apply_mod.apply_series(load(root), tree, **quiet)
    proc.git(tree, "reset", "-q", "--hard", "HEAD~1")  # drop patch 3
    commit_change(tree, {"vllm/registry.py": "A = 1\nB = 2\nSPARSE = 10\nC = 3\n"}, "Tune the registry")
    with pytest.raises(ExportError, match="would drop 0003-Prefer-the-backend-on-CUDA.patch"):
        export_mod.export(tree, patches_dir(root))
    assert (patches_dir(root) / "0003-Prefer-the-backend-on-CUDA.patch").is_file()
    result = export_mod.export(tree, patches_dir(root), prune=True)
    assert result.unchanged == ["0001-Add-the-kernel-module.patch", "0002-Register-the-backend.patch"]
    assert result.written == ["0003-Tune-the-registry.patch"]
    assert result.removed == ["0003-Prefer-the-backend-on-CUDA.patch"]
    assert (patches_dir(root) / "series").read_text().splitlines()[-1] == "0003-Tune-the-registry.patch"


def test_empty_export_is_refused(series_project):
    root, tree, _ = series_project
    with pytest.raises(ExportError, match="nothing to export"):
        export_mod.export(tree, patches_dir(root))
    assert len(load(root).patches) == 3


def test_status_reports_patches_and_local_edits(series_project):
    root, tree, pin = series_project
    apply_mod.apply_series(load(root), tree, **quiet)
    s = status_mod.status(pin, tree, load(root))
    assert [p["state"] for p in s["patches"]] == ["already-applied"] * 3
    assert s["matches_pin"] and s["uncommitted"] == [] and s["local_commits"] == []
    assert s["state"] == "in-sync" and s["in_sync"] and s["hint"] is None
    fix = commit_change(tree, {"vllm/new.py": "x = 1\n"}, "A local fix")
    (tree / "README.md").write_text("dirty\n")
    s = status_mod.status(pin, tree, load(root))
    assert s["local_commits"][0]["subject"] == "A local fix"
    assert s["local_commits"][0]["commit"] == fix
    assert "unexported" not in s  # one key per fact: local_commits
    assert s["uncommitted"] == ["README.md"]
    assert s["state"] == "tree-edited" and not s["in_sync"]


# --- series validation -----------------------------------------------------

def _write_patch(root: Path, name: str, diff: str, subject: str = "A patch") -> None:
    (patches_dir(root) / name).write_text(
        f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"From: t <t@t>\nDate: Sat, 1 Jan 2000 00:00:00 +0000\nSubject: [PATCH] {subject}\n\nWhy.\n---\n{diff}"
    )
    (patches_dir(root) / "series").write_text(name + "\n")


def test_path_traversal_patch_is_rejected(tmp_path):
    root = make_project(tmp_path, "x", "0" * 40)
    _write_patch(root, "0001-evil.patch",
                 "diff --git a/../outside.txt b/../outside.txt\nnew file mode 100644\n--- /dev/null\n"
                 "+++ b/../outside.txt\n@@ -0,0 +1 @@\n+pwned\n")
    with pytest.raises(SeriesError, match="leaves the tree"):
        series.load(patches_dir(root))
    _write_patch(root, "0001-abs.patch",
                 "diff --git a/etc/x b/etc/x\n--- /etc/x\n+++ /etc/x\n@@ -1 +1 @@\n-a\n+b\n")
    (patches_dir(root) / "0001-evil.patch").unlink()
    with pytest.raises(SeriesError, match="absolute path"):
        series.load(patches_dir(root))


def test_malformed_hunk_is_rejected(tmp_path):
    root = make_project(tmp_path, "x", "0" * 40)
    _write_patch(root, "0001-bad.patch",
                 "diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n@@ -1,5 +1,5 @@\n-a\n+b\n")
    with pytest.raises(SeriesError, match="malformed diff"):
        series.load(patches_dir(root))


def test_series_and_directory_must_agree(series_project):
    root, _, _ = series_project
    (patches_dir(root) / "0009-stray.patch").write_text("x")
    with pytest.raises(SeriesError, match="not in series: 0009-stray.patch"):
        load(root)
    (patches_dir(root) / "0009-stray.patch").unlink()
    (patches_dir(root) / "0002-Register-the-backend.patch").unlink()
    with pytest.raises(SeriesError, match="missing: 0002-Register-the-backend.patch"):
        load(root)


def test_write_through_symlink_is_refused(series_project, tmp_path):
    root, tree, _ = series_project
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "vllm" / "ops").symlink_to(outside)
    proc.git(tree, "add", "-A")
    proc.git(tree, "commit", "-qm", "symlink")
    proc.git(tree, "tag", "-f", "smla-base")
    with pytest.raises(SeriesError, match="symlink"):
        apply_mod.apply_series(load(root), tree, **quiet)
    assert list(outside.iterdir()) == []


# --- CLI edge ----------------------------------------------------------------

def test_cli_exit_codes_and_hints(series_project):
    root, tree, _ = series_project
    runner = CliRunner()
    ok = runner.invoke(main, ["--root", str(root), "--tree", str(tree), "apply"])
    assert ok.exit_code == 0, ok.output
    assert "patched tree:" in ok.output
    (tree / "README.md").write_text("dirty\n")
    proc.git(tree, "reset", "-q", "--hard", "smla-base")
    (tree / "README.md").write_text("dirty\n")
    dirty = runner.invoke(main, ["--root", str(root), "--tree", str(tree), "apply"])
    assert dirty.exit_code == TreeStateError.exit_code
    assert "error:" in dirty.output and "hint:" in dirty.output
    missing = runner.invoke(main, ["--root", str(root), "--tree", str(root / "nope"), "status"])
    assert missing.exit_code == TreeStateError.exit_code and "smla fetch" in missing.output
    js = runner.invoke(main, ["--root", str(root), "--tree", str(tree), "status", "--json"])
    assert js.exit_code == 0 and '"uncommitted"' in js.output


def test_fetch_force_refuses_to_lose_unexported_work(series_project):
    root, tree, _ = series_project
    apply_mod.apply_series(load(root), tree, **quiet)
    commit_change(tree, {"vllm/new.py": "x = 1\n"}, "Unexported fix")
    runner = CliRunner()
    args = ["--root", str(root), "--tree", str(tree), "fetch", "--force", "--source", "git"]
    refused = runner.invoke(main, args)
    assert refused.exit_code == TreeStateError.exit_code, refused.output
    assert "Unexported fix" in refused.output and "--discard" in refused.output
    assert subjects(tree)[-1] == "Unexported fix"
    export_mod.export(tree, patches_dir(root))  # saved: now replacing is allowed
    ok = runner.invoke(main, args)
    assert ok.exit_code == 0, ok.output
    assert subjects(tree) == []
    (tree / "README.md").write_text("scratch\n")
    assert runner.invoke(main, args).exit_code == TreeStateError.exit_code
    assert runner.invoke(main, [*args, "--discard"]).exit_code == 0
    assert (tree / "README.md").read_text() == "upstream\n"


def test_commands_refuse_a_stopped_rebase(series_project):
    root, tree, _ = series_project
    apply_mod.apply_series(load(root), tree, **quiet)
    state = tree / ".git" / treeinfo.REBASE_STATE_DIR / "state.json"
    state.parent.mkdir()
    state.write_text("{}")
    for call in (lambda: apply_mod.apply_series(load(root), tree, **quiet),
                 lambda: export_mod.export(tree, patches_dir(root)),
                 lambda: source.fetch(pin_for("x", "5" * 40), tree, "git",
                                      force=True, **quiet)):
        with pytest.raises(TreeStateError, match="rebase` is stopped"):
            call()
    s = status_mod.status(pin_for("x", "5" * 40), tree, load(root))
    assert s["rebase_in_progress"] is True
