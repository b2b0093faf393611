"""Compile-only (no GPU): the fused deepseek_v32 kernels for a CUDA arch with
Triton's compiler (ptxas bundled with Triton). Usage:
    python fused_compile.py ARCH FP8_HW   -> one JSON line of results
Run without TRITON_INTERPRET (test_fused_compile.py runs it in a subprocess)."""
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from vllm.models.deepseek_v32.common import kernels as K  # noqa: E402

INT = {"i32"}


def ptr_type(name, fp8_hw):
    fp8 = "*fp8e4nv" if fp8_hw else "*u8"
    if name in ("pos_ptr", "slot_mapping_ptr", "indexer_slot_mapping_ptr"):
        return "*i64"
    if name == "topk_indices_ptr":
        return "*i32"
    if name in ("indexer_cache_ptr", "mla_cache_ptr", "index_q_fp8_ptr", "mqa_q_fp8_ptr",
                "q_pe_out_ptr"):
        return fp8
    if name in ("indexer_cache_scale_ptr", "mla_cache_ds_scale_ptr", "mla_cache_scale_ptr",
                "q_scale_ptr", "index_weights_out_ptr", "index_k_layer_norm_w_ptr",
                "index_k_layer_norm_bias_ptr", "index_weights_ptr",
                "kpe_rope_cos_sin_cache_ptr", "index_k_rope_cos_sin_cache_ptr",
                "q_pe_cos_sin_ptr", "index_q_cos_sin_ptr"):
        return "*fp32"
    return "*bf16"


def compile_one(fn, constexprs, arch, fp8_hw):
    sig = {}
    for a in fn.arg_names:
        if a in constexprs:
            sig[a] = "constexpr"
        elif a.endswith("_ptr"):
            sig[a] = ptr_type(a, fp8_hw)
        elif "eps" in a or "scale" in a:
            sig[a] = "fp32"
        else:
            sig[a] = "i32"
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                       target=GPUTarget("cuda", arch, 32), options=dict(num_warps=4))
    return len(k.asm.get("cubin", b"")) > 0


def norm_rope_consts(fp8_hw, mla, has_indexer):
    return dict(Q_DIM=1536, Q_BLOCK_SIZE=2048, KV_DIM=512, KPE_HALF_ROT_DIM=32,
                INDEX_K_DIM=128, INDEX_K_BLOCK_SIZE=128, INDEX_K_HALF_ROT_DIM=32,
                INDEXER_CACHE_SHUFFLE=False, INDEXER_CACHE_BLOCK_TILE=16,
                INDEXER_CACHE_HEAD_TILE=16, INDEXER_CACHE_MX_SCALE=False,
                MLA_CACHE_BLOCK_SIZE=64, MLA_CACHE_FP8=mla == "fp8", SKIP_MLA_SCALE=False,
                MLA_CACHE_DS_MLA=mla == "fp8_ds_mla", MLA_CACHE_NVFP4=False,
                MLA_NUM_TILES=4 if mla == "fp8_ds_mla" else 1,
                MLA_TILE_DIM=128 if mla == "fp8_ds_mla" else 1, TOPK=2048,
                TOPK_BLOCK_SIZE=1024, HAS_INDEXER=has_indexer, INDEX_ROPE_INTERLEAVE=True,
                USE_PDL=False, FP8_MAX=448.0, USE_FNUZ=False, FP8_HW=fp8_hw)


def fused_q_consts(fp8_hw, has_indexer):
    return dict(NUM_Q_HEADS=16, Q_PE_HALF_ROT_DIM=32, NUM_INDEX_Q_HEADS=64,
                INDEX_Q_HALF_ROT_DIM=32, INDEX_Q_HEAD_DIM=128, QL_NOPE_DIM=512,
                QL_NOPE_BLOCK=512, HAS_INDEXER=has_indexer, INDEX_ROPE_INTERLEAVE=False,
                QUANTIZE_MQA=True, USE_PDL=False, FP8_MAX=448.0, USE_FNUZ=False,
                FP8_HW=fp8_hw)


def main():
    arch, fp8_hw = int(sys.argv[1]), sys.argv[2] == "1"
    out = []
    for mla in ("fp8", "fp8_ds_mla", "auto"):
        for has_indexer in (True, False):
            case = dict(kernel="fused_norm_rope", mla=mla, has_indexer=has_indexer)
            try:
                case["cubin"] = compile_one(K._fused_norm_rope_kernel,
                                            norm_rope_consts(fp8_hw, mla, has_indexer),
                                            arch, fp8_hw)
            except Exception as e:  # report, the test decides
                case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            out.append(case)
    for has_indexer in (True, False):
        case = dict(kernel="fused_q", has_indexer=has_indexer)
        try:
            case["cubin"] = compile_one(K._fused_q_kernel, fused_q_consts(fp8_hw, has_indexer),
                                        arch, fp8_hw)
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        out.append(case)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
