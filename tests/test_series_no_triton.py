"""Importing vLLM without Triton still works with the series applied (issue 33): every vLLM
module the series adds or changes imports in a process where `import triton` fails (as on a
CPU install without Triton), wherever the line's pristine vLLM imports it; and no file the
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


@pytest.fixture(scope="module")
def imports(vllm_tree):
    """{module: [error, the file that raised it]} of the series' vLLM modules that fail without
    Triton (each failure confirmed in a fresh process of its own, where the pristine tree imports
    the module)."""
    added, changed = series_lint.series_files(vllm_tree)
    mods = [_module(p) for p in added + sorted(changed) if p.startswith("vllm/")]
    first = {m: r for m, r in _import(vllm_tree, mods).items() if r != "ok"}
    failed = {}
    for m in sorted(first):  # alone: the failure is this module's own
        r = _import(vllm_tree, [m])[m]
        if r != "ok":
            failed[m] = r
    upstream = [m for m in failed if m.replace(".", "/") + ".py" in changed
                or m.replace(".", "/") + "/__init__.py" in changed]
    pristine = lineproofs.explain_pristine(vllm_tree)
    for m in upstream:
        if _import(pristine, [m])[m] != "ok":
            del failed[m]  # upstream's own (e.g. a compiled module this checkout lacks)
    return failed


def test_series_modules_import_without_triton(imports):
    assert not imports, f"line {current_line()}: without Triton these fail (error, raised in):\n" + \
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

