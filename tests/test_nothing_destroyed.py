"""Issue 31, items 1-4, 6, 8, 9: no command deletes or overwrites anything it did not create or cannot
restore, unless the user named that thing and forced it (docs/errors.md, "What commands never destroy";
the rule lives in tools/smla/keep.py). Each case on real temporary git repositories, through the CLI;
where a hint names the way out, the test follows it."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from smla import apply as apply_mod, proc, series
from smla.cli import main
from smla.errors import ExportError, SeriesError, TreeStateError, UsageError

from gitfixtures import commit_change, patches_dir, pin_file, quiet


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, list(args), env=env)


def applied(series_project):
    root, tree, _ = series_project
    apply_mod.apply_series(series.load(patches_dir(root)), tree, **quiet)
    return root, tree


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def hint_commands(output: str) -> list[str]:
    """The backquoted commands of the last `hint:` line."""
    hint = [ln for ln in output.splitlines() if ln.startswith("hint:")][-1]
    return re.findall(r"`([^`]+)`", hint)


# ----------------------------------------------------------------- 1. clean --discard removes only work trees


def _user_checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "my-vllm"
    repo.mkdir()
    proc.git(repo, "init", "-q")
    commit_change(repo, {"vllm/mine.py": "x = 1\n"}, "My own work")
    return repo


@pytest.mark.parametrize("what", ["plain folder", "user's git checkout", "toolkit root", "parent of the root"])
def test_clean_discard_removes_only_an_smla_work_tree(series_project, tmp_path, what):
    root, _ = applied(series_project)
    if what == "plain folder":
        target = tmp_path / "folder"
        target.mkdir()
        (target / "notes.txt").write_text("mine\n")
    elif what == "user's git checkout":
        target = _user_checkout(tmp_path)
    elif what == "toolkit root":
        target = root
    else:
        target = root.parent
    before = sorted(p.relative_to(target) for p in target.rglob("*"))
    res = run("clean", "--discard", "--root", str(root), "--tree", str(target))
    # old code: exit 0, "removed <target>"
    assert res.exit_code == UsageError.exit_code, res.output
    assert "not an smla work tree" in res.output or "toolkit checkout" in res.output
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before
    assert "--discard" not in res.output.split("hint:", 1)[1]  # no forced way to remove it


def test_clean_discard_through_smla_tree_is_refused_too(series_project, tmp_path):
    root, _ = applied(series_project)
    mine = _user_checkout(tmp_path)
    res = run("clean", "--discard", "--root", str(root), env={"SMLA_TREE": str(mine)})  # `make clean` runs this
    assert res.exit_code == UsageError.exit_code, res.output  # old code: 0, the checkout gone
    assert (mine / "vllm/mine.py").is_file()


def test_make_clean_goes_through_the_guard_for_its_own_tree_only():
    """`make clean` cleans each line's work/<release>/vllm through `smla clean` (not whatever $SMLA_TREE names, while work/
    goes unguarded) and removes work/ only when nothing else is left in it."""
    from gitfixtures import REPO_ROOT

    text = (REPO_ROOT / "Makefile").read_text()
    recipe = text.split("\nclean:", 1)[1].split("\n\n", 1)[0]
    assert "clean --tree work/$$l/vllm $(ARGS)" in recipe  # old code: `$(SMLA) clean`, then `rm -rf work`
    assert "rm -rf work" not in recipe and "rmdir $$d" in recipe


def test_clean_discard_still_removes_work_trees(series_project):
    """--discard keeps its meaning for a real work tree: unexported work, a lost base tag."""
    root, tree = applied(series_project)
    commit_change(tree, {"vllm/new.py": "x = 1\n"}, "Unexported fix")
    proc.git(tree, "tag", "-d", "smla-base")
    assert run("clean", "--root", str(root), "--tree", str(tree)).exit_code == TreeStateError.exit_code
    res = run("clean", "--discard", "--root", str(root), "--tree", str(tree))
    assert res.exit_code == 0, res.output
    assert not tree.exists()


# ----------------------------------------------------------------- 2. a patch file the series does not list

COLLEAGUE = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: A Colleague <c@example.com>
Date: Mon, 1 Jan 2024 00:00:00 +0000
Subject: [PATCH] Colleague's fix

Why: a colleague's patch, not in the series yet.
---
 README.md | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/README.md b/README.md
index 000000000000..111111111111 100644
--- a/README.md
+++ b/README.md
@@ -1 +1 @@
-upstream
+colleague
"""


