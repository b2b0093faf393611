"""The nightly rebase job (.github/scripts/rebase-nightly.sh) on real temporary repositories.

The script is what .github/workflows/rebase-nightly.yml runs; here it runs
with the toolkit's CLI (the test interpreter) against the synthetic rebase
world of gitfixtures: a clean target, a conflicting one, failing tests,
and a broken target. GITHUB_OUTPUT and RUNNER_TEMP are temp files, as on
Actions.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from smla import proc
from smla.pin import load as load_pin

from gitfixtures import REPO_ROOT

SCRIPT = REPO_ROOT / ".github" / "scripts" / "rebase-nightly.sh"
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "rebase-nightly.yml"


@pytest.fixture()
def world(rebase_world, tmp_path):
    """The rebase world, upstream main at C1 (a clean target), and an `smla` on PATH for the script."""
    w = rebase_world
    proc.git(w["up"], "branch", "-f", "main", w["c1"])  # the tip of upstream main: a clean target
    smla = tmp_path / "bin" / "smla"
    smla.parent.mkdir()
    smla.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m smla.cli \"$@\"\n")
    smla.chmod(0o755)
    w["smla"] = smla
    return w


def run_script(world, tmp_path, *, onto: str = "", test_cmd: str = "true") -> tuple[int, dict, str]:
    outputs = tmp_path / "github_output"
    outputs.write_text("")
    runner = tmp_path / "runner"
    runner.mkdir(exist_ok=True)
    env = {**os.environ, "ONTO_INPUT": onto, "SMLA": str(world["smla"]), "SMLA_NIGHTLY_TEST_CMD": test_cmd,
           "GITHUB_OUTPUT": str(outputs), "RUNNER_TEMP": str(runner)}
    res = subprocess.run(["bash", str(SCRIPT)], cwd=world["root"], env=env, capture_output=True, text=True,
                         timeout=300)
    out = dict(line.split("=", 1) for line in outputs.read_text().splitlines() if "=" in line)
    return res.returncode, out, res.stdout + res.stderr


def test_clean_night_opens_a_ready_pr(world, tmp_path):
    rc, out, log = run_script(world, tmp_path)  # no input: the tip of the pin repo's main
    assert rc == 0, log
    assert out["onto"] == world["c1"] and out["rc"] == "0" and out["tests"] == "passed"
    assert out["draft"] == "false" and out["title"] == f"Rebase the series onto vLLM {world['c1']}"
    body = Path(out["body"]).read_text()
    assert "Rebase the sparse-MLA series" in body and "CPU tests (`true`): passed" in body
    root = world["root"]
    assert load_pin(root / "vllm-pin.txt").commit == world["c1"]  # the PR carries the new pin ...
    assert (root / "reports" / "rebase-nightly.md").read_text() == \
        (root / "reports" / "nightly" / "rebase-report.md").read_text()
    assert json.loads((root / "reports" / "nightly" / "rebase-report.json").read_text())["status"] == "clean"


def test_conflict_night_opens_a_draft_with_the_report(world, tmp_path):
    before = (world["root"] / "vllm-pin.txt").read_bytes()
    rc, out, log = run_script(world, tmp_path, onto=world["c2"], test_cmd="echo tests-must-not-run; false")
    assert rc == 0, log  # the job goes on to open the draft PR
    assert out["rc"] == "11" and out["tests"] == "skipped" and out["draft"] == "true"
    assert out["title"].startswith("Rebase CONFLICT") and "tests-must-not-run" not in log
    body = Path(out["body"]).read_text()
    assert "Rebase CONFLICT" in body and "**conflict**" in body and f"smla rebase --onto {world['c2']}" in body
    assert (world["root"] / "vllm-pin.txt").read_bytes() == before  # pin unchanged on a conflict


def test_failing_tests_make_a_draft(world, tmp_path):
    rc, out, log = run_script(world, tmp_path, test_cmd="exit 1")
    assert rc == 0, log
    assert out["rc"] == "0" and out["tests"] == "failed" and out["draft"] == "true"
    assert "passed" not in Path(out["body"]).read_text().split("CPU tests", 1)[1]


@pytest.mark.parametrize("onto", ["main; rm -rf /", "--help", "abc"])
def test_bad_target_fails_the_job(world, tmp_path, onto):
    rc, out, log = run_script(world, tmp_path, onto=onto)
    assert rc == 2 and "not a commit id or version" in log and "rc" not in out


def test_a_real_error_fails_the_job(world, tmp_path):
    (world["tree"] / "a.py").write_text("uncommitted\n")  # smla refuses a dirty tree: exit 7
    rc, out, log = run_script(world, tmp_path, onto=world["c1"])
    assert rc == 7 and out["rc"] == "7" and "draft" not in out


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
