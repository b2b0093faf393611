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
# Kernel files other work is rewriting now (the GLM-5.3-Flash kernels): their `import triton`
# lines move to `from vllm.triton_utils import tl, triton` after that merge, and this list goes.
# A module that fails only through one of them is listed, not failed; an entry that no longer
# imports Triton itself fails (remove it).
PENDING_KERNEL_IMPORTS = {
    "vllm/v1/attention/ops/triton_sparse_mla.py",
    "vllm/v1/attention/ops/triton_dsa_indexer.py",
    "vllm/v1/attention/ops/triton_sparse_mla_dsv4.py",
    "vllm/v1/attention/ops/triton_fp8_e4m3.py",
    "vllm/v1/attention/ops/triton_launch.py",
}
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
    Triton (through a pending kernel file, or in a fresh process of their own where the pristine
    tree imports them)."""
    added, changed = series_lint.series_files(vllm_tree)
    mods = [_module(p) for p in added + sorted(changed) if p.startswith("vllm/")]
    first = {m: r for m, r in _import(vllm_tree, mods).items() if r != "ok"}
    failed = {m: r for m, r in first.items() if r[1] in PENDING_KERNEL_IMPORTS}
    for m in sorted(set(first) - set(failed)):  # alone: the failure is this module's own
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
    bad = {m: r for m, r in imports.items() if r[1] not in PENDING_KERNEL_IMPORTS}
    assert not bad, f"line {current_line()}: without Triton these fail (error, raised in):\n" + \
        "\n".join(f"{m}: {r}" for m, r in sorted(bad.items()))


def test_no_direct_triton_import(vllm_tree):
    """`import triton` / `from triton ...` on a line the series adds (module level or not)."""
    added, changed = series_lint.series_files(vllm_tree)
    hits = []
    for path in added + sorted(changed):
        lines = (vllm_tree / path).read_text().splitlines()
        mine = range(1, len(lines) + 1) if path in added else sorted(changed[path])
        hits += [f"{path}:{n}: {lines[n - 1].strip()}" for n in mine
                 if n <= len(lines) and _TRITON_IMPORT.match(lines[n - 1])
                 and path not in PENDING_KERNEL_IMPORTS]
    assert not hits, "import Triton through vllm.triton_utils (from vllm.triton_utils import tl, " \
                     "triton):\n" + "\n".join(hits)


def test_pending_kernel_entries_still_needed(vllm_tree):
    added, _ = series_lint.series_files(vllm_tree)
    stale = sorted(p for p in PENDING_KERNEL_IMPORTS if p in added
                   and not any(_TRITON_IMPORT.match(line) for line in (vllm_tree / p).read_text().splitlines()))
    assert not stale, f"these import Triton through vllm.triton_utils now: remove them from " \
                      f"PENDING_KERNEL_IMPORTS: {stale}"