def test_unlisted_patch_is_named_and_never_deleted(series_project):
    root, tree = applied(series_project)
    theirs = patches_dir(root) / "0004-colleague-s-fix.patch"
    theirs.write_text(COLLEAGUE)
    args = ("--root", str(root), "--tree", str(tree))
    st = run("status", *args)
    assert st.exit_code == SeriesError.exit_code
    assert "0004-colleague-s-fix.patch" in st.output
    hint = st.output.split("hint:", 1)[1]
    # old code: "regenerate both with `smla export`", and export deleted it
    assert "regenerate" not in hint and "0004-colleague-s-fix.patch" in hint
    for extra in ((), ("--force",), ("--prune",)):
        res = run("export", *args, *extra)
        assert res.exit_code == ExportError.exit_code, res.output  # old code: 0, the file deleted
        assert theirs.read_text() == COLLEAGUE
        assert "0004-colleague-s-fix.patch" in res.output
    # the hint works: list it in the series and apply it
    with (patches_dir(root) / "series").open("a") as fh:
        fh.write("0004-colleague-s-fix.patch\n")
    assert run("apply", *args).exit_code == 0
    assert run("status", "--check", *args).exit_code == 0


@pytest.mark.parametrize("source", ["0001", "0003"])
def test_an_unlisted_copy_of_a_listed_patch_is_never_deleted(series_project, source):
    """A file the series does not list is never deleted, even when its bytes are those of a patch smla
    wrote (a copy made to start a new patch from): its name and place are the user's."""
    root, tree = applied(series_project)
    original = sorted(patches_dir(root).glob(f"{source}-*.patch"))[0]
    copy = patches_dir(root) / "0009-my-copy.patch"
    copy.write_bytes(original.read_bytes())
    args = ("--root", str(root), "--tree", str(tree))
    for extra in ((), ("--force",), ("--prune",), ("--force", "--prune")):
        res = run("export", *args, *extra)
        # old code: exit 0, "removed 0009-my-copy.patch" (its bytes matched a patch smla wrote)
        assert res.exit_code == ExportError.exit_code, (extra, res.output)
        assert copy.read_bytes() == original.read_bytes()
        assert copy.name in res.output
    copy.unlink()  # the hint's way: move it out of patches/
    assert run("export", *args).exit_code == 0


# ----------------------------------------------------------------- 3. hand edits that do not parse


def _latin1_message(data: bytes) -> bytes:
    return data.replace(b"Why:", b"Pourquoi \xe9t\xe9:", 1)


def _hunk_count_broken(data: bytes) -> bytes:
    head, diff = data.split(b"\ndiff --git ", 1)
    lines = diff.split(b"\n")
    at = next(i for i, ln in enumerate(lines) if ln.startswith(b"@@"))
    lines.insert(at + 1, b"+an added line, hunk count not fixed")
    return head + b"\ndiff --git " + b"\n".join(lines)


@pytest.mark.parametrize("edit", [_latin1_message, _hunk_count_broken], ids=["latin1-byte", "hunk-count"])
def test_unparseable_hand_edit_is_protected_like_a_valid_one(series_project, edit):
    root, tree = applied(series_project)
    first = sorted(patches_dir(root).glob("0002-*.patch"))[0]  # a hunk with context
    edited = edit(first.read_bytes())
    first.write_bytes(edited)
    with pytest.raises(SeriesError):
        series.load(patches_dir(root))
    st = run("status", "--root", str(root), "--tree", str(tree))
    assert st.exit_code == SeriesError.exit_code and "`smla export --force`" in st.output  # not plain export
    res = run("export", "--root", str(root), "--tree", str(tree))
    assert res.exit_code == ExportError.exit_code, res.output  # old code: 0, the edit overwritten
    assert first.read_bytes() == edited
    assert first.name in res.output
    forced = run("export", "--force", "--root", str(root), "--tree", str(tree))  # named in the refusal, forced
    assert forced.exit_code == 0, forced.output
    assert first.read_bytes() != edited


