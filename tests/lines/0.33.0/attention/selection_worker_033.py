"""Child process: vLLM 0.33.0's own attention-backend selector, for one source tree, over the
sparse-MLA selection matrix; prints one JSON line per cell after the marker line.

Usage: python selection_worker_033.py TREE STANDINS_PY > out
TREE is put first on sys.path; STANDINS_PY is the toolkit's tools/smla/_selection_standins.py
(loaded by path): empty modules for the official wheel's compiled extensions, CUDA tensor
factories -> meta, vllm.platforms resolving to CudaPlatform with the capability of each cell.
Also stood in here, the same in both trees ("the official CUDA wheel with its CUDA
requirements installed"):
- model_config: SimpleNamespace(hf_config, hf_text_config, dtype, use_mla, rswa_window=None,
  get_num_attention_heads) with the preset's MLA geometry and index_topk;
- FlashInfer (a CUDA requirement of vLLM 0.33.0): has_flashinfer / has_flashinfer_sparse_mla_sm120
  answer True, so FLASHINFER_MLA_SPARSE(_SM120/_SM90) are refused only by their own rules;
- FlashAttention-3 MLA (the wheel's _vllm_fa3_C): flash_attn_supports_mla answers
  capability.major == 9, as the wheel's build does; FA4's cute-DSL entry point answers available.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
import types

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
MARKER = "@@SELECTION@@"

PRESETS = {
    # DeepSeek-V3.2: 128 heads (per GPU: 8..128 with TP), qk_nope 128, v 128
    "deepseek-v3.2": dict(model_type="deepseek_v32", kv_lora_rank=512, qk_nope_head_dim=128,
                          qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536),
    # GLM-5 / 5.1 / 5.2 (glm_moe_dsa): 64 heads, qk_nope 192, v 256
    "glm-5": dict(model_type="glm_moe_dsa", kv_lora_rank=512, qk_nope_head_dim=192,
                  qk_rope_head_dim=64, v_head_dim=256, q_lora_rank=2048),
    # GLM-5.3-Flash (glm5_next): 64 heads (per GPU: 8..64 with TP), NoPE: qk_rope 0, so the
    # selector gets head size kv_lora_rank + 0 = 512
    "glm-5.3-flash": dict(model_type="glm5_next", kv_lora_rank=512, qk_nope_head_dim=256,
                          qk_rope_head_dim=0, v_head_dim=256, q_lora_rank=2048),
}
# Heads per GPU of each preset (its attention heads divided by TP 1..8 or 16).
PRESET_HEADS = {"deepseek-v3.2": [8, 16, 64, 128], "glm-5": [8, 16, 64, 128],
                "glm-5.3-flash": [8, 16, 32, 64]}
CAPABILITIES = ["8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "12.1"]
DTYPES = ["float16", "bfloat16"]
KV_CACHE_DTYPES = ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_ds_mla"]
TOPKS = [2048, 1024]


def head_size(preset: str) -> int:
    """What MLAAttention passes the selector: kv_lora_rank + qk_rope_head_dim (576; NoPE 512)."""
    return PRESETS[preset]["kv_lora_rank"] + PRESETS[preset]["qk_rope_head_dim"]


def cells():
    for p in PRESETS:
        for cc, d, kv, h, k in itertools.product(CAPABILITIES, DTYPES, KV_CACHE_DTYPES,
                                                 PRESET_HEADS[p], TOPKS):
            yield dict(preset=p, capability=cc, dtype=d, kv_cache_dtype=kv, heads=h,
                       index_topk=k)


def main() -> int:
    tree, standins_py = sys.argv[1], sys.argv[2]
    spec = importlib.util.spec_from_file_location("_smla_selection_standins", standins_py)
    st = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = st
    spec.loader.exec_module(st)
    stand_ins = st.import_vllm_tree(tree, capability="9.0")

    import torch

    import vllm.utils.flashinfer as fi
    from vllm.config import AttentionConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.attention import mla_attention
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends import fa_utils

    fi.has_flashinfer = lambda: True
    fi.has_flashinfer_sparse_mla_sm120 = lambda: True
    from vllm.platforms import current_platform

    fa_utils.flash_attn_supports_mla = lambda: current_platform.get_device_capability().major == 9
    try:
        from vllm.v1.attention.backends.mla import flashattn_mla_sparse as fas

        fas.flash_attn_supports_mla = fa_utils.flash_attn_supports_mla
        fas._fa4_cute_mla_available = lambda: None
    except ImportError:
        pass
    canon = mla_attention._canonicalize_sparse_mla_kv_cache_dtype

    out = [MARKER]
    for c in cells():
        st.set_capability(c["capability"])
        dtype = getattr(torch, c["dtype"])
        hf = types.SimpleNamespace(**PRESETS[c["preset"]], index_topk=c["index_topk"],
                                   num_attention_heads=c["heads"])
        model_config = types.SimpleNamespace(
            hf_config=hf, hf_text_config=hf, dtype=dtype, use_mla=True, rswa_window=None,
            max_model_len=8192,
            get_num_attention_heads=lambda parallel_config, h=c["heads"]: h)
        vllm_config = VllmConfig(attention_config=AttentionConfig(backend=None))
        object.__setattr__(vllm_config, "model_config", model_config)
        selector._cached_get_attn_backend.cache_clear()
        res = dict(c)
        with set_current_vllm_config(vllm_config):
            try:
                cls = selector.get_attn_backend(
                    head_size=head_size(c["preset"]), dtype=dtype, kv_cache_dtype=c["kv_cache_dtype"],
                    use_mla=True, use_sparse=True, num_heads=c["heads"])
                res["selected"] = cls.get_name()
                res["kv_cache_dtype_used"] = canon(cls, c["kv_cache_dtype"])
                res["error"] = None
            except ValueError as e:
                res["selected"], res["kv_cache_dtype_used"], res["error"] = None, None, str(e)
        out.append(json.dumps(res, sort_keys=True))
    out.append(json.dumps({"stand_ins": stand_ins}))
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
