"""Compile-only check of EVERY launch configuration the heuristic can choose,
for every GPU arch we serve (CPU, no GPU; complements test_kernel_compile.py,
which compiles one prefill-sized configuration per arch).

For each arch (sm80 86 89 90 100 120 121) the launch plan of
`sparse_mla_fwd` (the module's own `_plan`, with the device query replaced by
the arch's capability and the SM counts of real parts of that arch) is
enumerated over heads 1..128, tokens 1..16384 (decode, split-K, prefill) and
top-k 512/1024/2048.  Every distinct attention configuration (BLOCK_H,
BLOCK_N, BLOCK_DV, warps, stages, split or not, PDL on sm90+ when split) is
compiled for:
  - a 16-bit cache: bf16 and fp16,
  - the fp8_ds_mla cache: bf16 and fp16 queries, with the arch's default
    decode (hardware e4m3 conversion on sm89+, software decode below), and on
    sm89+ also the forced software decode (fp8_hw=False) with bf16,
and, for NoPE models (GLM-5.3-Flash: head size 512, no rope part, D_PE = 0),
every configuration the heuristic picks for its heads per GPU (8..64) and its
2176-wide top-k buffer, for the same cache variants; and every split-K merge
configuration it can launch (BLOCK_S, warps, PDL) for bf16/fp16 outputs, all with the pointer/stride alignment Triton's JIT
specializes at run time for vLLM's tensors (it decides whether the gathers
become pipelined async copies, and so the shared memory; without it the
16-bit kernel's 32-head tiles seemed to fit the ~99 KB parts and did not).
Each compiled kernel must have a cubin and PTX, fit the arch's per-block
shared memory and keep its stack frame (spills) within MAX_STACK_BYTES;
registers are reported (printed).

Runs one child process per arch without TRITON_INTERPRET (the interpreter
tests set it process-wide), as many at once as there are CPUs.  `python
tests/test_kernel_compile_matrix.py 86` prints the records of one arch as JSON
lines.  About 1-2 minutes per arch on one free core.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_kernel_compile import (  # noqa: E402
    ARCHES, _signature, arch_children_fixture, arch_records, assert_compiled,
    finish_record)

# SM counts of real parts per arch (the heuristic's split-K and tile choices
# depend on it): A100 108, A30 56, A2 ~14 (as a small part); A6000 84, 3090 82,
# A10 72, A2 10; L40(S) 142, 4090 128, L4 58, 4060 24; H100 SXM 132, PCIe 114,
# H20 78; B200 148, B300 160; 5090 170, RTX PRO 6000 188, 5070 48 / 36;
# GB10 (DGX Spark) 48.
SMS = {80: (108, 56, 14), 86: (84, 82, 72, 10), 89: (142, 128, 58, 24),
       90: (132, 114, 78), 100: (148, 160), 120: (170, 188, 48, 36), 121: (48,)}
HEADS = (1, 8, 16, 20, 32, 48, 64, 96, 128)
TOKENS = sorted({2 ** i for i in range(15)} | {3, 5, 24, 48, 96, 200, 3000})
TOPK = (512, 1024, 2048)
# Stack frame an attention config may use (spills): the table's configs stay under it.
MAX_STACK_BYTES = 1024
# GLM-5.3-Flash (NoPE): 64 heads / TP, top-k buffer round_up(2048 + kpool 4 - 1, 128).
NOPE_HEADS = (8, 16, 32, 64)
NOPE_TOPK = (2176,)


# What Triton's JIT specializes at run time for vLLM's shapes: 16-byte aligned
# pointers and strides that are multiples of 16 (576 / 656-byte rows, 64-slot
# blocks, 512-wide heads, top-k 2048).  Alignment decides whether the gathers
# become pipelined async copies, and so the shared memory a config needs.
ALIGNED = {"q_ptr", "q_pe_ptr", "kv_ptr", "slots_ptr", "out_ptr", "part_out_ptr",
           "part_lse_ptr", "stride_q_t", "stride_q_h", "stride_qpe_t", "stride_qpe_h",
           "stride_kv_blk", "stride_kv_slot", "stride_s_t", "stride_o_t", "stride_o_h",
           "stride_out"}


def _runtime_attrs(fn) -> dict:
    return {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a in ALIGNED}


def plans(mod, arch: int, kv_cache_dtype: str = "auto", heads=HEADS, topks=TOPK):
    """(attention configs, merge configs) the heuristic can launch on `arch`
    for a cache of this type (the fp8 kernel has its own tile rule)."""
    import torch

    cap = (arch // 10, arch % 10)
    fwd, merge = set(), set()
    saved = mod._device_info
    try:
        for sms in SMS[arch]:
            mod._device_info = lambda dev, s=sms: (s, cap)
            for dtype in (torch.bfloat16, torch.float16):
                for H in heads:
                    for T in TOKENS:
                        for K in topks:
                            cfg, splits, _ = mod._plan(dtype, torch.device("cpu"), T, H, K, 512,
                                                       None, None, kv_cache_dtype)
                            split = splits > 1
                            fwd.add((cfg["BLOCK_H"], cfg["BLOCK_N"], cfg["BLOCK_DV"],
                                     cfg["num_warps"], cfg["num_stages"], split,
                                     bool(cfg.get("FP8_DEQUANT")), cfg.get("maxnreg") or 0))
                            if split:
                                m = mod._merge_config(splits)
                                merge.add((m["BLOCK_S"], m["num_warps"]))
    finally:
        mod._device_info = saved
    return sorted(fwd), sorted(merge)


def compile_matrix(arch: int) -> list[dict]:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from conftest import default_tree
    from sparse_mla_reference import load_sparse_mla_module

    mod = load_sparse_mla_module(default_tree(), interpret=False)
    target = GPUTarget("cuda", arch, 32)
    cap = (arch // 10, arch % 10)
    pdl_arch = arch >= 90
    fwd_cfgs, merge_cfgs = plans(mod, arch)
    fp8_cfgs, fp8_merge = plans(mod, arch, "fp8_ds_mla")
    nope_cfgs, nope_merge = plans(mod, arch, heads=NOPE_HEADS, topks=NOPE_TOPK)
    nope_fp8_cfgs, nope_fp8_merge = plans(mod, arch, "fp8_ds_mla", NOPE_HEADS, NOPE_TOPK)
    merge_cfgs = sorted(set(merge_cfgs) | set(fp8_merge) | set(nope_merge) | set(nope_fp8_merge))
    variants = [("bf16", "16bit", False), ("fp16", "16bit", False),
                ("bf16", "fp8_ds_mla", arch >= 89), ("fp16", "fp8_ds_mla", arch >= 89)]
    if arch >= 89:
        variants.append(("bf16", "fp8_ds_mla", False))
    out = []
    import triton.language as tl

    runs = [(v, 64, fp8_cfgs if v[1] == "fp8_ds_mla" else fwd_cfgs) for v in variants]
    runs += [(v, 0, nope_fp8_cfgs if v[1] == "fp8_ds_mla" else nope_cfgs) for v in variants]
    for (dt, kv, hw), d_pe, cfgs in runs:
        fp8 = kv == "fp8_ds_mla"
        for bh, bn, bdv, warps, stages, split, deq, maxnreg in cfgs:
            # the fp8 codes kernel, or the 16-bit kernel (also for fp8 rows
            # dequantised to 16 bits: FP8_DEQUANT)
            fwd = mod._sparse_mla_fwd_fp8_kernel if fp8 and not deq else mod._sparse_mla_fwd_kernel
            cst = dict(D_NOPE=512, D_PE=d_pe, KV_BS=64, BLOCK_H=bh, BLOCK_N=bn, SPLIT=split,
                       PDL=split and pdl_arch)
            if fp8:
                # the rope is written as bf16 for either model dtype (the backend); the
                # e4m3 conversions in their PTX form, as on an NVIDIA GPU
                cst.update(FP8_HW=hw, ROPE_DT=tl.bfloat16, PACKED=True)
                assert bdv == 512, bdv  # fp8 programs cover the 512 latent columns
            if fwd is mod._sparse_mla_fwd_kernel:
                cst.update(KV_FP8=fp8, FP8_HW=hw, ROPE_DT=tl.bfloat16 if fp8 else None,
                           PACKED=fp8, FP8_PINNED=fp8 and mod._pin_dequant(cap, stages, bh),
                           SPLIT_SCORES=mod._split_scores(cap, bh, warps))
                # the launcher's rule on an NVIDIA GPU (this row's bytes)
                row_bytes = mod.fp8_ds_mla_row_bytes(512, d_pe) if fp8 else 2 * (512 + d_pe)
                cst["PREFETCH_LINES"] = mod._prefetch_lines(cst["SPLIT_SCORES"], row_bytes,
                                                            torch.device("cuda"))
            if not (fp8 and not deq):
                cst.update(BLOCK_DV=bdv)
            sig = _signature(fwd, dt, dict(q_ptr="dt", q_pe_ptr="dt", kv_ptr="u8" if fp8 else "dt",
                                           slots_ptr="i32", out_ptr="dt", part_out_ptr="fp32",
                                           part_lse_ptr="fp32"),
                             set(cst), float_names=("qk_scale",))
            k = triton.compile(ASTSource(fn=fwd, signature=sig, constexprs=cst,
                                         attrs=_runtime_attrs(fwd)), target=target,
                               options=dict(num_warps=warps, num_stages=stages,
                                            **({"maxnreg": maxnreg} if maxnreg else {})))
            rec = dict(arch=arch, kernel="fwd", dtype=dt, kv=kv, nope=d_pe == 0,
                       prefetch_lines=cst.get("PREFETCH_LINES", 0),
                       decode=("hw" if hw else "sw") if fp8 else "-", dequant=deq, BLOCK_H=bh,
                       BLOCK_N=bn, BLOCK_DV=bdv, num_warps=warps, num_stages=stages, split=split,
                       maxnreg=maxnreg,
                       pdl=cst["PDL"], shared=int(k.metadata.shared))
            out.append(finish_record(rec, k))
    merge = mod._sparse_mla_merge_kernel
    for dt in ("bf16", "fp16"):
        msig = _signature(merge, dt, dict(part_out_ptr="fp32", part_lse_ptr="fp32",
                                          out_ptr="dt"), {"D_NOPE", "BLOCK_S", "PDL"})
        for block_s, warps in merge_cfgs:
            k = triton.compile(ASTSource(fn=merge, signature=msig,
                                         constexprs=dict(D_NOPE=512, BLOCK_S=block_s,
                                                         PDL=pdl_arch)),
                               target=target, options=dict(num_warps=warps, num_stages=1))
            rec = dict(arch=arch, kernel="merge", dtype=dt, BLOCK_S=block_s, num_warps=warps,
                       pdl=pdl_arch, shared=int(k.metadata.shared))
            out.append(finish_record(rec, k))
    # fp8_ds_mla prefills' context copy (dequantize_ds_mla_context): each model dtype, with rope
    # and NoPE, the arch's e4m3 path (sm89+ also the software decode), its one launch config
    ctx = mod._ds_mla_context_kernel
    for dt in ("bf16", "fp16"):
        csig = _signature(ctx, dt, dict(kv_ptr="u8", block_table_ptr="i32", seq_lens_ptr="i32",
                                        row_starts_ptr="i32", out_ptr="dt"),
                          {"D_NOPE", "D_PE", "KV_BS", "BLOCK_N", "FP8_HW", "PACKED", "ROPE_DT"})
        for d_pe in (64, 0):
            for hw in ((True, False) if arch >= 89 else (False,)):
                cst = dict(D_NOPE=512, D_PE=d_pe, KV_BS=64, BLOCK_N=mod._CONTEXT_BLOCK_N,
                           FP8_HW=hw, PACKED=not hw, ROPE_DT=tl.bfloat16)
                k = triton.compile(ASTSource(fn=ctx, signature=csig, constexprs=cst,
                                             attrs=_runtime_attrs(ctx)),
                                   target=target, options=dict(num_warps=4))
                rec = dict(arch=arch, kernel="context", dtype=dt, nope=d_pe == 0,
                           decode="hw" if hw else "sw", shared=int(k.metadata.shared))
                out.append(finish_record(rec, k))
    return out


children = arch_children_fixture(__file__)


@pytest.mark.parametrize("arch", ARCHES)
def test_every_heuristic_config_compiles(children, arch):
    recs = arch_records(children, arch)
    fwd = [x for x in recs if x["kernel"] == "fwd"]
    # the enumeration reaches decode (split) and prefill (no split) plans,
    # and every cache variant, with rope (576) and without (NoPE, 512)
    assert any(x["split"] for x in fwd) and any(not x["split"] for x in fwd)
    for nope in (False, True):
        kinds = {(x["dtype"], x["kv"], x["decode"]) for x in fwd if x["nope"] == nope}
        assert kinds == _want_kinds(arch), (nope, kinds)
        assert {x["split"] for x in fwd if x["nope"] == nope} == {False, True}, nope
        # both fp8 kernels on every arch: the codes kernel for <= 32-head tiles of
        # long grids, rows dequantised into the 16-bit kernel for the 16-head decode
        # tiles, short 17-32-head grids and 33+ heads (32-head tiles on the ~99 KB parts)
        fp8 = [x for x in fwd if x["kv"] == "fp8_ds_mla" and x["nope"] == nope]
        assert any(x["dequant"] for x in fp8) and not all(x["dequant"] for x in fp8), arch
        # both fp8 kernels convert each gathered tile once, from 16-byte shared-memory
        # loads, and feed the dots 16-bit values (_e4m3_f16's PINNED): no code reaches a
        # dot operand byte by byte (codes kernel: 128 one-byte loads per tile step before;
        # H200, 8 heads x 64 tokens: 84 vs 90 us; the dequantising 16-head decode tile
        # had them too once its rows were reordered, until its conversions were pinned)
        assert all(x["shared_byte_loads"] == 0 for x in fp8), [
            (x["BLOCK_H"], x["dequant"], x["decode"], x["shared_byte_loads"]) for x in fp8
            if x["shared_byte_loads"]]
    # the L2 prefetch of the next tile's rows in sm90's split-score tiles only (64 rows on 8
    # warps, wgmma; H200: 7-12% faster there, 23-33% slower in the tiles of <= 32 heads), one
    # predicated prefetch per 128-byte line of a row: 9 lines of 1152 bytes, 8 of the NoPE 1024,
    # 6 of the 656-byte fp8_ds_mla rows
    want = {(x["dtype"], x["kv"], x["nope"], x["decode"], x["BLOCK_H"], x["BLOCK_N"],
             x["num_warps"], x["num_stages"], x["split"])
            for x in fwd if arch == 90 and x["BLOCK_H"] == 64 and x["num_warps"] == 8
            and (x["kv"] != "fp8_ds_mla" or x["dequant"])}
    assert want or arch != 90, "sm90 launches no split-score tile"
    for x in fwd:
        key = (x["dtype"], x["kv"], x["nope"], x["decode"], x["BLOCK_H"], x["BLOCK_N"],
               x["num_warps"], x["num_stages"], x["split"])
        lines = (6 if x["kv"] == "fp8_ds_mla" else 8 if x["nope"] else 9) if key in want else 0
        assert (x["prefetch_lines"], x["l2_prefetches"] > 0) == (lines, lines > 0), (key, x)
    # each loop step's row pointers from unsigned division (_slot_offset): signed int64
    # slot // KV_BS and slot % KV_BS took 13-15% of the 16-bit kernel's loop instructions
    # (sm90 SASS, every tile) and left arithmetic shifts in every forward kernel's PTX (28-144
    # in the sm90 tiles counted)
    signed = [(x["dtype"], x["kv"], x["decode"], x["dequant"], x["BLOCK_H"], x["BLOCK_N"],
               x["split"], x["signed_shifts"]) for x in fwd if x["signed_shifts"]]
    assert not signed, signed
    # no attention config collapses its registers into the stack: pinned dequantising tiles of
    # 32+ heads compiled for mma.sync took 32 registers and a 2.7-6 KB stack (ptxas), 25-40x
    # slower on the H200 with the dots as mma.sync; the configs the table gives stay <= 1 KB
    big_stack = [(x["dtype"], x["kv"], x["decode"], x["dequant"], x["BLOCK_H"], x["BLOCK_N"],
                  x["num_warps"], x["num_stages"], x.get("sass_reg"), x.get("sass_stack"))
                 for x in fwd if x.get("sass_stack", 0) > MAX_STACK_BYTES]
    assert not big_stack, big_stack
    assert any(x["kernel"] == "merge" for x in recs)
    ctx = {(x["dtype"], x["nope"], x["decode"]) for x in recs if x["kernel"] == "context"}
    assert ctx == {(dt, nope, d) for dt in ("bf16", "fp16") for nope in (False, True)
                   for d in (("hw", "sw") if arch >= 89 else ("sw",))}, ctx
    assert all(x["e4m3_cvt"] > 0 for x in recs if x["kernel"] == "context" and x["decode"] == "hw")
    assert_compiled(recs)


def _want_kinds(arch: int) -> set:
    want = {("bf16", "16bit", "-"), ("fp16", "16bit", "-"),
            ("bf16", "fp8_ds_mla", "hw" if arch >= 89 else "sw"),
            ("fp16", "fp8_ds_mla", "hw" if arch >= 89 else "sw")}
    if arch >= 89:
        want.add(("bf16", "fp8_ds_mla", "sw"))
    return want


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    for rec in compile_matrix(int(sys.argv[1])):
        print(json.dumps(rec))