def test_restore_hint_for_a_hand_edit_works(series_project):
    root, tree = applied(series_project)
    proc.git(root, "init", "-q")
    proc.git(root, "add", "-A")
    proc.git(root, "commit", "-q", "-m", "the series")
    first = sorted(patches_dir(root).glob("0002-*.patch"))[0]
    committed = first.read_bytes()
    first.write_bytes(_latin1_message(committed))
    res = run("export", "--root", str(root), "--tree", str(tree))
    assert res.exit_code == ExportError.exit_code, res.output
    restore = next(shlex.split(c) for c in hint_commands(res.output) if c.startswith("git "))
    subprocess.run(restore, check=True, capture_output=True)
    assert first.read_bytes() == committed
    assert run("status", "--check", "--root", str(root), "--tree", str(tree)).exit_code == 0


# ----------------------------------------------------------------- 4. a pull that moves the pin


def _move_pin(root: Path, upstream: Path) -> None:
    """What a pull brings: upstream moved on, the pin names the new commit and release."""
    (upstream / "NEWS").write_text("next release\n")
    proc.git(upstream, "add", "-A")
    proc.git(upstream, "commit", "-q", "-m", "next release")
    new = proc.git_out(upstream, "rev-parse", "HEAD")
    pin = pin_file(root)
    text = re.sub(r"^commit = .*$", f"commit = {new}", pin.read_text(), flags=re.M)
    pin.write_text(text.replace("9.9.9", "9.9.10"))


@pytest.mark.parametrize("command", ["apply", "export"])
def test_apply_and_export_refuse_a_tree_not_at_the_pin(series_project, command):
    root, tree = applied(series_project)
    upstream = Path(series_project[2].repo)
    _move_pin(root, upstream)
    before = snapshot(patches_dir(root))
    head = proc.git_out(tree, "rev-parse", "HEAD")
    args = ("--root", str(root), "--tree", str(tree))
    res = run(command, *args)
    assert res.exit_code == TreeStateError.exit_code, res.output  # old code: 0
    assert "9.9.10" in res.output and "9.9.9" in res.output
    st = json.loads(run("status", "--json", *args).stdout)  # status gives the same way out
    assert st["hint"].endswith(res.output.split("hint: ", 1)[1].strip())
    assert snapshot(patches_dir(root)) == before and proc.git_out(tree, "rev-parse", "HEAD") == head
    # the hint works when followed
    for c in hint_commands(res.output):
        words = shlex.split(c)
        assert words[0] == "smla", c
        out = run(*words[1:], *args)
        assert out.exit_code == 0, out.output
    assert run("status", "--check", *args).exit_code == 0


def test_moved_pin_hint_saves_unexported_work(series_project):
    """A tree not at the pin that holds work not in patches/: the hint saves its commits, rebuilds
    the tree at the pin and carries them over; followed step by step, nothing is lost."""
    root, tree = applied(series_project)
    commit_change(tree, {"vllm/mine.py": "mine = 1\n"}, "My unexported work")
    _move_pin(root, Path(series_project[2].repo))
    args = ("--root", str(root), "--tree", str(tree))
    res = run("export", *args)
    assert res.exit_code == TreeStateError.exit_code, res.output
    for c in hint_commands(res.output):
        words = shlex.split(c)
        if words[0] == "smla":
            out = run(*words[1:], *args)
            assert out.exit_code == 0, (c, out.output)
        else:  # git; the last one carries a glob, as a shell would run it
            subprocess.run(["bash", "-c", c], check=True, capture_output=True)
    assert (tree / "vllm/mine.py").read_text() == "mine = 1\n"
    assert any("My-unexported-work" in p.name for p in patches_dir(root).glob("*.patch"))
    assert run("status", "--check", *args).exit_code == 0


# ----------------------------------------------------------------- 6. commits export cannot write


def _empty_commit(tree: Path) -> None:
    proc.git(tree, "commit", "-q", "--allow-empty", "-m", "Nothing here\n\nWhy: a test.")


