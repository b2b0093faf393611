"""The tiny GLM-5.3-Flash checkpoint's config.json (tests/e2e/models/glm53-flash-tiny) through
vLLM 0.33.0's own config path on the CPU (tiny_config_check.py in a subprocess): transformers'
Glm5NextTextConfig, MLA with head size 512 (NoPE), the KDA/DSA layer interleave of the real
config, and the geometry the Glm5Next layers read (64 heads, top-k 2048, kpool 4 -> top-k
buffer 2176, KDA 64 x 128, mHC 4 streams, top-8, MTP 1). Weights: load_check (README)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import TREE

HERE = Path(__file__).parent
TINY = Path(__file__).resolve().parents[3] / "e2e" / "models" / "glm53-flash-tiny"
# GLM-5.3-Flash's geometry that decides kernels (Glm5NextTextConfig's defaults where the
# released model has them, the kpool/index heads of vLLM's tests and comments)
REAL = {"num_attention_heads": 64, "kv_lora_rank": 512, "qk_nope_head_dim": 256,
        "qk_rope_head_dim": 0, "v_head_dim": 256, "mla_use_nope": True, "index_topk": 2048,
        "index_kpool": 4, "index_n_heads": 16, "index_head_dim": 128, "linear_num_heads": 64,
        "linear_head_dim": 128, "hc_mult": 4, "hc_sinkhorn_iters": 20, "num_experts_per_tok": 8,
        "swiglu_limit": 10.0, "num_nextn_predict_layers": 1, "mhc": True}


def test_tiny_config_parses_with_033(tmp_path):
    shutil.copy(TINY / "config.json", tmp_path / "config.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(TREE)]))
    proc = subprocess.run([sys.executable, str(HERE / "tiny_config_check.py"), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["config_class"], got["text_config_class"]) == ("Glm5NextConfig", "Glm5NextTextConfig")
    assert got["model_type"] == "glm5_next_text"
    assert got["architectures"] == ["Glm5NextForCausalLM"]
    assert got["use_mla"] and got["head_size"] == 512
    assert got["dtype"] == "torch.bfloat16"
    assert got["topk_buffer_width"] == 2176
    assert got["geometry"] == REAL
    kinds = got["layer_types"]
    assert kinds == ["linear_attention"] * 3 + ["deepseek_sparse_attention"] \
        + ["linear_attention"] * 3 + ["deepseek_sparse_attention"]
