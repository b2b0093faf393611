"""Compile-only (no GPU): GLM-5.3-Flash's pooled-indexer kernels for a CUDA
arch with Triton's compiler (ptxas bundled with Triton). Usage:
    python kpool_compile.py ARCH:FP8_HW ...   -> one JSON line: {"ARCH:FP8_HW": [results]}
- the kpool kernels (vllm/models/glm5next/nvidia/ops/kpool_compress.py):
  fwht128_quant_fp8's, the prefill and decode pooled-key writers (fp8
  pointers with FP8_HW, uint8 without) at both kpool page sizes, and the
  fp8-free tail-seed and pool-expansion kernels;
- the Triton logits (vllm/v1/attention/ops/triton_dsa_indexer.py) with the
  pooled geometry: 16 heads, pages of 32 and 64 pools, next_n 1 and 2, the
  wrappers' launch configs; fp8 tensor-core dots only with FP8_HW (sm89+),
  static shared memory reported against the arch's per-block limit.
Run without TRITON_INTERPRET (test_kpool_compile.py runs it in a subprocess
with PYTHONPATH = the tree and the toolkit's tests/)."""
import json
import os
import sys
import types
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import vllm.models  # noqa: E402

# The package's __init__ imports the whole model (torchvision for its
# multimodal part); only the kernels are compiled here.
_pkg = types.ModuleType("vllm.models.glm5next")
_pkg.__path__ = [str(Path(vllm.models.__file__).parent / "glm5next")]
sys.modules[_pkg.__name__] = vllm.models.glm5next = _pkg

from indexer_reference import SMEM_LIMIT  # noqa: E402
from vllm.models.glm5next.nvidia.ops import kpool_compress as K  # noqa: E402
from vllm.v1.attention.ops import triton_dsa_indexer as L  # noqa: E402

D, KPOOL, H = 128, 4, 16


def compile_one(fn, types_of, constexprs, arch, num_warps=4, num_stages=2):
    sig = {a: "constexpr" if a in constexprs else types_of.get(a, "i32")
           for a in fn.arg_names}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                       target=GPUTarget("cuda", arch, 32),
                       options=dict(num_warps=num_warps, num_stages=num_stages))
    return dict(cubin=len(k.asm.get("cubin", b"")) > 0, shared=int(k.metadata.shared))


def kpool_cases(fp8_hw):
    fp8 = "*fp8e4nv" if fp8_hw else "*u8"
    writer = dict(HEAD_DIM=D, ROUND_SCALE=True, MX_SCALE=False, BLOCK_D=D, FP8_HW=fp8_hw)
    yield "fwht128_quant", K._fwht_quant_kernel, {
        "q_ptr": "*bf16", "qout_ptr": fp8, "sout_ptr": "*fp32"}, dict(
        BLOCK_R=32, FP8_HW=fp8_hw), 2
    for page in (32, 64):
        yield f"compress_write page {page}", K._kpool_softmax_rotate_write_cache_kernel, {
            "buf_fp8_ptr": fp8, "buf_fp32_ptr": "*fp32", "slot_k_ptr": "*bf16",
            "slot_score_ptr": "*bf16", "ape_ptr": "*fp32", "loc_ptr": "*i64",
            "write_mask_ptr": "*i1", "compressed_k_ptr": fp8,
            "compressed_scale_ptr": "*fp32"}, dict(
            writer, PAGE_SIZE=page, BUF_NUMEL_PER_PAGE=page * (D + 4), POOL_SIZE=KPOOL,
            S_OFFSET_NBYTES_IN_PAGE=page * D, HAS_WRITE_MASK=True,
            RETURN_COMPRESSED=False, WRITE_CACHE=True), 4
        ring = 8  # kpool 4 with one to four speculative tokens
        yield f"decode_update page {page}", K._kpool_decode_update_batched_kernel, {
            "buf_fp8_ptr": fp8, "buf_fp32_ptr": "*fp32", "tail_kv_ptr": "*bf16",
            "tail_slot_mapping_ptr": "*i32", "key_ptr": "*bf16", "slot_score_ptr": "*bf16",
            "ape_ptr": "*fp32", "slot_mapping_ptr": "*i32", "positions_ptr": "*i32"}, dict(
            writer, PAGE_SIZE=page, BUF_NUMEL_PER_PAGE=page * (D + 4), POOL_SIZE=KPOOL,
            RING=ring, TAIL_BLOCK_ELEMS=2 * ring * D, KPOOL_HEAD=ring * D,
            S_OFFSET_NBYTES_IN_PAGE=page * D), 4
    if not fp8_hw:  # no fp8 in these two
        yield "tail_seed", K._kpool_tail_seed_kernel, {
            "key_ptr": "*bf16", "score_ptr": "*bf16", "tslot_ptr": "*i64",
            "tail_ptr": "*bf16"}, dict(TAIL_BLOCK_ELEMS=2 * 8 * D, KPOOL_HEAD=8 * D,
                                       HEAD_DIM=D, KPOOL=KPOOL, RING=8, BLOCK_D=D), 4
        yield "expand_pools_and_append_tail", K._expand_pools_and_append_tail_kernel, {
            "pool_ids_ptr": "*i64", "seq_lens_ptr": "*i32", "out_ptr": "*i32"}, dict(
            POOL_SIZE=KPOOL, BLOCK_COLS=128), 4


LOGITS_PTRS = {"q_ptr": "*u8", "k_ptr": "*u8", "kv_ptr": "*u8", "k_scale_ptr": "*fp32",
               "w_ptr": "*fp32", "ks_ptr": "*i32", "ke_ptr": "*i32", "ctx_ptr": "*i32",
               "bt_ptr": "*i32", "out_ptr": "*fp32"}


def logits_cases(mma):
    cfg = dict(L._PREFILL_CFG)
    qrows, block_n = cfg.pop("QROWS"), cfg.pop("BLOCK_N")
    yield "prefill logits", L._mqa_logits_kernel, dict(
        H=H, D=D, QROWS=qrows, BLOCK_N=block_n, CLEAN=False, FP8_MMA=mma, PACKED=True), cfg
    for page, next_n in ((32, 2), (64, 1)):
        cfg = dict(L._DECODE_CFG)
        block_n = cfg.pop("BLOCK_N")
        yield f"paged logits page {page} next_n {next_n}", L._paged_mqa_logits_kernel, dict(
            H=H, D=D, NEXT_N=next_n, ROWS=triton.next_power_of_2(next_n), CTX_2D=True,
            PAGE=page, BLOCK_N=block_n, CLEAN=False, FP8_MMA=mma, PACKED=True), cfg


def report(arch, fp8_hw):
    out = []
    for name, fn, types_of, cst, warps in kpool_cases(fp8_hw):
        case = dict(kernel=name, FP8_HW=fp8_hw)
        try:
            case.update(compile_one(fn, types_of, cst, arch, num_warps=warps))
        except Exception as e:  # report, the test decides
            case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        out.append(case)
    for name, fn, cst, cfg in logits_cases(fp8_hw):
        case = dict(kernel=name, FP8_MMA=fp8_hw, smem_limit=SMEM_LIMIT.get(arch))
        try:
            case.update(compile_one(fn, LOGITS_PTRS, cst, arch, **cfg))
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        out.append(case)
    return out


def main():
    res = {}
    for spec in sys.argv[1:]:
        arch, hw = spec.split(":")
        res[spec] = report(int(arch), hw == "1")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
