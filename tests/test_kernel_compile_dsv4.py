"""Compile-only check of the DeepSeek-V4 sparse attention kernels for every GPU arch we
serve (CPU, no GPU): `_sparse_mla_dsv4_fp8_kernel` (decode), `_sparse_mla_dsv4_kernel`
(prefill) and `_sparse_mla_dsv4_merge_kernel` of
vllm/v1/attention/ops/triton_sparse_mla_dsv4.py (the series' DeepSeek-V4 attention kernel patch).

For each arch (sm80 86 89 90 100 120 121) the module's own launch plan (`_plan_for`, with
the SM counts of real parts of that arch, as tests/test_kernel_compile_matrix.py does for
the DSA kernel) is enumerated over the heads DeepseekV4TritonAttention pads to (8, 16, 32,
64, 128), decode and prefill token counts, and V4's list widths (sliding window 128; C4
top-k 512; C128 up to 8,192 compressed entries; a prefill's combined list).  Every distinct
attention configuration (BLOCK_H, BLOCK_N, warps, stages, split or not) is compiled as the
layer calls it:
  - decode: the V4 fp8_ds_mla caches read in place (two lists with lengths; the SWA-only
    layer's single list too), bf16 queries, the arch's e4m3 decode (hardware on sm89+,
    software below) and on sm89+ also the forced software decode;
  - prefill: the gathered 16-bit workspace, one list with lengths, bf16 and fp16;
and every merge configuration a split can launch (BLOCK_S, warps), with the pointer and
stride alignment Triton specialises at run time for vLLM's tensors (`ALIGNED`).  Each
kernel must have a cubin and PTX and fit the arch's per-block shared memory; on sm80/86 the
PTX must not hold the hardware e4m3 conversion, on sm89+ with the hardware decode it must;
the fp8 decode's gathered code tiles and scale words must load asynchronously (no synchronous
i8 load in its TTGIR) and reach its dots without one-byte shared loads; its tiles of
wave-filling grids (unsplit, or 32 heads) must prefetch the next tile's rows into L2
(`_fp8_prefetch`), its split 16-head tiles and the prefill must not.
Registers are printed; no attention config may use more than 1 KB of stack (spills).

One child process per arch without TRITON_INTERPRET (the interpreter tests set it for their
whole process).  `python tests/test_kernel_compile_dsv4.py 90` prints one arch's records.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_kernel_compile import (  # noqa: E402
    SMEM_LIMIT,
    ARCHES, _signature, arch_children_fixture, arch_records, assert_compiled, finish_record)
from test_kernel_compile_matrix import SMS  # noqa: E402

REL = "vllm/v1/attention/ops/triton_sparse_mla_dsv4.py"
PADDED_HEADS = (8, 16, 32, 64, 128)  # DeepseekV4TritonAttention.get_padded_num_q_heads
TOKENS = sorted({2 ** i for i in range(15)} | {3, 24, 96, 200, 3000})
# (K1, K2): SWA-only decode, C4 decode, C128 decode (up to 1M tokens / 128), prefill lists
LISTS = ((128, 0), (128, 512), (128, 128), (128, 8192), (640, 0), (2688, 0), (10240, 0))
# Run-time 16-byte divisibility of vLLM's tensors: q / out [T, H, 512] 16-bit rows, the
# split-K scratch, the caches (blocks of 64 x 584 B padded to a multiple of 576 B; C128's
# 2-entry blocks 1,728 B) and the gathered workspace's 512-element rows.  The index lists'
# row strides are not marked: a prefill's combined list width need not be a multiple of 4.
ALIGNED = {"q_ptr", "out_ptr", "part_ptr", "kv1_ptr", "kv2_ptr", "kv_ptr", "stride_q_t",
           "stride_q_h", "stride_o_t", "stride_o_h", "stride_kv1", "stride_kv2", "stride_kv"}


GPU = SimpleNamespace(type="cuda")  # the launcher's q.device on an NVIDIA GPU (PTX)
# A [rows, cols] tile of e4m3 codes loaded synchronously (not by the pipeliner's async copies).
SYNC_CODE_LOAD = re.compile(r"tt\.load [^\n]*: tensor<\d+x\d+x!tt\.ptr<i8>")
# A [rows] vector of bytes loaded synchronously: the scale bytes, read one per lane, wait in the
# loop step (too narrow for an asynchronous copy).
SYNC_BYTE_LOAD = re.compile(r"tt\.load [^\n]*: tensor<\d+x!tt\.ptr<i8>")
# p's trips through shared memory in the fp8 decode: a [BLOCK_H, BLOCK_N] 16-bit tensor in the
# dots' accumulator layout stored for a value dot's operand (warps split the score dot's columns).
P_STORES = re.compile(r"ttg\.local_alloc %\S+ : \(tensor<\d+x\d+x(?:f16|bf16), #mma")
# The pipeliner's buffers of the gathered row tiles (the leading dim of its [buffers, rows, cols]
# allocations), recorded only: with one, the next step's copy starts after the step's last dot
# and each step waits for its own rows (bench/results/gather-buffers-2026-12-06/).
ROW_BUFFERS = re.compile(r"ttg\.local_alloc [^\n]*!ttg\.memdesc<(\d+)x\d+x\d+x")


def _attrs(fn) -> dict:
    return {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a in ALIGNED}


def plans(mod, arch: int, fp8: bool):
    """(attention configs, merge configs) `_plan_for` can launch on `arch` for the fp8 decode
    kernel (fp8) or the 16-bit one."""
    fwd, merge = set(), set()
    for sms in SMS[arch]:
        for H in PADDED_HEADS:
            for T in TOKENS:
                for K1, K2 in LISTS:
                    p = mod._plan_for(sms, T, H, K1, K2, None, None, None, fp8=fp8,
                                      capability=(arch // 10, arch % 10))
                    split = p["num_splits"] > 1
                    fwd.add((p["BLOCK_H"], p["BLOCK_N"], p["num_warps"], p["num_stages"], split))
                    if split:
                        m = mod._merge_config(p["num_splits"])
                        merge.add((m["BLOCK_S"], m["num_warps"]))
    return sorted(fwd), sorted(merge)


def compile_dsv4(arch: int) -> list[dict]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from conftest import default_tree
    from sparse_mla_reference import load_tree_module

    mod = load_tree_module(default_tree(), REL, "smla_dsv4_compile")
    target = GPUTarget("cuda", arch, 32)
    cap = (arch // 10, arch % 10)
    fwd_cfgs = {fp8: plans(mod, arch, fp8)[0] for fp8 in (False, True)}
    merge_cfgs = sorted(set(plans(mod, arch, False)[1]) | set(plans(mod, arch, True)[1]))
    # (name, dtype, fp8 cache, hardware e4m3, list 2 present)
    variants = [("decode", "bf16", True, arch >= 89, True),
                ("decode-swa", "bf16", True, arch >= 89, False),
                ("prefill", "bf16", False, False, False),
                ("prefill", "fp16", False, False, False)]
    if arch >= 89:
        variants.append(("decode", "bf16", True, False, True))
    out = []
    for name, dt, fp8, hw, two in variants:
        for bh, bn, warps, stages, split in fwd_cfgs[fp8]:
            if fp8:
                fn = mod._sparse_mla_dsv4_fp8_kernel
                cst = dict(BS1=64, BS2=64, HAS_LEN1=True, HAS_LEN2=two,
                           HAS_SINK=True, BLOCK_H=bh, BLOCK_N=bn, SPLIT=split, FP8_HW=hw,
                           PACKED=True, SPLIT_SCORES=mod._split_scores(cap, bh, warps),
                           PREFETCH=mod._fp8_prefetch(GPU, dict(num_splits=2 if split else 1,
                                                                BLOCK_H=bh)))
                ptrs = dict(q_ptr="dt", out_ptr="dt", part_ptr="fp32", sink_ptr="fp32",
                            idx1_ptr="i32", len1_ptr="i32", kv1_ptr="u8", idx2_ptr="i32",
                            len2_ptr="i32", kv2_ptr="u8")
            else:
                fn = mod._sparse_mla_dsv4_kernel
                cst = dict(HAS_LEN=True, HAS_SINK=True, BLOCK_H=bh, BLOCK_N=bn, SPLIT=split,
                           SPLIT_SCORES=mod._split_scores(cap, bh, warps))
                ptrs = dict(q_ptr="dt", out_ptr="dt", part_ptr="fp32", sink_ptr="fp32",
                            idx_ptr="i32", len_ptr="i32", kv_ptr="dt")
            sig = _signature(fn, dt, ptrs, set(cst), float_names=("qk_scale",))
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cst, attrs=_attrs(fn)),
                               target=target, options=dict(num_warps=warps, num_stages=stages))
            rec = dict(arch=arch, kernel="fwd", call=name, dtype=dt, fp8_cache=fp8,
                       decode=("hw" if hw else "sw") if fp8 else "-", BLOCK_H=bh, BLOCK_N=bn,
                       num_warps=warps, num_stages=stages, split=split,
                       shared=int(k.metadata.shared),
                       sync_code_loads=len(SYNC_CODE_LOAD.findall(k.asm["ttgir"])),
                       sync_byte_loads=len(SYNC_BYTE_LOAD.findall(k.asm["ttgir"])),
                       l2_prefetches=k.asm["ptx"].count("prefetch.global.L2"),
                       p_stores=len(P_STORES.findall(k.asm["ttgir"])),
                       row_buffers=max(map(int, ROW_BUFFERS.findall(k.asm["ttgir"])), default=0))
            out.append(finish_record(rec, k))
    merge = mod._sparse_mla_dsv4_merge_kernel
    for dt in ("bf16", "fp16"):
        msig = _signature(merge, dt, dict(part_ptr="fp32", sink_ptr="fp32", out_ptr="dt"),
                          {"HAS_SINK", "BLOCK_S"})
        for block_s, warps in merge_cfgs:
            k = triton.compile(ASTSource(fn=merge, signature=msig,
                                         constexprs=dict(HAS_SINK=True, BLOCK_S=block_s),
                                         attrs=_attrs(merge)),
                               target=target, options=dict(num_warps=warps, num_stages=1))
            rec = dict(arch=arch, kernel="merge", dtype=dt, BLOCK_S=block_s, num_warps=warps,
                       shared=int(k.metadata.shared))
            out.append(finish_record(rec, k))
    return out


children = arch_children_fixture(__file__)


@pytest.mark.parametrize("arch", ARCHES)
def test_every_dsv4_config_compiles(children, arch):
    recs = arch_records(children, arch)
    fwd = [x for x in recs if x["kernel"] == "fwd"]
    # decode (split) and prefill (no split) plans, both head tiles, every call variant
    assert any(x["split"] for x in fwd) and any(not x["split"] for x in fwd)
    # 64 heads in one 8-warp tile only where the warpgroups split the scores (sm90, prefill)
    assert {x["BLOCK_H"] for x in fwd} == ({16, 32, 64} if arch == 90 else {16, 32})
    assert all((x["BLOCK_H"] == 64) == (x["num_warps"] == 8) for x in fwd)
    assert all(not x["fp8_cache"] and not x["split"] for x in fwd if x["BLOCK_H"] == 64)
    kinds = {(x["call"], x["dtype"], x["decode"]) for x in fwd}
    want = {("decode", "bf16", "hw" if arch >= 89 else "sw"),
            ("decode-swa", "bf16", "hw" if arch >= 89 else "sw"),
            ("prefill", "bf16", "-"), ("prefill", "fp16", "-")}
    if arch >= 89:
        want.add(("decode", "bf16", "sw"))
    assert kinds == want, kinds
    # the fp8 decode's own plan, under every Triton: 16 heads x 32 rows on 4 warps, three stages
    # (the index loads in a stage of their own), or 32 heads on two; each of its gathered code
    # tiles reaches shared memory by asynchronous copies (Triton 3.8 loaded them synchronously,
    # byte by byte, when the row pointers were a select between two pointer tensors: 1.3-1.8x
    # the time on the H200)
    fp8 = [x for x in fwd if x["fp8_cache"]]
    assert {(x["BLOCK_H"], x["BLOCK_N"], x["num_warps"], x["num_stages"]) for x in fp8} == {
        (16, 32, 4, 3), (32, 32, 4, 2)}
    assert all(x["sync_code_loads"] == 0 for x in fp8), [
        (x["call"], x["BLOCK_H"], x["sync_code_loads"]) for x in fp8]
    # and each row's scale bytes arrive as two int32 words by asynchronous copies too (as
    # bytes they were 14-28 synchronous loads per step, waited on in the step)
    assert all(x["sync_byte_loads"] == 0 for x in fp8), [
        (x["call"], x["BLOCK_H"], x["sync_byte_loads"]) for x in fp8]
    # and each code tile is converted once, pinned to the layout of its 16-byte loads, and
    # reaches both dots as float16 through shared memory (converted twice, the value dot's
    # copy read its codes byte by byte: 112 one-byte shared loads per step)
    assert all(x["shared_byte_loads"] == 0 for x in fp8), [
        (x["call"], x["BLOCK_H"], x["shared_byte_loads"]) for x in fp8]
    # and p reaches the value dots through shared memory twice per step: once in float16 for
    # every NoPE tile (their codes carry the scale factors), once in the query's dtype for the
    # RoPE tile (with p * scale / u per tile it went once per tile: 8 trips per step)
    assert all(x["p_stores"] <= 2 for x in fp8), [
        (x["call"], x["BLOCK_H"], x["p_stores"]) for x in fp8]
    # fp8 decodes prefetch the next tile's rows into L2 where the 16-head grid fills a wave
    # (unsplit, or 32 heads), not in split 16-head tiles; the 16-bit prefill never
    assert all((x["l2_prefetches"] > 0) == (not x["split"] or x["BLOCK_H"] == 32)
               for x in fp8), [
        (x["call"], x["BLOCK_H"], x["split"], x["l2_prefetches"]) for x in fp8]
    assert all(x["l2_prefetches"] == 0 for x in fwd if not x["fp8_cache"])
    # the prefill's own plan: 4 warps, two stages (gathers as asynchronous copies), 64-row
    # tiles unsplit where shared memory holds them (not the ~99 KB parts), else 32; on sm90
    # 64 heads unsplit in one 64 x 64-row tile on 8 warps
    pre = {(x["BLOCK_N"], x["num_warps"], x["num_stages"], x["split"]) for x in fwd
           if not x["fp8_cache"]}
    wide = SMEM_LIMIT[arch] > 102_656
    want = {(64, 4, 2), (32, 4, 2)} if wide else {(32, 4, 2)}
    assert {(n, w, st) for n, w, st, _ in pre} == want | ({(64, 8, 2)} if arch == 90 else set()), pre
    assert all(n == 32 for n, _, _, split in pre if split), pre
    big_stack = [(x["call"], x["BLOCK_H"], x["BLOCK_N"], x.get("sass_stack")) for x in fwd
                 if x.get("sass_stack", 0) > 1024]
    assert not big_stack, big_stack
    assert any(x["kernel"] == "merge" for x in recs)
    assert_compiled(recs)
    for x in fwd:
        if x["fp8_cache"]:
            # the software decode never emits the hardware conversion; the hardware one does
            assert (x["e4m3_cvt"] > 0) == (x["decode"] == "hw"), x


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    for rec in compile_dsv4(int(sys.argv[1])):
        print(json.dumps(rec))