def _latin1_file(tree: Path) -> None:
    (tree / "vllm/latin.py").write_bytes(b"# caf\xe9\nx = 1\n")
    proc.git(tree, "add", "-A")
    proc.git(tree, "commit", "-q", "-m", "Add a Latin-1 file\n\nWhy: a test.")


@pytest.mark.parametrize("make", [_empty_commit, _latin1_file], ids=["empty", "non-utf8"])
def test_export_writes_nothing_when_a_commit_cannot_be_a_patch(series_project, make):
    root, tree = applied(series_project)
    commit_change(tree, {"vllm/ok.py": "y = 2\n"}, "A fine change")
    make(tree)
    before = snapshot(patches_dir(root))
    args = ("--root", str(root), "--tree", str(tree))
    res = run("export", *args)
    assert res.exit_code == ExportError.exit_code, res.output  # old code: 6, after writing the patches
    assert snapshot(patches_dir(root)) == before
    assert run("status", *args).exit_code == 0  # old code: every command refused the series
    bad = proc.git_out(tree, "rev-parse", "HEAD")
    assert bad[:12] in res.output
    # the way out the hint gives: the first command fixes the commit; then export works
    if make is _empty_commit:
        fix = shlex.split(hint_commands(res.output)[0])
        assert fix[:3] == ["git", "-C", str(tree)], fix
        subprocess.run(fix, check=True, capture_output=True)
    else:
        (tree / "vllm/latin.py").write_bytes(b"# caf\xc3\xa9\nx = 1\n")
        proc.git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    ok = run("export", *args)
    assert ok.exit_code == 0, ok.output
    assert run("status", "--check", *args).exit_code == 0


# ----------------------------------------------------------------- 8. rebase --abort keeps what it did not make


def rebase(world, *args: str):
    return run("--root", str(world["root"]), "--tree", str(world["tree"]), "rebase", *args)


def test_rebase_abort_keeps_files_made_during_the_stop(rebase_world):
    w = rebase_world
    root, tree = w["root"], w["tree"]
    pin_before = pin_file(root).read_bytes()
    patches_before = snapshot(patches_dir(root))
    assert rebase(w, "--onto", w["c2"]).exit_code == 11
    new_patch = patches_dir(root) / "0006-my-new-work.patch"
    new_patch.write_text("my new patch, written during the stop\n")
    notes = tree / "notes.txt"
    notes.write_text("my notes\n")
    edited = sorted(patches_dir(root).glob("0001-*.patch"))[0]
    edited_bytes = edited.read_bytes() + b"\n"
    edited.write_bytes(edited_bytes)
    res = rebase(w, "--abort")
    assert res.exit_code == 0, res.output
    # old code: both deleted, the edit overwritten, none named
    assert new_patch.read_text() == "my new patch, written during the stop\n"
    assert notes.read_text() == "my notes\n"
    for name in (new_patch.name, "notes.txt", edited.name):
        assert name in res.output
    kept = [p for p in patches_dir(root).iterdir() if p.read_bytes() == edited_bytes]
    assert kept and kept[0].name != edited.name and not kept[0].name.endswith(".patch")
    assert str(kept[0].name) in res.output
    # what the rebase backed up is back byte for byte
    assert pin_file(root).read_bytes() == pin_before
    now = snapshot(patches_dir(root))
    assert {n: now[n] for n in patches_before} == patches_before


# ----------------------------------------------------------------- 9. the undo of a finished rebase


