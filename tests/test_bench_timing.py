"""bench/timing.py's kernel_modules: the `before` kernel file (SMLA_TREE_BEFORE) imports its
sibling kernel modules from its own tree. The V4 kernel imports the DSA kernel's helpers; when
both trees' DSA files differ, a `before` V4 kernel that took the newer DSA helpers was timed as
neither file (2026-12-04: the "before" column of a DeepSeek-V4 run). Two stand-in trees here, in
a process of its own (load_tree_module needs TRITON_INTERPRET unset, which other test modules set
for theirs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPS = Path("vllm/v1/attention/ops")


def _tree(root: Path, helper_value: int) -> Path:
    ops = root / OPS
    ops.mkdir(parents=True)
    (ops / "helper.py").write_text(f"VALUE = {helper_value}\n")
    (ops / "kernel.py").write_text("from vllm.v1.attention.ops.helper import VALUE\n")
    return root


def test_before_takes_its_own_siblings(tmp_path):
    now, before = _tree(tmp_path / "now", 1), _tree(tmp_path / "before", 2)
    code = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, sys.argv[1])
        from timing import kernel_modules
        now, before = kernel_modules("vllm/v1/attention/ops/kernel.py", "t")
        import vllm.v1.attention.ops.helper as h
        print(json.dumps([now.VALUE, before.VALUE, h.VALUE]))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(SMLA_TREE=str(now), SMLA_TREE_BEFORE=str(before))
    proc = subprocess.run([sys.executable, "-c", code, str(REPO / "bench")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # each kernel file sees its own tree's helper; afterwards the package is SMLA_TREE's again
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [1, 2, 1]
