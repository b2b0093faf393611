"""Importing DeepSeek-V4's model package, op modules, compressor and CPU model with Triton
unavailable (the suite's tests/no_triton_import.py in a subprocess: every `import triton` raises
ImportError), pristine 0.33.0 and the clone alike."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TREE

HERE = Path(__file__).parent
PRISTINE = Path(os.environ["VLLM_PRISTINE_TREE"])
# the suite's tests/ (lineproofs.py sets it; by hand, this checkout's)
NO_TRITON_IMPORT = Path(os.environ.get("SMLA_TEST_REFS", HERE.parents[2])) / "no_triton_import.py"
MODULES = ["vllm.models.deepseek_v4.common.ops", "vllm.models.deepseek_v4.compressor",
           "vllm.models.deepseek_v4.nvidia.ops", "vllm.models.deepseek_v4.cpu.model"]


@pytest.mark.parametrize("tree", [PRISTINE, TREE], ids=["pristine", "patched"])
def test_v4_modules_import_without_triton(tree):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                          "VLLM_TARGET_DEVICE")}
    env["PYTHONPATH"] = str(tree)
    proc = subprocess.run([sys.executable, str(NO_TRITON_IMPORT), *MODULES], env=env,
                          capture_output=True, text=True, timeout=600, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got.pop("HAS_TRITON") is False
    assert all(v == "ok" for v in got.values()), got
