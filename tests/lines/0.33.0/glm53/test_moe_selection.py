"""GLM-5.3-Flash's FP8 experts below sm90 go through vLLM's own MoE kernels, no patch: the tree's
oracle (moe_select.py, one subprocess per capability) picks Marlin (W8A16) on sm80/sm86 and
Triton on sm89. Both apply the SwiGLU clamp (swiglu_limit) through apply_moe_activation: Marlin
passes the experts' activation as activation_func, Triton calls swiglu_limit_func."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("cap,backend,experts", [("8.0", "MARLIN", "MarlinExperts"),
                                                 ("8.6", "MARLIN", "MarlinExperts"),
                                                 ("8.9", "TRITON", "TritonExperts")])
def test_fp8_moe_backend(cap, backend, experts):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(HERE / "moe_select.py"), cap], capture_output=True,
                       text=True, env=env, timeout=600, cwd="/tmp")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])[cap]["fp8_block"]
    assert got == [f"Fp8MoeBackend.{backend}", experts], got
