"""The tiny GLM-5.3-Flash checkpoint (tests/e2e/models/glm53-flash-tiny/make_checkpoint.py)
loaded into vLLM 0.33.0's own Glm5NextForCausalLM / Glm5NextMTP on the CPU by its
cpu_load_check.py (config + MTP draft, both models built, every parameter byte written by
load_weights, every checkpoint tensor read), against the line's patched tree:

- sm90 with DeepGEMM counted as installed (the upstream path builds there): the generator's
  names and shapes are the ones vLLM reads, whatever the series' sm8x state;
- sm86 (RTX 3090): the series' portable path must be what the model builds (TRITON_MLA_SPARSE
  for the NoPE head 512, the Triton pooled-indexer logits of patch 0015, the torch mHC ops of
  patch 0016); pristine 0.33.0 stops there at the kpool op's DeepGEMM check."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TREE

E2E = Path(__file__).resolve().parents[3] / "e2e"
CHECK = E2E / "models" / "glm53-flash-tiny" / "cpu_load_check.py"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("glm53") / "ckpt"
    subprocess.run([sys.executable, str(E2E / "models/glm53-flash-tiny/make_checkpoint.py"),
                    str(out)], check=True, capture_output=True, timeout=900)
    return out


def load(ckpt, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                          "VLLM_TARGET_DEVICE")}
    env["PYTHONPATH"] = str(TREE)
    proc = subprocess.run([sys.executable, str(CHECK), str(ckpt), *args], env=env,
                          capture_output=True, text=True, timeout=1800, cwd="/tmp")
    return proc.returncode, proc.stdout + proc.stderr


def test_checkpoint_loads_upstream_path_sm90(ckpt):
    rc, out = load(ckpt, "--capability", "9.0", "--assume-deep-gemm")
    assert rc == 0 and "ALL OK (9 checks)" in out, out[-4000:]
    assert "every checkpoint tensor read (633)" in out


def test_checkpoint_loads_portable_path_sm86(ckpt):
    rc, out = load(ckpt, "--capability", "8.6")
    assert "GLM-5.3 mHC kernels: torch" in out, out[-3000:]
    assert rc == 0 and "ALL OK (9 checks)" in out, out[-4000:]
    kernels = re.search(r"^kernels: (.*)$", out, re.M).group(1)
    assert '"attention": ["TritonMLASparseImpl"]' in kernels, kernels
    assert '"indexer_logits": ["triton"]' in kernels, kernels
    assert '"mhc_pre": ["mhc_pre_torch"]' in kernels, kernels
