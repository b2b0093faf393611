"""The series passes vLLM's own pre-commit lint (issue 33): the ruff release the line's
.pre-commit-config.yaml pins, with the tree's pyproject.toml, over the files the series adds
(`ruff check`, `ruff format --check`) and the lines it adds to upstream files (`ruff check`).
tests/series_lint.py says what counts; `python tests/series_lint.py <tree>` lists the findings."""
from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

import series_lint
from conftest import current_line


@pytest.fixture(scope="module")
def lint(vllm_tree):
    pinned = series_lint.pinned_ruff(vllm_tree)
    have = series_lint.installed_ruff()
    assert have == pinned, (f"line {current_line()} pins ruff {pinned} (.pre-commit-config.yaml); "
                            f"this Python has {have}: requirements/dev.txt pins the linter")
    return series_lint.check_findings(vllm_tree), series_lint.format_findings(vllm_tree)


def test_series_is_lint_clean(lint):
    check, fmt = lint
    bad = [str(f) for f in check]
    bad += [f"{p}: ruff format would reformat it" for p in fmt]
    assert not bad, f"line {current_line()}: vLLM's ruff finds, in what the series adds:\n" + "\n".join(bad)


# ------------------------------------------------------------ what counts, on a tiny repository

LONG = "x = '" + "a" * 90 + "'\n"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


def test_findings_count_only_what_the_series_adds(tmp_path):
    """Upstream's own finding in a changed file is not the series'; the series' added line in it
    and everything in an added file are; format is checked on added files only."""
    repo = tmp_path / "tree"
    repo.mkdir()
    (repo / "pyproject.toml").write_text('[tool.ruff.lint]\nselect = ["E501", "F401"]\n')
    (repo / "old.py").write_text(LONG + "y = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")
    _git(repo, "tag", series_lint.BASE)
    (repo / "old.py").write_text(LONG + "y = 1\n" + LONG + "z=[1,\n 2]\n")
    (repo / "new.py").write_text("import os\n" + LONG + "w=[1,\n 2]\n")
    (repo / "tidy.py").write_text("v = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "series")

    found = [(f.path, f.line, f.code) for f in series_lint.check_findings(repo)]
    assert found == [("new.py", 1, "F401"), ("new.py", 2, "E501"), ("old.py", 3, "E501")]
    assert series_lint.format_findings(repo) == ["new.py"]


def test_pinned_ruff_is_read_from_the_tree(tmp_path):
    (tmp_path / ".pre-commit-config.yaml").write_text(textwrap.dedent("""\
        repos:
        - repo: https://github.com/astral-sh/ruff-pre-commit
          rev: v9.8.7
          hooks:
          - id: ruff-check
        """))
    assert series_lint.pinned_ruff(tmp_path) == "9.8.7"
