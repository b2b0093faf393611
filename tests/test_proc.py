"""Git runs through one path (smla.proc) with a scrubbed environment (real git)."""
from __future__ import annotations

import re

from smla import treeinfo
from smla import apply as apply_mod, proc, series

from gitfixtures import REPO_ROOT, patches_dir, pin_file


def test_inherited_git_variables_do_not_redirect(series_project, tmp_path, monkeypatch):
    """As when smla runs from a git hook: GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE point elsewhere."""
    root, tree, _ = series_project
    other = tmp_path / "decoy"
    other.mkdir()
    proc.git(other, "init", "-q")
    (other / "f").write_text("x\n")
    proc.git(other, "add", "f")
    proc.git(other, "commit", "-qm", "decoy")
    decoy_head = proc.git_out(other, "rev-parse", "HEAD")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.abbrev")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "7")
    monkeypatch.setenv("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")  # transport settings pass
    assert proc.git_out(tree, "rev-parse", "--show-toplevel") == str(tree.resolve())
    env = proc.git_env()
    assert not {"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_COUNT"} & set(env)
    assert env["GIT_SSH_COMMAND"] == "ssh -o BatchMode=yes"
    result = apply_mod.apply_series(series.load(patches_dir(root)), tree, echo=lambda *_: None)
    assert [o.state for o in result.outcomes] == ["applied"] * 3
    assert len(treeinfo.commits_above_base(tree)) == 3
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_WORK_TREE")
    monkeypatch.delenv("GIT_INDEX_FILE")
    assert proc.git_out(other, "rev-parse", "HEAD") == decoy_head  # the decoy got nothing
    assert proc.git_out(other, "status", "--porcelain") == ""


def test_one_way_to_run_git():
    """No GitPython, no direct subprocess outside proc."""
    for p in REPO_ROOT.glob("tools/smla/*.py"):
        text = p.read_text()
        assert not re.search(r"^\s*(import git\b|from git\b)", text, re.M), p
        if p.name != "proc.py":
            assert not re.search(r"\bsubprocess\.(run|Popen|call|check_output)\(", text), p
    assert "gitpython" not in (REPO_ROOT / "pyproject.toml").read_text().lower()


def test_a_child_stopped_by_ctrl_c_stops_the_command(tmp_path):
    """Ctrl-C reaches the whole foreground group; a child that dies of it (or exits 130 from its
    own handler) before this process takes its own SIGINT must still stop the command as Ctrl-C
    does (the CLI: exit 130, scratch files removed), not as a failed command (exit 12); inside
    signals_held (a clean-up) only when the block ends."""
    import signal
    import sys

    import pytest

    for code in (f"import os, signal; os.kill(os.getpid(), {int(signal.SIGINT)})",
                 "raise SystemExit(130)"):
        for check in (True, False):
            with pytest.raises(KeyboardInterrupt):
                proc.run([sys.executable, "-c", code], check=check, cwd=tmp_path)
    # (children inherit the held mask: only an exit of 130 can say Ctrl-C there)
    done = []
    with pytest.raises(KeyboardInterrupt):
        with proc.signals_held():
            proc.run([sys.executable, "-c", "raise SystemExit(130)"], check=False, cwd=tmp_path)
            done.append("the clean-up ran to its end")
    assert done
    assert proc.run([sys.executable, "-c", "raise SystemExit(3)"], check=False).returncode == 3
