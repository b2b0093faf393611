"""Run a line's own CPU proof (tests/lines/<release>/<group>/) against that line's work tree.

A line whose vLLM changed an interface the toolkit-wide tests use keeps the tests of its own code
under tests/lines/<release>/, grouped by what they test (attention, indexer, v4 for 0.33.0). They
import vLLM from the tree in their own process, with the toolkit's stand-ins
(tools/smla/_selection_standins.py), so they run in a pytest child process: its own rootdir and
conftest, none of this suite's. The caller (a test module of the matching group) asserts how many
passed, so a proof that silently skips fails here.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, current_line


def proof_dir(group: str) -> Path:
    return REPO_ROOT / "tests" / "lines" / current_line() / group


def require_line_proof(group: str, replaces: str) -> Path:
    """The proof directory of `group` on the line under test; skip (naming what this line runs
    instead) when the line has none."""
    d = proof_dir(group)
    if not d.is_dir():
        pytest.skip(f"line {current_line()} has no tests/lines/{current_line()}/{group}: {replaces}")
    return d


def run_line_proof(group: str, tree: Path, pristine: Path | None, *args: str,
                   timeout: int = 3000) -> dict[str, int]:
    """pytest `args` inside tests/lines/<line>/<group>/ for `tree`; returns the outcome counts
    ({"passed": n, ...}) after asserting the run succeeded."""
    d = proof_dir(group)
    tree = str(Path(tree).resolve())
    env = dict(os.environ,
               SMLA_STANDINS=str(REPO_ROOT / "tools" / "smla" / "_selection_standins.py"),
               SMLA_TEST_REFS=str(REPO_ROOT / "tests"),
               # the names each group's proof reads its patched tree from
               SMLA_033_TREE=tree, PORT_IDX_TREE=tree, VLLM_TREE=tree, VLLM_COMBO_TREE=tree,
               PYTHONPATH=os.pathsep.join([str(d), str(REPO_ROOT / "tests")]))
    if pristine is not None:
        env["SMLA_033_PRISTINE"] = env["VLLM_PRISTINE_TREE"] = str(pristine)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-c", os.devnull, "--rootdir", str(d), "--confcutdir", str(d), *args],
                          cwd=d, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    summary = out.strip().splitlines()[-1]
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed)", summary)}


def explain_pristine(tree: Path) -> Path:
    """The line's pristine vLLM: the work tree's base (tag smla-base), exported by smla.explain."""
    from smla import explain

    return explain.pristine_tree(tree)


def cases(table: dict[str, list[tuple[str, str, int]]], none_reason: str) -> list:
    """pytest params for the line under test's entries of `table` ({line: [(group, file, least
    passed)]}); one skipped param saying `none_reason` where the line has none."""
    line = current_line()
    if not table.get(line):
        return [pytest.param(None, id="none", marks=pytest.mark.skip(reason=f"line {line}: {none_reason}"))]
    return [pytest.param(c, id=f"{c[0]}/{c[1]}") for c in table[line]]


def check(case: tuple[str, str, int], tree: Path, *args: str, pristine: bool = False) -> dict[str, int]:
    """Run one `cases` entry against `tree` (and the tree's pristine base where `pristine`)."""
    group, name, least = case
    got = run_line_proof(group, tree, explain_pristine(tree) if pristine else None, name, *args)
    assert got.get("passed", 0) >= least, got
    return got


def replaced_on(**by_line: str):
    """Mark a test about one line's interfaces: skipped on each line named (release with `_` for
    `.`, e.g. `v0_33_0="..."`), the reason naming what replaces it there."""
    line = current_line()
    reason = by_line.get("v" + line.replace(".", "_"))
    return pytest.mark.skipif(reason is not None, reason=f"line {line}: {reason}")


def v4_by_env() -> bool:
    """Whether the line's series switches DeepSeek-V4's kernels by VLLM_DSV4_PORTABLE (the 0.26.0
    line's vllm/envs.py), which smla explain's V4 query asks; 0.33.0's series uses
    KernelConfig.deepseek_v4_kernels instead. True without a tree (collection for test-fast)."""
    from conftest import default_tree

    envs = default_tree() / "vllm" / "envs.py"
    return not envs.is_file() or "VLLM_DSV4_PORTABLE" in envs.read_text()


def needs_v4_env(what: str):
    """Skip mark for tests of smla's DeepSeek-V4 query on a line whose series has no VLLM_DSV4_PORTABLE."""
    line = current_line()
    return pytest.mark.skipif(
        not v4_by_env(), reason=f"line {line} has no VLLM_DSV4_PORTABLE (its series: KernelConfig."
                                f"deepseek_v4_kernels), which {what} asks; tests/lines/{line}/v4/"
                                "test_v4_selection_pristine_vs_patched.py checks its V4 selection")
