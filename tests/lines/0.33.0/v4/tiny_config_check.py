"""Parse the tiny DeepSeek-V4 checkpoint's config.json (tests/e2e/models/
deepseek-v4-tiny, generator of the 0.26.0 line) through vLLM 0.33.0's own config path on the CPU:
EngineArgs(...).create_model_config() -> transformers' DeepseekV4Config, vLLM's quantization
resolution (DeepseekV4FP8Config), get_compress_ratios, and the geometry the V4 layers read.
Prints JSON. usage: PYTHONPATH=<tree> python tiny_config_check.py MODEL_DIR"""
import json
import sys

from vllm.engine.arg_utils import EngineArgs
from vllm.transformers_utils.deepseek_v4_utils import get_compress_ratios

model_dir = sys.argv[1]
args = EngineArgs(model=model_dir, skip_tokenizer_init=True, max_model_len=1024,
                  kv_cache_dtype="fp8")
mc = args.create_model_config()
hf = mc.hf_config
out = dict(
    config_class=type(hf).__name__,
    architectures=list(hf.architectures),
    model_type=hf.model_type,
    quantization=mc.quantization,
    dtype=str(mc.dtype),
    compress_ratios=get_compress_ratios(hf),
    geometry={k: getattr(hf, k, None) for k in (
        "head_dim", "qk_rope_head_dim", "num_attention_heads", "o_groups", "o_lora_rank",
        "q_lora_rank", "index_n_heads", "index_head_dim", "index_topk", "hc_mult",
        "sliding_window", "num_nextn_predict_layers", "num_hidden_layers")},
)
print(json.dumps(out))
