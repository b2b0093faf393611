"""CRLF line endings: the repository keeps the series byte-exact in a clone with core.autocrlf=true
(.gitattributes), and a patch whose endings were converted anyway is an error that says so."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner

from smla.cli import main

from gitfixtures import REPO_ROOT


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_a_clone_with_autocrlf_keeps_patches_series_and_pin_lf(tmp_path):
    src = tmp_path / "src"
    (src / "patches").mkdir(parents=True)
    shutil.copy(REPO_ROOT / ".gitattributes", src / ".gitattributes")  # old code: there was none
    for rel in ("vllm-pin.txt", "patches/series", *(f"patches/{n}" for n in
                                                     (REPO_ROOT / "patches/series").read_text().split()[:2])):
        shutil.copy(REPO_ROOT / rel, src / rel)
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "x")
    _git(tmp_path, "-c", "core.autocrlf=true", "clone", "-q", str(src), "clone")
    clone = tmp_path / "clone"
    for f in [clone / "vllm-pin.txt", *sorted((clone / "patches").iterdir())]:
        assert f.read_bytes() == (src / f.relative_to(clone)).read_bytes(), f


def test_a_crlf_patch_is_named_as_such(series_project):
    root, tree, _ = series_project
    patch = sorted((root / "patches").glob("*.patch"))[0]
    patch.write_bytes(patch.read_bytes().replace(b"\n", b"\r\n"))
    res = CliRunner().invoke(main, ["--root", str(root), "--tree", str(tree), "apply"])
    # old code: a hunk "does not apply" (or a malformed diff), CRLF never named
    assert res.exit_code == 6, res.output
    assert "CRLF" in res.output and "core.autocrlf" in res.output and patch.name in res.output
    assert "checkout -- " in res.output
