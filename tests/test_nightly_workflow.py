"""The nightly rebase job (.github/scripts/rebase-nightly.sh) on real temporary repositories.

The script is what .github/workflows/rebase-nightly.yml runs; here it runs
with the toolkit's CLI (the test interpreter) against the synthetic rebase
world of gitfixtures: a clean target, a conflicting one, failing tests,
and a broken target, the releases listed by the local package index.
GITHUB_OUTPUT and RUNNER_TEMP are temp files, as on Actions.
"""
from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from smla import proc
from smla.pin import load as load_pin

from gitfixtures import REPO_ROOT, patches_dir, pin_file

SCRIPT = REPO_ROOT / ".github" / "scripts" / "rebase-nightly.sh"
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "rebase-nightly.yml"


@pytest.fixture()
def world(rebase_world, tmp_path, index):
    """The rebase world (line 0.0.1), the package index listing vLLM 0.0.2 (C1: a clean target) and
    0.0.3 (C2: a conflicting one) as it is told, and an `smla` on PATH for the script."""
    w = rebase_world
    smla = tmp_path / "bin" / "smla"
    smla.parent.mkdir()
    smla.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m smla.cli \"$@\"\n")
    smla.chmod(0o755)
    w["smla"], w["index"] = smla, index
    return w


def publish(world, *releases: tuple[str, str]) -> None:
    """List sdists of (version, upstream commit) on the package index."""
    world["index"].publish("vllm", [(f"vllm-{v}.tar.gz", sdist(world, v, c)) for v, c in releases])


