"""Release lines: the Project's line choice, `smla lines`, and the rule that the files the series adds
are the same on every line (smla.lines; lines/DIVERGENCE allows differences, each with a reason).
Two-line checkouts come from gitfixtures.two_line_project; the real checkout's check is in
tests/test_series_lines.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gitfixtures import KERNEL, commit_change, line_tree, patches_dir, two_line_project
from smla import export as export_mod
from smla import lines as lines_mod
from smla.cli import main
from smla.errors import LinesDiverge, SeriesError, UsageError
from smla.project import Project


@pytest.fixture
def two_lines(tmp_path):
    """gitfixtures.two_line_project: lines 0.9.0 and 0.10.0, the kernel identical, the registry not."""
    return two_line_project(tmp_path)


def lines_cli(root: Path, *args: str):
    return CliRunner().invoke(main, ["--root", str(root), "lines", *args])


def test_the_default_line_is_the_newest_by_version(two_lines, monkeypatch):
    assert Project.discover(two_lines).line == "0.10.0"  # 0.10.0 > 0.9.0, though "0.10" < "0.9" as text
    assert Project.discover(two_lines, "0.9.0").pin_file == two_lines / "lines/0.9.0/vllm-pin.txt"
    monkeypatch.setenv("SMLA_LINE", "0.9.0")
    p = Project.discover(two_lines)
    assert p.line == "0.9.0" and p.default_tree == two_lines / "work/0.9.0/vllm"
    monkeypatch.setenv("SMLA_TREE", "/elsewhere")
    assert p.default_tree == Path("/elsewhere") and p.line_tree == two_lines / "work/0.9.0/vllm"
    with pytest.raises(UsageError, match="no release line 0.7.0"):
        Project.discover(two_lines, "0.7.0")


def test_every_command_takes_the_line(two_lines):
    """`--line` before or after the command picks the line's pin, series and tree."""
    for args in (["--line", "0.9.0", "status", "--json"], ["status", "--line", "0.9.0", "--json"]):
        res = CliRunner().invoke(main, ["--root", str(two_lines), *args])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["tree"] == str(two_lines / "work/0.9.0/vllm")
    res = CliRunner().invoke(main, ["--root", str(two_lines), "--line", "0.8.0", "status"])
    assert res.exit_code == 2 and "no release line 0.8.0" in res.output


def test_lines_lists_pins_trees_and_sync(two_lines):
    res = lines_cli(two_lines, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    rows = {r["line"]: r for r in data["lines"]}
    assert list(rows) == ["0.9.0", "0.10.0"] and rows["0.10.0"]["default"]
    assert all(r["in_sync"] and r["patches"] == 2 for r in rows.values())
    shutil.rmtree(two_lines / "work/0.9.0/vllm")
    out = lines_cli(two_lines).output
    assert "0.9.0" in out and "absent" in out and "in sync" in out


def test_identical_added_files_pass_and_integration_may_differ(two_lines):
    cmp = lines_mod.check(Project.discover(two_lines))  # registry.py differs, but no line adds it
    assert cmp.same == [KERNEL, "vllm/ops/util.py"] and not cmp.differ


def test_a_kernel_that_differs_fails_until_allowed_with_a_reason(two_lines):
    tree = line_tree(two_lines, "0.10.0")
    commit_change(tree, {KERNEL: "def k():\n    return 2\n"}, "Kernel: return 2")
    export_mod.export(tree, patches_dir(two_lines, "0.10.0"))
    project = Project.discover(two_lines)
    with pytest.raises(LinesDiverge, match=r"vllm/ops/kernel.py differs between lines 0.9.0 and 0.10.0"):
        lines_mod.check(project)
    res = lines_cli(two_lines, "--diff", "--check")
    assert res.exit_code == 6
    assert "-    return 1" in res.output and "+    return 2" in res.output  # the content after the whole series
    allow = two_lines / "lines" / "DIVERGENCE"
    allow.write_text(f"# reviewed\n{KERNEL}\n")
    with pytest.raises(SeriesError, match="<path>: <reason>"):
        lines_mod.check(project)
    allow.write_text(f"# reviewed\n{KERNEL}: 0.10.0's hook returns the new value\n")
    cmp = lines_mod.check(project)
    assert cmp.differ[0]["allowed"] == "0.10.0's hook returns the new value"
    assert lines_cli(two_lines, "--check").exit_code == 0


def test_a_stale_allow_list_entry_fails(two_lines):
    (two_lines / "lines" / "DIVERGENCE").write_text(f"{KERNEL}: once differed\n")
    with pytest.raises(LinesDiverge, match="no longer differs"):
        lines_mod.check(Project.discover(two_lines))


def test_files_only_one_line_adds_are_listed_not_failed(two_lines):
    tree = line_tree(two_lines, "0.10.0")
    commit_change(tree, {"vllm/ops/new.py": "Y = 1\n"}, "Add a module only 0.10.0 needs")
    export_mod.export(tree, patches_dir(two_lines, "0.10.0"))
    cmp = lines_mod.check(Project.discover(two_lines))
    assert cmp.only == {"0.10.0": ["vllm/ops/new.py"]}


def test_every_make_target_takes_the_line():
    """`make <target> VLLM=<release>` runs smla on that line; `make test` walks every line."""
    import subprocess

    from gitfixtures import REPO_ROOT

    def dry(*args: str) -> str:
        res = subprocess.run(["make", "-n", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        return res.stdout

    for target in ("patch", "status", "export", "build-wheel", "explain", "lines", "rebase"):
        assert "smla --line 0.26.0" in dry(target, "VLLM=0.26.0"), target
    assert "smla --line 7.7.7 patch" in dry("patch", "VLLM=7.7.7")
    newest = Project.at(REPO_ROOT).newest_line()
    assert f"smla --line {newest} status" in dry("status")  # the default: the newest line
    walk = dry("test")
    assert f"for l in {' '.join(Project.at(REPO_ROOT).lines())}; do" in walk  # make patch, every line
    assert '-m "line and not gpu"' in walk
    assert "vllm-$(VLLM)+" in (REPO_ROOT / "Makefile").read_text()  # e2e-bundle takes the line's wheel
