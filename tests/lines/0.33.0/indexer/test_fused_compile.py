"""Compile-only (Triton 3.8's compiler and bundled ptxas, no GPU): the fused
deepseek_v32 kernels build for sm80/sm86 on the software e4m3 encode (uint8
views), for every MLA cache kind with and without an indexer (GLM-5.2 skip
layers); with upstream's fp8e4nv pointers and conversions they do not (the
0.33.0 failure this series fixes); sm89/sm90 keep the hardware path."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TREE

HERE = Path(__file__).resolve().parent


def compile_report(arch: int, fp8_hw: bool) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(TREE)
    r = subprocess.run([sys.executable, str(HERE / "fused_compile.py"), str(arch),
                        "1" if fp8_hw else "0"], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", [80, 86])
def test_software_encode_compiles_below_sm89(arch):
    recs = compile_report(arch, fp8_hw=False)
    assert len(recs) == 8
    assert all(r.get("cubin") for r in recs), recs


def test_hardware_encode_does_not_compile_on_sm80():
    recs = compile_report(80, fp8_hw=True)
    assert all("fp8e4nv not supported" in r.get("error", "") for r in recs), recs


@pytest.mark.parametrize("arch", [89, 90])
def test_hardware_encode_compiles_from_sm89(arch):
    recs = compile_report(arch, fp8_hw=True)
    assert all(r.get("cubin") for r in recs), recs