def sdist(world, version: str, commit: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        files = {f"{n}.py": proc.git(world["up"], "show", f"{commit}:{n}.py").stdout for n in "abcde"}
        files["vllm/_version.py"] = f"__version__ = version = '{version}'\n__commit_id__ = commit_id = 'g{commit[:9]}'\n"
        for rel, text in files.items():
            info = tarfile.TarInfo(f"vllm-{version}/{rel}")
            info.size = len(text.encode())
            tf.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


def run_script(world, tmp_path, *, onto: str = "") -> tuple[int, dict, str]:
    outputs = tmp_path / "github_output"
    outputs.write_text("")
    runner = tmp_path / "runner"
    runner.mkdir(exist_ok=True)
    env = {**os.environ, "ONTO_INPUT": onto, "SMLA": str(world["smla"]),
           "GITHUB_OUTPUT": str(outputs), "RUNNER_TEMP": str(runner)}
    res = subprocess.run(["bash", str(SCRIPT)], cwd=world["root"], env=env, capture_output=True, text=True,
                         timeout=300)
    out = dict(line.split("=", 1) for line in outputs.read_text().splitlines() if "=" in line)
    return res.returncode, out, res.stdout + res.stderr


def test_a_new_release_opens_a_new_line_in_a_ready_pr(world, tmp_path):
    publish(world, ("0.0.1", world["c0"]), ("0.0.2", world["c1"]))
    before = world["pin"].read_bytes()
    rc, out, log = run_script(world, tmp_path)  # no input: the newest release no line has
    assert rc == 0, log
    assert out["onto"] == "0.0.2" and out["from"] == "0.0.1" and out["rc"] == "0" and out["draft"] == "false"
    assert out["title"] == "Open the vLLM 0.0.2 line (from 0.0.1)"
    body = Path(out["body"]).read_text()
    assert "Rebase the sparse-MLA series" in body and "Opened the release line `lines/0.0.2/`" in body
    root = world["root"]
    assert load_pin(pin_file(root, "0.0.2")).version == "0.0.2"  # the PR carries the new line ...
    assert world["pin"].read_bytes() == before  # ... and the old line as it was
    assert (root / "reports" / "rebase-nightly.md").read_text() == \
        (root / "reports" / "nightly" / "rebase-report.md").read_text()
    assert json.loads((root / "reports" / "nightly" / "rebase-report.json").read_text())["status"] == "clean"


def test_no_new_release_does_nothing(world, tmp_path):
    publish(world, ("0.0.1", world["c0"]))
    rc, out, log = run_script(world, tmp_path)
    assert rc == 0 and out["onto"] == "" and "nothing to do" in log and "body" not in out


def test_a_conflict_fails_the_job_after_the_draft_body(world, tmp_path):
    publish(world, ("0.0.3", world["c2"]))
    before = world["pin"].read_bytes()
    rc, out, log = run_script(world, tmp_path)
    assert rc == 11, log  # loud: the job fails; the workflow still opens the draft PR
    assert out["rc"] == "11" and out["draft"] == "true" and out["title"].startswith("Rebase CONFLICT")
    body = Path(out["body"]).read_text()
    assert "Rebase CONFLICT" in body and "**conflict**" in body and "smla --line 0.0.1 rebase --onto 0.0.3" in body
    assert world["pin"].read_bytes() == before
    assert not (world["root"] / "lines" / "0.0.3").exists()  # no half-opened line in the PR


def test_a_broken_line_fails_the_job_with_a_draft(world, tmp_path):
    """The CPU suite of the root fails against the new line: exit 13, a draft carrying the line."""
    publish(world, ("0.0.2", world["c1"]))
    (world["root"] / "tests").mkdir()
    (world["root"] / "tests" / "test_x.py").write_text("def test_x():\n    assert False\n")
    rc, out, log = run_script(world, tmp_path)
    assert rc == 13, log
    assert out["rc"] == "13" and out["draft"] == "true" and out["title"].startswith("Rebase BROKEN")
    assert "Rebase BROKEN" in Path(out["body"]).read_text()
    assert pin_file(world["root"], "0.0.2").is_file()


@pytest.mark.parametrize("onto", ["0.0.2; rm -rf /", "--help", "abc", "a" * 40])
def test_bad_target_fails_the_job(world, tmp_path, onto):
    rc, out, log = run_script(world, tmp_path, onto=onto)
    assert rc == 2 and "not a release version" in log and "rc" not in out


def test_a_real_error_fails_the_job(world, tmp_path):
    publish(world, ("0.0.2", world["c1"]))
    shutil.rmtree(world["tree"])
    (world["tree"]).mkdir(parents=True)  # not an smla tree: the old line's tree cannot be copied or fetched into
    (world["root"] / "work" / "0.0.2" / "vllm").mkdir(parents=True)
    (world["root"] / "work" / "0.0.2" / "vllm" / "x").write_text("not a tree\n")
    rc, out, log = run_script(world, tmp_path, onto="0.0.2")
    assert rc not in (0, 11, 13) and out["rc"] == str(rc) and "draft" not in out


def test_make_cannot_pass_a_conflict_code_so_the_workflow_calls_the_script():
    """`make` exits 2 for any failing recipe: the workflow must not run `make rebase` for the exit code."""
    wf = yaml.safe_load(WORKFLOW.read_text())
    steps = wf["jobs"]["rebase"]["steps"]
    runs = [s.get("run", "") for s in steps]
    assert not any("make rebase" in r for r in runs)
    nightly = next(s for s in steps if s.get("id") == "nightly")
    assert nightly["run"].strip() == ".github/scripts/rebase-nightly.sh"
    assert "${{" not in nightly["run"]  # inputs reach the script through env only
    pr = next(s for s in steps if "create-pull-request" in s.get("uses", ""))
    assert "steps.nightly.outputs.draft" in pr["with"]["draft"]
    assert pr["with"]["body-path"] == "${{ steps.nightly.outputs.body }}"
    # and the reason, checked: a recipe exiting 11 makes make exit 2
    mk = subprocess.run(["make", "-s", "-f", "-", "x"], input="x:\n\t@exit 11\n", capture_output=True, text=True)
    assert mk.returncode == 2
