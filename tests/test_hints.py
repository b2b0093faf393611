"""Hints that work when followed: each test takes the command a hint names and runs it (or checks
that it names the right thing), where the old hint led nowhere or somewhere else."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from click.testing import CliRunner

from smla import apply as apply_mod
from smla import proc, series
from smla.cli import main

from gitfixtures import make_project, make_sdist, patches_dir, pin_file, quiet

IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t"}


def cli(root: Path, tree: Path, *args: str):
    return CliRunner().invoke(main, ["--root", str(root), "--tree", str(tree), *args])


def hint_commands(output: str) -> list[list[str]]:
    return [shlex.split(c) for c in re.findall(r"`([^`]+)`", output.split("hint:", 1)[-1])]


def test_apply_failure_hint_shows_the_file_the_patch_was_tried_on(series_project):
    root, tree, _ = series_project
    apply_mod.apply_series(series.load(patches_dir(root)), tree, **quiet)
    p2 = sorted(patches_dir(root).glob("0002-*.patch"))[0]
    p2.write_text(p2.read_text().replace("\n B = 2\n", "\n B = 5\n"))  # no longer matches the base
    res = cli(root, tree, "apply")
    assert res.exit_code == 8, res.output
    show = next(c for c in hint_commands(res.output) if "show" in c)
    # old code: `git apply --check -v` on the tree's HEAD, which holds the old 0002: another failure
    assert "apply" not in show
    out = subprocess.run(show, capture_output=True, text=True, check=True).stdout
    assert out == "A = 1\nB = 2\nC = 3\n"  # the base's file: where " B = 5" was looked for
    assert "line 1 of the series' state before it" in res.output


def test_apply_failure_at_the_trees_head_keeps_the_check_command(series_project):
    root, tree, _ = series_project
    listed = (patches_dir(root) / "series").read_text()
    (patches_dir(root) / "series").write_text("".join(listed.splitlines(True)[:2]))
    (patches_dir(root) / "hold").mkdir()
    p3 = sorted(patches_dir(root).glob("0003-*.patch"))[0]
    p3.rename(patches_dir(root) / "hold" / p3.name)
    apply_mod.apply_series(series.load(patches_dir(root)), tree, **quiet)  # the tree carries 0001-0002
    (patches_dir(root) / "hold" / p3.name).rename(p3)
    (patches_dir(root) / "series").write_text(listed)
    p3.write_text(p3.read_text().replace("\n line 19\n", "\n line 99\n"))
    res = cli(root, tree, "apply")  # 0003 is tried on the tree's HEAD
    assert res.exit_code == 8, res.output
    assert any(c[3:6] == ["apply", "--check", "-v"] for c in hint_commands(res.output))


def test_commit_hint_commits_a_new_file(series_project):
    root, tree, _ = series_project
    apply_mod.apply_series(series.load(patches_dir(root)), tree, **quiet)
    (tree / "vllm" / "new_module.py").write_text("X = 1\n")  # a new, untracked file
    st = cli(root, tree, "status")
    cmds = [c for c in hint_commands(st.output) if c[:1] == ["git"]]
    assert cmds, st.output
    for c in cmds:  # old code: `git commit -a`, which leaves the new file out ("nothing added")
        res = subprocess.run(c + (["-m", "Add a module"] if c[-1] == "commit" else []), capture_output=True,
                             text=True, env={**os.environ, **IDENTITY})
        assert res.returncode == 0, (c, res.stdout, res.stderr)
    exp = cli(root, tree, "export")
    assert exp.exit_code == 0, exp.output
    assert any("new_module.py" in p.read_text() for p in patches_dir(root).glob("*.patch"))


def test_dirty_tree_refusal_names_a_stash_that_takes_new_files(series_project):
    root, tree, _ = series_project
    (tree / "vllm" / "new_module.py").write_text("X = 1\n")
    res = cli(root, tree, "apply")
    assert res.exit_code == 7
    stash = next(c for c in hint_commands(res.output) if "stash" in c)
    subprocess.run(stash, check=True, capture_output=True, env={**os.environ, **IDENTITY})
    # old code: `git stash`, which leaves the new file, and apply still refuses
    assert cli(root, tree, "apply").exit_code == 0


def test_rebase_onto_a_commit_without_network_hints_a_mirror_not_fetch(rebase_world):
    world = rebase_world
    pin = world["pin"]
    pin.write_text(re.sub(r"^repo = .*$", "repo = http://127.0.0.1:9/vllm.git", pin.read_text(), flags=re.M))
    res = cli(world["root"], world["tree"], "rebase", "--onto", world["c1"])
    assert res.exit_code == 4, res.output
    hint = res.output.split("hint:", 1)[1]
    # old code: `smla fetch --source PATH`, which fetches the pin, not the target
    assert "smla fetch" not in hint
    assert f"smla rebase --onto {world['c1']} --source PATH" in hint


def test_a_file_where_the_work_directory_belongs(series_project):
    root, _, _ = series_project
    (root / "work").write_text("not a directory\n")
    res = cli(root, root / "work" / "vllm", "patch")
    assert res.exit_code == 15, res.output
    # old code: "File exists: .../work", hint "check the permissions and free space"
    assert f"{root / 'work'} is a file, where a directory belongs" in res.output
    mv = next(c for c in hint_commands(res.output) if c[:1] == ["mv"])
    assert mv[1] == str(root / "work")


def test_a_file_where_the_cache_directory_belongs(tmp_path, index, monkeypatch):
    sdist, sha = make_sdist(tmp_path)
    index.publish("vllm", [(sdist.name, sdist.read_bytes())])
    root = make_project(tmp_path, "http://127.0.0.1:9/nowhere.git", "2" * 40, sdist_sha=sha)
    blocker = tmp_path / "cache-file"
    blocker.write_text("")
    monkeypatch.setenv("SMLA_CACHE_DIR", str(blocker))
    res = cli(root, tmp_path / "work" / "vllm", "fetch", "--source", "sdist")
    assert res.exit_code == 15, res.output
    # old code: "make <cache> writable", which it already is
    assert "is a file, where a directory belongs" in res.output and "writable" not in res.output
    assert any(c[:2] == ["mv", str(blocker)] for c in hint_commands(res.output))


def _committed(root: Path) -> None:
    """The toolkit checkout as a user has it: a git repository with the line committed."""
    proc.git(root, "init", "-q")
    proc.git(root, "add", "-A")
    proc.git(root, "commit", "-q", "-m", "the line")


def _run_git_hints(output: str, root: Path) -> None:
    for c in hint_commands(output):
        if c[:1] == ["git"]:
            subprocess.run(c, cwd=root, check=True, capture_output=True)


def test_an_unloadable_patch_hint_restores_that_file_and_no_other(series_project):
    root, tree, _ = series_project
    apply_mod.apply_series(series.load(patches_dir(root)), tree, **quiet)
    _committed(root)
    p1, p2 = sorted(patches_dir(root).glob("000[12]-*.patch"))
    mine = p1.read_bytes().replace(b"Subject: [PATCH] ", b"Subject: [PATCH] My better subject: ", 1)
    p1.write_bytes(mine)  # a hand edit that loads
    p2.write_bytes(p2.read_bytes().replace(b"Subject:", b"X-Note: caf\xe9\nSubject:", 1))  # one that does not
    res = cli(root, tree, "status")
    assert res.exit_code == 6, res.output
    # old code: `git checkout -- lines/<release>/patches/`: no such path; with the release filled in,
    # it restores every patch, the good edit of the other file too
    assert "<release>" not in res.output
    _run_git_hints(res.output, root)
    assert series.load(patches_dir(root))  # loads again
    assert p1.read_bytes() == mine


def test_a_missing_patch_hint_restores_that_file_and_no_other(series_project):
    root, tree, _ = series_project
    _committed(root)
    p1, p2 = sorted(patches_dir(root).glob("000[12]-*.patch"))
    mine = p1.read_bytes().replace(b"Subject: [PATCH] ", b"Subject: [PATCH] My better subject: ", 1)
    p1.write_bytes(mine)
    p2.unlink()
    res = cli(root, tree, "status")
    assert res.exit_code == 6 and p2.name in res.output, res.output
    _run_git_hints(res.output, root)  # old code: `git checkout -- <patches dir>`, the edit of p1 gone
    assert p2.is_file() and p1.read_bytes() == mine


def test_a_broken_pin_line_hint_restores_the_pin(series_project):
    root, tree, _ = series_project
    _committed(root)
    pin = pin_file(root)
    good = pin.read_bytes()
    pin.write_bytes(good + b"colour = blue\n")
    res = cli(root, tree, "status")
    assert res.exit_code == 3, res.output
    assert "<release>" not in res.output  # old code: `git checkout -- lines/<release>/vllm-pin.txt`
    _run_git_hints(res.output, root)
    assert pin.read_bytes() == good


def test_hints_keep_the_line_the_command_was_given(series_project):
    """`make export VLLM=<an older line>` runs `smla --line <it> export`: a hint's `smla ...` must stay on
    that line (a bare `smla` works on $SMLA_LINE, else the newest line)."""
    root, tree, _ = series_project
    apply_mod.apply_series(series.load(patches_dir(root)), tree, **quiet)
    (tree / "vllm" / "new_module.py").write_text("X = 1\n")
    line = patches_dir(root).parent.name
    res = CliRunner().invoke(main, ["--root", str(root), "--tree", str(tree), "--line", line, "export"])
    assert res.exit_code == 7, res.output
    smla_cmds = [c for c in hint_commands(res.output) if c[:1] == ["smla"]] or [
        c for c in hint_commands(CliRunner().invoke(main, ["--root", str(root), "--tree", str(tree), "--line", line,
                                                           "status", "--check"]).output) if c[:1] == ["smla"]]
    assert smla_cmds
    for c in smla_cmds:  # old code: `smla export`, `smla apply`: the newest line's
        assert c[1:3] == ["--line", line], c
    plain = CliRunner().invoke(main, ["--root", str(root), "--tree", str(tree), "status", "--check"])
    assert "--line" not in plain.output  # no --line given: none added


def test_a_file_where_the_work_tree_belongs(series_project):
    root, _, _ = series_project
    tree = root / "work" / patches_dir(root).parent.name / "vllm"  # the line's default tree
    tree.parent.mkdir(parents=True)
    tree.write_text("not a directory\n")
    res = CliRunner().invoke(main, ["--root", str(root), "patch"])
    assert res.exit_code == 7, res.output
    mv = next(c for c in hint_commands(res.output) if c[:1] == ["mv"])  # old code: only "pass another --tree"
    subprocess.run(mv, check=True)
    assert CliRunner().invoke(main, ["--root", str(root), "patch"]).exit_code == 0
    assert tree.with_name("vllm.old").read_text() == "not a directory\n"
