"""`make`'s .venv: a refused interpreter is stopped before any install, and a .venv made from a
refused (or another) interpreter is made again (tools/venv_check.py, the Makefile's .venv rule).

The interpreters are stand-ins: shell scripts that answer the version question (`-c ...`) with a
version of the test's choosing and hand everything else to this Python.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gitfixtures import REPO_ROOT


def fake_python(where: Path, version: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    p = where / "python"
    p.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo "{version}"; exit 0; fi\nexec "{sys.executable}" "$@"\n')
    p.chmod(0o755)
    return p


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The files `make venv` reads, in a checkout of its own."""
    root = tmp_path / "checkout"
    root.mkdir()
    for rel in ("Makefile", "pyproject.toml", "tools/venv_check.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, root / rel)
    shutil.copytree(REPO_ROOT / "requirements", root / "requirements")
    return root


@pytest.mark.parametrize("version", ["3.11.2", "3.9.18", "3.10.11"])
def test_a_refused_interpreter_stops_before_any_install(checkout, tmp_path, version):
    py = fake_python(tmp_path / "bin", version)
    res = subprocess.run(["make", "-C", str(checkout), "venv", f"PY={py}"], capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "PIP_NO_INDEX": "1"})
    # old code: `python -m venv .venv` and pip's installs ran first (49 s), then pip refused the project
    assert res.returncode != 0
    assert f"is Python {version}" in res.stderr and "requires-python" in res.stderr, res.stderr
    assert "hint: " in res.stderr and "`make venv PY=" in res.stderr
    assert not (checkout / ".venv").exists()


def test_an_accepted_interpreter_passes(checkout, tmp_path):
    py = fake_python(tmp_path / "bin", "3.12.4")
    res = subprocess.run([sys.executable, str(checkout / "tools/venv_check.py"), str(py), str(checkout / ".venv")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout == "" and res.stderr == ""


@pytest.mark.parametrize("old, why", [("3.11.2", "which the toolkit refuses"), ("3.12.4", "PY=")])
def test_a_venv_from_a_refused_or_another_python_is_made_again(checkout, tmp_path, old, why):
    venv = checkout / ".venv"
    (venv / "lib").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    fake_python(venv / "bin", old)
    good = fake_python(tmp_path / "good", "3.11.7")
    res = subprocess.run([sys.executable, str(checkout / "tools/venv_check.py"), str(good), str(venv)],
                         capture_output=True, text=True, timeout=60)
    # old code: the rerun with a good PY failed the same way until .venv was removed by hand
    assert res.returncode == 0, res.stderr
    assert f"removing {venv}" in res.stdout and why in res.stdout
    assert not venv.exists()


def test_a_good_venv_of_the_same_python_is_kept(checkout, tmp_path):
    venv = checkout / ".venv"
    (venv / "pyvenv.cfg").parent.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    fake_python(venv / "bin", "3.11.7")
    good = fake_python(tmp_path / "good", "3.11.7")
    res = subprocess.run([sys.executable, str(checkout / "tools/venv_check.py"), str(good), str(venv)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and venv.is_dir() and res.stdout == ""


def test_make_runs_the_check_before_creating_the_venv(checkout):
    res = subprocess.run(["make", "-n", "-C", str(checkout), "venv", "PY=python3.x"], capture_output=True,
                         text=True, timeout=60)
    lines = res.stdout.splitlines()
    check = next(i for i, ln in enumerate(lines) if "tools/venv_check.py" in ln)
    create = next(i for i, ln in enumerate(lines) if "-m venv" in ln)
    assert check < create
