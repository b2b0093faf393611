"""The command line: options where users type them, one tree variable, JSON errors, exit
codes, quoted hints, `clean`, progress, version, requires-python (real temporary git repos)."""
from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import sys
import tarfile

import pytest
from click.testing import CliRunner
from packaging.specifiers import SpecifierSet

import smla
from smla import apply as apply_mod, cache, proc, series, source
from smla.cli import main
from smla.errors import (ApplyError, CommandError, FetchError, LockError, RebaseConflict, SmlaError, TestsFailed,
                         TreeStateError, UsageError)
from smla.project import TREE_ENV, Project

import gitfixtures
from gitfixtures import REPO_ROOT, commit_change, make_sdist, quiet, patches_dir, pin_file


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, list(args), env=env)


def test_global_options_work_after_the_command_name(series_project):
    root, tree, _ = series_project
    before = run("--root", str(root), "--tree", str(tree), "status")
    after = run("status", "--root", str(root), "--tree", str(tree))  # old code: "No such option: --tree"
    assert after.exit_code == 0, after.output
    assert after.output == before.output and f"work tree   {tree}" in after.output
    assert run("apply", "--tree", str(tree), "--root", str(root), "-v").exit_code == 0
    assert run("export", "--json", "--tree", str(tree), "--root", str(root)).exit_code == 0


def test_one_tree_variable(series_project, monkeypatch):
    root, tree, _ = series_project
    assert TREE_ENV == "SMLA_TREE"
    monkeypatch.setenv("SMLA_TREE", str(tree))
    assert Project.discover(root).default_tree == tree
    res = run("--root", str(root), "status", env={"SMLA_TREE": str(tree)})
    assert res.exit_code == 0 and f"work tree   {tree}" in res.output
    users = [p for p in [*REPO_ROOT.glob("tools/smla/*.py"), *REPO_ROOT.glob("tests/*.py"), *REPO_ROOT.glob("bench/*.py"),
                         REPO_ROOT / "Makefile", *REPO_ROOT.glob("docs/*.md"), REPO_ROOT / "README.md", *REPO_ROOT.glob("tests/gpu/*.sh")]
             if p.is_file() and "SMLA_VLLM" + "_TREE" in p.read_text()]
    assert users == []


def test_discard_without_force_is_an_error(series_project):
    root, tree, _ = series_project
    (tree / "README.md").write_text("mine\n")
    res = run("fetch", "--discard", "--root", str(root), "--tree", str(tree))  # old code: silently ignored
    assert res.exit_code == UsageError.exit_code == 2
    assert "--discard only goes with --force" in res.output
    assert (tree / "README.md").read_text() == "mine\n"


def test_errors_are_json_under_json(series_project):
    root, tree, _ = series_project
    res = run("apply", "--json", "--root", str(root), "--tree", str(tree / "missing"))
    assert res.exit_code == TreeStateError.exit_code
    data = json.loads(res.stdout)  # old code: "error: ..." text, not JSON
    assert data["error"]["kind"] == "TreeStateError" and data["error"]["exit_code"] == 7
    assert "no smla work tree" in data["error"]["message"] and "smla fetch" in data["error"]["hint"]
    st = run("status", "--json", "--root", str(root), "--tree", str(tree / "missing"))
    assert json.loads(st.stdout)["error"]["kind"] == "TreeStateError"


def test_exit_codes_are_distinct():
    codes = [cls.exit_code for cls in (UsageError, TreeStateError, ApplyError, CommandError, RebaseConflict,
                                       TestsFailed, LockError)]
    assert len(set(codes)) == len(codes)
    assert TestsFailed.exit_code == 13 and CommandError.exit_code == 12


def test_rebase_test_failure_has_its_own_exit_code():
    """A rebase whose CPU suite fails is `broken`: RebaseBroken, exit 13 (a TestsFailed)."""
    from smla.errors import RebaseBroken
    from smla.rebase import RebaseResult

    r = RebaseResult("broken", "/t", {}, {}, {}, [], {}, tests={"passed": False, "returncode": 1, "command": "x",
                                                                "tail": ""})
    with pytest.raises(TestsFailed) as info:  # old code: CommandError (exit 12, "external command failed")
        r.raise_for_status()
    assert isinstance(info.value, RebaseBroken) and info.value.exit_code == 13
    assert "CPU suite exited 1" in info.value.message


def test_hints_are_quoted_shell_commands(tmp_path):
    spaced = tmp_path / "my dir"
    spaced.mkdir()
    root, tree, _ = gitfixtures.series_project(spaced)
    cuda = tree / "vllm/platforms/cuda.py"
    cuda.write_text(cuda.read_text().replace("line 19\n", "line nineteen\n"))
    proc.git(tree, "commit", "-qam", "local drift")
    proc.git(tree, "tag", "-f", "smla-base")
    with pytest.raises(ApplyError) as err:
        apply_mod.apply_series(series.load(patches_dir(root)), tree, **quiet)
    commands = re.findall(r"`([^`]+)`", err.value.hint)
    git_cmd = next(c for c in commands if c.startswith("git "))
    assert shlex.split(git_cmd)[:3] == ["git", "-C", str(tree)]  # old code: unquoted, splits at the space
    assert "'" in git_cmd


