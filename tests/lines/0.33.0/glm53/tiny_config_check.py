"""Parse the tiny GLM-5.3-Flash checkpoint's config.json (tests/e2e/models/glm53-flash-tiny)
through vLLM 0.33.0's own config path on the CPU: EngineArgs(...).create_model_config() ->
transformers' Glm5NextTextConfig (transformers >= 5.16.1), vLLM's MLA/head-size derivation, and
the layer kinds and top-k buffer width the Glm5Next model reads. Prints JSON.
usage: PYTHONPATH=<tree> python tiny_config_check.py MODEL_DIR"""
import json
import sys

import torchvision_standin  # noqa: F401  (beside this file: see its docstring)
import vllm.model_executor.models.registry as registry
from vllm.engine.arg_utils import EngineArgs

# Stand-in: vLLM inspects the architecture's class in a child interpreter, which would not have
# the torchvision stand-in; here it is inspected in this process.
registry._run_in_subprocess = lambda fn: fn()

model_dir = sys.argv[1]
mc = EngineArgs(model=model_dir, skip_tokenizer_init=True, max_model_len=8192).create_model_config()
hf, text = mc.hf_config, mc.hf_text_config
buffer = ((text.index_topk + text.index_kpool - 1 + 127) // 128) * 128  # get_sparse_topk_buffer_width
print(json.dumps(dict(
    config_class=type(hf).__name__,
    text_config_class=type(text).__name__,
    architectures=list(hf.architectures),
    model_type=text.model_type,
    use_mla=mc.use_mla,
    head_size=mc.get_head_size(),
    dtype=str(mc.dtype),
    layer_types=list(text.layer_types),
    topk_buffer_width=buffer,
    geometry={k: getattr(text, k, None) for k in (
        "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
        "v_head_dim", "mla_use_nope", "index_topk", "index_kpool", "index_n_heads",
        "index_head_dim", "linear_num_heads", "linear_head_dim", "hc_mult", "hc_sinkhorn_iters",
        "num_experts_per_tok", "swiglu_limit", "num_nextn_predict_layers", "mhc")},
)))
