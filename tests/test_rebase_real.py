"""Real drift: rebase the real series from the repository's pin onto a newer vLLM release.

Opt-in (SMLA_REAL_REBASE=1; needs both sdists, cached or from PyPI).
SMLA_REAL_ONTO names the target release (default 0.33.0, the latest here);
SMLA_REAL_UPSTREAM_COMMIT its full commit when known, otherwise the rebase
runs with PyPI alone (`--source sdist`) and the new pin records the sdist's
abbreviated commit. Runs in a scratch copy of the toolkit (pin + patches/
copied to tmp) and checks the report against reality: every patch is
re-applied to an independent tree of the target sdist and must behave as
the report says. Then --abort must restore all.
SMLA_REAL_PATCHES / SMLA_REAL_PIN point at another series / pin.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from smla import treeinfo
from smla import cache, proc, source
from smla.cli import main
from smla.pin import load

from conftest import line_dir
ONTO = os.environ.get("SMLA_REAL_ONTO", "0.33.0")
FULL_COMMIT = os.environ.get("SMLA_REAL_UPSTREAM_COMMIT")  # e.g. f2654939e69b4069b13977e9aef3e31d4dcaf051 for 0.26.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("SMLA_REAL_REBASE") != "1", reason="set SMLA_REAL_REBASE=1 to run"),
]


def _snapshot(line: Path) -> dict[str, bytes]:
    out = {"vllm-pin.txt": (line / "vllm-pin.txt").read_bytes()}
    out.update({f"patches/{f.name}": f.read_bytes() for f in sorted((line / "patches").iterdir())})
    return out


def _fresh(tmp: Path, alternate: Path) -> Path:
    """An independent tree of the target sdist; borrows the rebase tree's objects so 3-way merges find
    preimages."""
    fresh = tmp / "fresh"
    fresh.mkdir()
    proc.git(fresh, "init", "-q")
    (fresh / ".git" / "objects" / "info" / "alternates").write_text(str(alternate / ".git" / "objects") + "\n")
    archive = cache.cache_dir() / "downloads" / f"vllm-{ONTO}.tar.gz"
    source.unpack_sdist(archive, fresh)
    source.commit_snapshot(fresh, f"vLLM {ONTO}")
    return fresh


def test_real_rebase_onto_a_newer_release(tmp_path):
    patches = Path(os.environ.get("SMLA_REAL_PATCHES", line_dir() / "patches"))
    if not (patches / "series").is_file():
        pytest.skip(f"no series in {patches} yet")
    pin_src = Path(os.environ.get("SMLA_REAL_PIN", line_dir() / "vllm-pin.txt"))
    old_pin = load(pin_src)
    root = tmp_path / "root"
    old_line = root / "lines" / old_pin.version
    old_line.mkdir(parents=True)
    shutil.copy2(pin_src, old_line / "vllm-pin.txt")
    shutil.copytree(patches, old_line / "patches")
    old_tree = root / "work" / old_pin.version / "vllm"
    tree = root / "work" / ONTO / "vllm"  # the new line's tree: the rebase opens lines/<ONTO>/
    before = _snapshot(old_line)

    commit_args = ["--upstream-commit", FULL_COMMIT] if FULL_COMMIT else []
    res = CliRunner().invoke(main, ["--root", str(root), "--line", old_pin.version, "rebase", "--onto", ONTO,
                                    *commit_args, "--source", "sdist", "--no-test",
                                    "--report-dir", str(tmp_path / "rep")])
    assert res.exit_code in (0, 11, 13), res.output
    data = json.loads((tmp_path / "rep" / "rebase-report.json").read_text())
    assert data["status"] == {0: "clean", 11: "conflict", 13: "broken"}[res.exit_code]
    assert _snapshot(old_line) == before and not old_tree.exists()  # the old line is never written
    assert data["old_base"]["version"] == old_pin.version and data["new_base"]["version"] == ONTO
    assert data["new_base"]["commit_kind"] == ("full" if FULL_COMMIT else "abbreviated")

    # Reality check, patch by patch, on an independent tree of the target.
    fresh = _fresh(tmp_path, tree)
    for p in data["patches"]:
        path = str((patches / p["name"]).resolve())
        check = proc.git(fresh, "apply", "--check", "-v", "--", path, check=False)
        if p["outcome"] in ("unchanged", "offsets"):
            assert check.returncode == 0, (p["name"], check.stderr)
            moved = re.findall(r"Hunk #\d+ succeeded at \d+ \(offset -?\d+ lines?\)", check.stderr + check.stdout)
            assert bool(moved) == (p["outcome"] == "offsets"), p["name"]
            proc.git(fresh, "am", "-q", "--keep-cr", "--", path)
        elif p["outcome"] == "merged":
            assert check.returncode != 0, p["name"]
            proc.git(fresh, "am", "-q", "--3way", "--keep-cr", "--", path)
        elif p["outcome"] == "upstream":
            head = proc.git_out(fresh, "rev-parse", "HEAD")
            rev = proc.git(fresh, "apply", "--check", "-R", "--", path, check=False)
            if rev.returncode != 0:
                proc.git(fresh, "am", "-q", "--3way", "--keep-cr", "--", path)
                assert proc.git_out(fresh, "rev-parse", "HEAD") == head, p["name"]
        elif p["outcome"] == "conflict":
            am = proc.git(fresh, "am", "-q", "--3way", "--keep-cr", "--", path, check=False)
            assert am.returncode != 0, p["name"]
            unmerged = proc.git_out(fresh, "diff", "--name-only", "--diff-filter=U").split()
            if unmerged:  # the same files conflict here as in the report
                assert set(unmerged) == set(p["files"]), (p["name"], unmerged)
            for f in p["files"]:  # and the stopped tree holds them for the user
                assert (tree / f).exists() or (fresh / f).exists(), f
            proc.git(fresh, "am", "--abort")
            break
        else:
            pytest.fail(f"unexpected outcome {p['outcome']} for {p['name']}")

    if res.exit_code == 11:
        assert (tree / ".git" / "smla-rebase" / "state.json").is_file()
        abort = CliRunner().invoke(main, ["--root", str(root), "--line", ONTO, "rebase", "--abort"])
        assert abort.exit_code == 0, abort.output
        assert _snapshot(old_line) == before
        assert not (root / "lines" / ONTO).exists() and not tree.exists()  # the opened line and its tree go
    else:
        after = load(root / "lines" / ONTO / "vllm-pin.txt")
        assert after.version == ONTO
        if FULL_COMMIT:
            assert (after.commit, after.commit_kind) == (FULL_COMMIT, "full")
        else:  # PyPI alone: the sdist's abbreviation, marked
            assert after.commit_kind == "abbreviated" and data["new_base"]["upstream_commit"] == after.commit