def test_clean_keeps_unexported_work_unless_discard(series_project):
    root, tree, _ = series_project
    args = ["clean", "--root", str(root), "--tree", str(tree)]
    apply_mod.apply_series(series.load(patches_dir(root)), tree, **quiet)
    commit_change(tree, {"vllm/new.py": "x = 1\n"}, "Unexported fix")
    refused = run(*args)
    assert refused.exit_code == TreeStateError.exit_code and "Unexported fix" in refused.output
    assert tree.is_dir()
    assert run(*args, "--discard").exit_code == 0 and not tree.exists()
    assert run(*args).exit_code == 0  # nothing there: nothing to do


def test_makefile_clean_goes_through_the_guard():
    text = (REPO_ROOT / "Makefile").read_text()
    recipe = text.split("\nclean:", 1)[1].split("\n\n", 1)[0]
    guard = "smla --line $$l clean"  # every line's work tree, through the guard
    assert guard in recipe and "for l in $(LINES)" in recipe
    assert recipe.index(guard) < recipe.index("rm -rf")


def test_progress_goes_to_stderr_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert cache.progress_enabled()
    assert not cache.progress_enabled(quiet=True)
    cache.set_progress(False)
    try:
        assert not cache.progress_enabled()
    finally:
        cache.set_progress(True)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert not cache.progress_enabled()


def test_json_turns_progress_off(series_project, monkeypatch):
    root, tree, _ = series_project
    seen = []
    real = apply_mod.apply_series
    monkeypatch.setattr(apply_mod, "apply_series", lambda *a, **k: (seen.append(cache._progress_on), real(*a, **k))[1])
    assert run("apply", "--json", "--root", str(root), "--tree", str(tree)).exit_code == 0
    assert run("apply", "--root", str(root), "--tree", str(tree)).exit_code == 0
    assert seen == [False, True] and cache._progress_on


def test_one_version_number():
    res = run("--version")
    assert res.exit_code == 0 and res.output.strip() == f"smla, version {smla.__version__}"
    assert importlib.metadata.version("vllm-sparse-mla") == smla.__version__
    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and "smla.__version__" in text
    assert not re.search(r"^version\s*=\s*\"", text, re.M)


def test_no_tools_package_left():
    import importlib.util

    assert importlib.util.find_spec("tools") is None or "smla" not in str(importlib.util.find_spec("tools").origin)
    for p in [*REPO_ROOT.glob("tools/smla/*.py"), *REPO_ROOT.glob("tests/*.py")]:
        assert not re.search(r"^\s*(from|import) tools\b", p.read_text(), re.M), p


def test_requires_python_excludes_tarfiles_without_filters():
    text = (REPO_ROOT / "pyproject.toml").read_text()
    spec = SpecifierSet(re.search(r'^requires-python\s*=\s*"([^"]+)"', text, re.M).group(1))
    assert "3.10.11" not in spec and "3.11.3" not in spec and "3.10.0" not in spec
    assert "3.10.12" in spec and "3.11.4" in spec and "3.12.0" in spec and "3.13.1" in spec


def test_unpacking_without_tar_filters_is_a_clear_error(tmp_path, monkeypatch):
    sdist, _ = make_sdist(tmp_path)
    monkeypatch.delattr(tarfile, "data_filter")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(FetchError, match="cannot unpack archives safely"):  # old code: TypeError
        source.unpack_sdist(sdist, dest)


def test_all_errors_are_smla_errors_with_codes():
    import smla.errors as e

    classes = [c for c in vars(e).values() if isinstance(c, type) and issubclass(c, SmlaError)]
    assert all(isinstance(c.exit_code, int) and c.exit_code > 0 for c in classes)


def test_a_plain_install_carries_every_package(tmp_path):
    """A wheel of the toolkit (what a non-editable `pip install .` installs) holds smla and each of
    its subpackages (rebase/, wheel/): `packages = ["smla"]` left those out."""
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"
    shutil.copytree(REPO_ROOT / "tools" / "smla", src / "tools" / "smla",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (whl,) = (tmp_path / "dist").glob("*.whl")
    shipped = {n.rsplit("/", 1)[0] for n in zipfile.ZipFile(whl).namelist() if n.endswith("/__init__.py")}
    packages = {str(p.parent.relative_to(REPO_ROOT / "tools")) for p in (REPO_ROOT / "tools" / "smla").rglob("__init__.py")}
    assert packages == shipped, packages ^ shipped