def test_printed_undo_of_a_finished_rebase_works(rebase_world, monkeypatch):
    w = rebase_world
    root, tree = w["root"], w["tree"]
    proc.git(root, "init", "-q")
    proc.git(root, "add", "-A", "--", "lines")
    proc.git(root, "commit", "-q", "-m", "the series")
    before = {"vllm-pin.txt": pin_file(root).read_bytes(), **snapshot(patches_dir(root))}
    res = rebase(w, "--onto", w["c1"], "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    renamed = [p for p in data["patches"] if p["new_names"] and p["new_names"] != [p["name"]]]
    assert renamed, "the rebase must renumber a patch for this test"
    undo = data["undo"]  # old code: no undo; the note's `git checkout` + `smla fetch --force` fails
    assert undo == [c for c in undo if c]
    monkeypatch.chdir(root)
    for c in undo:
        words = shlex.split(c)
        if words[0] == "smla":
            out = run(*words[1:])
            assert out.exit_code == 0, (c, out.output)
        else:
            subprocess.run(words, check=True, capture_output=True, env={**os.environ})
    assert {"vllm-pin.txt": pin_file(root).read_bytes(), **snapshot(patches_dir(root))} == before
    assert run("status", "--check").exit_code == 0


def test_printed_undo_works_without_git_too(rebase_world, monkeypatch):
    """The toolkit checkout is no git repository (or patches/ were not committed): the undo the text
    report prints copies the rebase's backup back."""
    w = rebase_world
    root = w["root"]
    before = {"vllm-pin.txt": pin_file(root).read_bytes(), **snapshot(patches_dir(root))}
    res = rebase(w, "--onto", w["c1"])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("undo: "))
    undo = re.findall(r"`([^`]+)`", line)
    assert shlex.split(undo[0])[0] == "cp"
    monkeypatch.chdir(root)
    for c in undo:
        words = shlex.split(c)
        if words[0] == "smla":
            out = run(*words[1:])
            assert out.exit_code == 0, (c, out.output)
        else:
            subprocess.run(words, check=True, capture_output=True)
    assert {"vllm-pin.txt": pin_file(root).read_bytes(), **snapshot(patches_dir(root))} == before
    assert run("status", "--check").exit_code == 0


def test_finishing_rebase_keeps_what_was_made_in_patches_during_the_stop(rebase_world):
    """--continue that finishes: a file made or edited in patches/ during the stop is moved aside and
    named before the export, never deleted or overwritten."""
    from gitfixtures import LINES, edit_lines, write_lines

    w = rebase_world
    root, tree = w["root"], w["tree"]
    assert rebase(w, "--onto", w["c2"]).exit_code == 11
    mine = patches_dir(root) / "0004-my-own.patch"  # the export will write a 0004 of its own
    mine.write_text("my patch\n")
    edited = sorted(patches_dir(root).glob("0001-*.patch"))[0]
    edited_bytes = edited.read_bytes() + b"\n"
    edited.write_bytes(edited_bytes)
    write_lines(tree, "e.py", edit_lines(LINES, l30="E patched on top of upstream"))
    proc.git(tree, "add", "--", "e.py")
    res = rebase(w, "--continue", "--json")
    assert res.exit_code == 0, res.output  # old code: 0, both gone
    data = json.loads(res.stdout)
    assert (patches_dir(root) / "0004-my-own.patch.smla-kept").read_text() == "my patch\n"
    assert (patches_dir(root) / f"{edited.name}.smla-kept").read_bytes() == edited_bytes
    assert any("0004-my-own.patch" in k for k in data["kept"]) and any(edited.name in k for k in data["kept"])
    assert run("--root", str(root), "--tree", str(tree), "status", "--check").exit_code == 0


def test_abort_moves_aside_an_untracked_file_the_original_branch_tracks(tmp_path):
    """Checking out the original branch (`checkout -f`) would overwrite an untracked file where that
    branch has one: abort moves it aside first and names it; other untracked files stay."""
    from smla.rebase import abort as abort_mod

    repo = tmp_path / "t"
    repo.mkdir()
    proc.git(repo, "init", "-q")
    commit_change(repo, {"x.py": "tracked\n", "d/y.py": "tracked\n"}, "base")
    head = proc.git_out(repo, "rev-parse", "HEAD")
    proc.git(repo, "rm", "-q", "-r", "--cached", "--", "x.py", "d")
    proc.git(repo, "commit", "-q", "-m", "where the replay stands")
    (repo / "x.py").write_text("mine\n")
    (repo / "notes.txt").write_text("notes\n")
    kept = abort_mod.keep_untracked(repo, head)
    assert (repo / "x.py.smla-kept").read_text() == "mine\n" and not (repo / "x.py").exists()
    assert (repo / "notes.txt").read_text() == "notes\n"
    assert (repo / "d/y.py.smla-kept").is_file()
    assert len(kept) == 3 and any("x.py.smla-kept" in k for k in kept)
