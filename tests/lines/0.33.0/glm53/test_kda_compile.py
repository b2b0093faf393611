"""Compile-only (Triton 3.8's compiler and bundled ptxas, no GPU): every Triton launch of
GLM-5.3-Flash's KDA layer (prefill chunk path, plain and MTP decode of the recurrent kernel, the
gated RMSNorm), recorded from the layer's own entry points at the model's geometry, builds a cubin
for sm80-sm121 within each arch's per-block shared memory (kda_compile.py says how). Of each
autotune list the first and the last config are compiled (kda_compile.py --all-configs: all)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# the kernels common/kda.py reaches on CUDA with kda_prefill_backend "triton" (FlashKDA is the
# sm90/sm100/sm120 CUDA alternative; below sm90 this is the only path)
KERNELS = {
    "l2norm_fwd_kernel2", "kda_gate_cumsum_fwd_kernel",
    "chunk_kda_scaled_dot_kkt_fwd_kernel_intra_sub_inter",
    "chunk_kda_scaled_dot_kkt_fwd_kernel_intra_sub_intra", "merge_16x16_to_64x64_inverse_kernel",
    "recompute_w_u_fwd_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
    "chunk_gla_fwd_kernel_o", "fused_recurrent_gated_delta_rule_fwd_kernel",
    "layer_norm_gated_fwd_kernel",
    "_fused_eh_norm_kernel",  # the MTP layer's enorm/hnorm
}


def compile_report(arch: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(HERE / "kda_compile.py"), str(arch)],
                       capture_output=True, text=True, env=env, timeout=1500, cwd="/tmp")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", [80, 86, 89, 90, 100, 120, 121])
def test_kda_launches_compile(arch):
    rep = compile_report(arch)
    recs = rep["launches"]
    assert {r["kernel"] for r in recs} == KERNELS, sorted({r["kernel"] for r in recs})
    bad = [r for r in recs if not r.get("cubin")]
    assert not bad, bad
    over = [r for r in recs if r["shared"] > rep["smem_limit"]]
    assert not over, over
    # decode: the plain and the MTP (spec) launch of the recurrent kernel both recorded
    assert sum(r["kernel"] == "fused_recurrent_gated_delta_rule_fwd_kernel" for r in recs) == 2
