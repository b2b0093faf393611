"""Importing vLLM without Triton still works with the series applied (issue 33): every vLLM
module the series adds or changes imports in a process where `import triton` fails (as on a
CPU install without Triton), wherever the line's pristine vLLM imports it, with the whole series
applied and with the series cut where the Triton placeholder must already stand in (after the
first patch that imports Triton through vllm.triton_utils, and after the first that calls into
it at import, `X = tl.constexpr(...)`); and no file the
series adds or changes imports Triton except through vllm.triton_utils (its placeholder
stands in where Triton is missing)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lineproofs
import series_lint
from conftest import current_line

HERE = Path(__file__).parent
_TRITON_IMPORT = re.compile(r"^\s*(import triton\b|from triton\b)")
_TRITON_UTILS = re.compile(r"\s*from vllm\.triton_utils import")
# a module-level (unindented) assignment whose value names tl. or triton.: runs at import
_MODULE_LEVEL_TL = re.compile(r"[A-Za-z_]\w*(\s*:[^=]*)?\s*=[^=].*\b(tl|triton)\.")


def _import(tree: Path, modules: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "VLLM_TARGET_DEVICE")}
    env["PYTHONPATH"] = str(tree)
    proc = subprocess.run([sys.executable, str(HERE / "no_triton_import.py"), *modules], env=env,
                          capture_output=True, text=True, timeout=900, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got.pop("HAS_TRITON") is False
    return got


def _module(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _failures(tree: Path, added: list[str], changed: list[str], pristine: Path) -> dict:
    """{module: [error, the file that raised it]} of the vLLM modules among `added` and `changed`
    (paths in `tree`) that fail without Triton: each failure confirmed in a fresh process of its
    own, and a changed (upstream) module's only where the pristine tree imports it."""
    mods = [_module(p) for p in added + changed if p.startswith("vllm/")]
    first = {m: r for m, r in _import(tree, mods).items() if r != "ok"}
    failed = {}
    for m in sorted(first):  # alone: the failure is this module's own
        r = _import(tree, [m])[m]
        if r != "ok":
            failed[m] = r
    upstream = [m for m in failed if m.replace(".", "/") + ".py" in changed
                or m.replace(".", "/") + "/__init__.py" in changed]
    for m in upstream:
        if _import(pristine, [m])[m] != "ok":
            del failed[m]  # upstream's own (e.g. a compiled module this checkout lacks)
    return failed


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True,
                          check=True).stdout


def _added_lines(tree: Path, commit: str) -> list[str]:
    """The lines `commit`'s patch adds to vLLM's .py files."""
    diff = _git(tree, "show", "--format=", "-U0", "--no-renames", commit, "--", "vllm/*.py")
    return [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]


def triton_cuts(tree: Path) -> dict[str, str | None]:
    """Where the series is cut for the check: after the first patch that adds a line importing
    Triton through vllm.triton_utils, and after the first patch that adds a module-level statement
    calling into it (`X = tl.constexpr(...)`: runs at import, so the placeholder must stand in);
    {cut: commit, or None where no patch does}."""
    cuts: dict[str, str | None] = {"first-triton-module": None, "first-module-level-tl": None}
    for commit in _git(tree, "rev-list", "--reverse", f"{series_lint.BASE}..HEAD").split():
        added = _added_lines(tree, commit)
        if cuts["first-triton-module"] is None and any(_TRITON_UTILS.match(ln) for ln in added):
            cuts["first-triton-module"] = commit
        if cuts["first-module-level-tl"] is None and any(_MODULE_LEVEL_TL.match(ln) for ln in added):
            cuts["first-module-level-tl"] = commit
    return cuts


@pytest.fixture(scope="module", params=["series", "first-triton-module", "first-module-level-tl"])
def imports(request, vllm_tree, tmp_path_factory):
    """Failures without Triton (see _failures) of the series' vLLM modules: with the whole series
    (the tree), and with the series cut at each of `triton_cuts` (that commit's tree), so the
    placeholder the kernel files need comes no later than they do."""
    pristine = lineproofs.explain_pristine(vllm_tree)
    if request.param == "series":
        added, changed = series_lint.series_files(vllm_tree)
        return _failures(vllm_tree, added, sorted(changed), pristine)
    cut = triton_cuts(vllm_tree)[request.param]
    if cut is None:
        pytest.skip(f"line {current_line()}: no patch adds {request.param}")
    dest = tmp_path_factory.mktemp("cut")
    archive = subprocess.run(["git", "-C", str(vllm_tree), "archive", "--format=tar", cut, "vllm"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    diff = ["diff", "--name-only", "--no-renames", series_lint.BASE, cut]
    added = sorted(_git(vllm_tree, *diff, "--diff-filter=A", "--", "*.py").split())
    changed = sorted(_git(vllm_tree, *diff, "--diff-filter=M", "--", "*.py").split())
    return _failures(dest, added, changed, pristine)


def test_series_modules_import_without_triton(imports, request):
    assert not imports, f"line {current_line()} ({request.node.callspec.id}): without Triton " \
                        "these fail (error, raised in):\n" + \
        "\n".join(f"{m}: {r}" for m, r in sorted(imports.items()))


def test_no_direct_triton_import(vllm_tree):
    """`import triton` / `from triton ...` on a line the series adds (module level or not)."""
    added, changed = series_lint.series_files(vllm_tree)
    hits = []
    for path in added + sorted(changed):
        lines = (vllm_tree / path).read_text().splitlines()
        mine = range(1, len(lines) + 1) if path in added else sorted(changed[path])
        hits += [f"{path}:{n}: {lines[n - 1].strip()}" for n in mine
                 if n <= len(lines) and _TRITON_IMPORT.match(lines[n - 1])]
    assert not hits, "import Triton through vllm.triton_utils (from vllm.triton_utils import tl, " \
                     "triton):\n" + "\n".join(hits)

