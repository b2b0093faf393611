"""Compile-only check of DeepSeek-V4's Triton ops that encode or decode fp8 e4m3, on the line under
test (CPU, no GPU; the series switched them from `tl.float8e4nv` to the portable `e4m3_encode` /
`e4m3_decode` of vllm/v1/attention/ops/triton_fp8_e4m3.py: the series' "[Kernel] DeepSeek-V4 Triton
ops" patch, on both lines).

Ops (vllm/models/deepseek_v4/common/ops/) and the kernel each launches, on 0.26.0 / on 0.33.0:
  insert              quantize_and_insert_k_kernel (encode; SWA cache, block 64), both lines
  gather              _dequantize_and_gather_k_kernel / DequantizeAndGatherKCacheKernel.kernel
                      (decode; compressed C4 block 64, compressed C128 block 2, SWA block 64 with
                      gather lengths)
  compress 512        _fused_kv_compress_norm_rope_insert_sparse_attn (encode; head 512 = 448 + 64,
                      compress ratios 4 and 128), both lines
  compress indexer    _fused_kv_compress_norm_rope_insert_indexer_attn (encode; head 128, C4), both
                      lines (0.33.0: FusedKVCompressNormRopeInsertIndexerTritonKernel's launch spec)
  compress two-stage  _finalize_norm_rope_quant_store_sparse_attn (encode; head 512 C128, the
                      two-stage compressor, ROCm's path today), both lines
  indexer q           _fused_indexer_q_rope_quant_kernel / FusedIndexerQRopeQuantTritonKernel.kernel
                      (encode; 64 heads x 128)
  inv rope            _fused_inv_rope_fp8_quant_per_head / FusedInvRopeFP8QuantKernel.kernel
                      (encode; 8 heads per group x 512)
(Not here: the MXFP4 indexer compressor and query kernels, which convert no e4m3 (the compressor's
FP8_HW is unused), the XPU kernels, and the V4 attention kernel, tests/test_kernel_compile_dsv4.py.)

Each op's own public launcher is run, on small CPU tensors with V4's shapes, strides and cache pages,
with its kernel recorded instead of launched (tests/v4_ops_launch.py: the op files, and on 0.33.0
the launch-spec machinery of vllm/model_executor/warmup, load from the tree; a few other vLLM modules
are stand-ins): the constexprs, scalar types and launch options compiled are the ones the launcher
(and on 0.33.0 VllmTritonJitKernel.launch) passes.  FP8_HW is what the launcher takes from
`fp8_e4m3_hw` with the device capability replaced by the arch's: False below sm89 (asserted), True
from sm89.  Every kernel is compiled with FP8_HW=False on every arch, and with FP8_HW=True on sm89+.

Checks per compiled kernel: a cubin and PTX, static shared memory within the arch's per-block limit,
and the PTX's e4m3 conversions (`cvt.rn.satfinite.e4m3x2.*`, `cvt.rn.f16x2.e4m3x2`): none with
FP8_HW=False (the software path must not emit them, and below sm89 they do not exist), some with
FP8_HW=True (so the switch is live).  Registers and stack / local memory (spills) are reported, not
asserted.

One child process per arch without TRITON_INTERPRET (the interpreter tests set it process-wide), as
many at once as there are CPUs.  `python tests/test_kernel_compile_v4_ops.py 86` prints the records of
one arch as JSON lines (SMLA_LINE / SMLA_TREE pick the tree).  120 compiles per line (10 per arch below
sm89, 20 from sm89).  Measured on 2 cores shared with other jobs (load average 9-11): 0.33.0 with an
empty Triton cache 347 s; warm, 60 s on either line.
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
    ARCHES, _signature, arch_children, arch_records, assert_compiled, finish_record)
from v4_ops_launch import (  # noqa: E402
    ALSO_LAUNCHED, LAYOUTS, OPS_DIR, capture, kernel_fn, launches, layout, load_ops)

# Arguments marked 16-byte divisible (`tt.divisibility` 16), as Triton's JIT marks them at run time,
# where vLLM's tensors guarantee it and no more (an argument left out only loses a specialization;
# one the kernel lists in do_not_specialize is not marked, as the JIT does not):
#  - KV caches: the page bases (pages are padded to multiples of 576 bytes; the page strides,
#    37440 / 1728 / 8640 bytes, are constexprs already); the compressor state: page base, page
#    stride (8208 / 2160 floats) and row stride (2048 / 1024 / 512 floats);
#  - tensors at offset 0 of their own allocation (or row slices of them) whose rows are multiples of
#    16 bytes: K ([T, 512] bf16) of the insert; the gather's bf16 workspace (256-byte aligned views,
#    [R, M, 512]: strides M*512, 512); the two-stage scratch ([N, 512] fp32, stride 512); RMSNorm
#    weights; the rotary cos/sin cache ([max_pos, 64] fp32, stride 64); the indexer query ([T, 64, 128]
#    bf16 GEMM output, strides 8192, 128), its uint8 codes (same strides), its weights (bf16) and
#    weights_out (fp32), both [T, 64] with stride 64; the attention output o ([T, H, 512] bf16, strides
#    H*512, 512); the inverse-RoPE fp8 output ([G, T, 4096] as uint8, strides T*4096, 4096) and its
#    scale buffer (group stride 32 or 8 times the TMA-aligned token count, a multiple of 4).
# Not marked: positions, slot mappings, token-to-request indices, sequence / gather lengths and block
# tables (int slices such as positions[num_decodes:] or block_table[num_decodes:], whose rows are of
# any width), block-table strides, token counts and offsets, and the inverse-RoPE scale buffer's
# per-column stride (the TMA-aligned token count: a multiple of 4 only).
ALIGNED = {
    "insert": {"k_ptr", "k_cache_ptr"},
    "gather": {"out_ptr", "out_stride0", "out_stride1", "k_cache_ptr"},
    "compress 512": {
        "state_cache_ptr", "state_cache_stride0", "state_cache_stride1", "rms_norm_weight_ptr",
        "cos_sin_cache_ptr", "cos_sin_stride", "k_cache_ptr"},
    "compress indexer": {
        "state_cache_ptr", "state_cache_stride0", "state_cache_stride1", "rms_norm_weight_ptr",
        "cos_sin_cache_ptr", "cos_sin_stride", "k_cache_ptr"},
    "compress two-stage": {
        "scratch_ptr", "scratch_stride", "rms_norm_weight_ptr", "cos_sin_cache_ptr", "cos_sin_stride",
        "k_cache_ptr"},
    "indexer q": {
        "index_q_ptr", "index_q_stride0", "index_q_stride1", "index_q_cos_sin_ptr",
        "index_q_cos_sin_stride", "index_q_fp8_ptr", "index_q_fp8_stride0", "index_q_fp8_stride1",
        "index_weights_ptr", "index_weights_stride", "index_weights_out_ptr",
        "index_weights_out_stride"},
    "inv rope": {
        "o_ptr", "cos_sin_cache_ptr", "fp8_ptr", "scale_ptr", "o_stride_token", "o_stride_head",
        "cache_stride_pos", "fp8_stride_group", "fp8_stride_token", "scale_stride_group"},
}
# The same arguments under another name in a layout: 0.33.0's inverse RoPE writes `out` (bf16, or
# the uint8 view of the fp8 codes), 0.26.0's `fp8`.
RENAMED = {"launch specs": {"inv rope": {"fp8_ptr": "out_ptr", "fp8_stride_group": "out_stride_group",
                                         "fp8_stride_token": "out_stride_token"}}}
# op -> the cases compiled per FP8_HW value (the test checks they all come back)
CASES = {
    "insert": ["swa block64"],
    "gather": ["c4 block64", "c128 block2", "swa block64 gather_lens"],
    "compress 512": ["c4", "c128"],
    "compress indexer": ["c4"],
    "compress two-stage": ["c128 two-stage"],
    "indexer q": ["64x128"],
    "inv rope": ["8 heads/group"],
}
OPTIONS = {"num_warps", "num_stages", "launch_pdl", "enable_fp_fusion"}  # launch options passed


def aligned(lay: str, op: str) -> set[str]:
    names = RENAMED.get(lay, {}).get(op, {})
    return {names.get(a, a) for a in ALIGNED[op]}


def _compile_inputs(fn, args, kwargs, marked: set[str]) -> tuple[dict, dict, dict, dict, list]:
    """(signature, constexprs, attrs, options, aligned) for `fn` launched with (args, kwargs) the way
    Triton's JIT binds them: parameters by position or name (defaults for the rest), other keywords
    are launch options; tensors become pointers, None and ints equal to 1 constexprs (as the JIT
    specializes them), floats fp32; the attrs mark `marked` but the do_not_specialize parameters
    (checked against the recorded values)."""
    import torch

    dtypes = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
              torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}
    names = fn.arg_names
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    options = {k: v for k, v in kwargs.items() if k not in names}
    constexprs, ptrs, floats, plain = {}, {}, [], set()
    for p in fn.params:
        v = bound[p.name] if p.name in bound else p.default
        if not (p.do_not_specialize or p.do_not_specialize_on_alignment):
            plain.add(p.name)
        if p.is_constexpr or v is None:
            constexprs[p.name] = v
        elif isinstance(v, torch.Tensor):
            assert v.dtype in dtypes, f"{fn.__name__}: {p.name} is {v.dtype} (fp8 pointers need sm89)"
            ptrs[p.name] = dtypes[v.dtype]
        elif isinstance(v, float):
            floats.append(p.name)
        elif isinstance(v, int) and not isinstance(v, bool):
            assert -2 ** 31 <= v < 2 ** 31, (p.name, v)
            if v == 1 and not p.do_not_specialize:
                constexprs[p.name] = 1
        else:
            raise AssertionError(f"{fn.__name__}: unexpected argument {p.name}={v!r}")
    sig = _signature(fn, "bf16", ptrs, set(constexprs), float_names=floats)
    for a in marked:
        assert a in ptrs or sig.get(a) == "i32", f"{fn.__name__}: {a} is not a pointer or int argument"
        if a not in ptrs:
            assert bound[a] % 16 == 0, f"{fn.__name__}: {a}={bound[a]} marked 16-divisible"
    marked = sorted(marked & plain)
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if a in marked}
    return sig, constexprs, attrs, options, marked


def compile_v4_ops(arch: int) -> list[dict]:
    """Compile every (op, case, FP8_HW) of `arch`; one record each.  Must run without
    TRITON_INTERPRET (see the module docstring), in a process of its own (it stubs `vllm`)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from conftest import default_tree

    tree = default_tree()
    lay = layout(tree)
    mods, custom_ops, hw = load_ops(tree, arch)
    target = GPUTarget("cuda", arch, 32)
    out = []
    for op, case, launch in launches(mods, arch, custom_ops):
        key, path = LAYOUTS[lay][op]
        mod = mods[key]
        fn = kernel_fn(mod, path)
        calls = capture(mod, [path, *ALSO_LAUNCHED.get(op, [])], launch)[path]
        assert len(calls) == 1, (op, path, case, len(calls))
        sig, cst, attrs, opts, marked = _compile_inputs(fn, *calls[0], aligned(lay, op))
        hw_name = "fp8_hw" if "fp8_hw" in cst else "FP8_HW"
        launcher_hw = cst[hw_name]
        assert set(opts) <= OPTIONS, (op, path, opts)
        opts = dict({"num_warps": 4, "num_stages": 3}, **opts)  # Triton's launch defaults if unset
        for fp8_hw in ([False, True] if hw else [False]):
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=dict(cst, **{hw_name: fp8_hw}),
                                         attrs=attrs), target=target, options=opts)
            rec = dict(arch=arch, layout=lay, op=op, kernel=path, file=f"{OPS_DIR}/{key}.py", case=case,
                       fp8_hw=fp8_hw, selector_fp8_hw=hw, launcher_fp8_hw=launcher_hw, **opts,
                       shared=int(k.metadata.shared), aligned=marked)
            out.append(finish_record(rec, k))
    return out


@pytest.fixture(scope="module")
def tree():
    pytest.importorskip("triton")
    from conftest import default_tree

    tree = default_tree()
    if not (tree / OPS_DIR / "cache_utils.py").is_file():
        pytest.fail(f"no vLLM work tree with DeepSeek-V4 at {tree}: run `make patch` "
                    "(SMLA_TREE overrides it)")
    return tree


@pytest.fixture(scope="module")
def children(tree):
    """One child per arch ptxas knows, run concurrently (os.cpu_count() at a time):
    {arch: CompletedProcess}."""
    return arch_children(__file__, env=dict(os.environ, SMLA_TREE=str(tree)), timeout=1800)


@pytest.mark.parametrize("arch", ARCHES)
def test_v4_e4m3_ops_compile(tree, children, arch):
    recs = arch_records(children, arch)
    hw = arch >= 89
    lay = layout(tree)
    # the launchers' selector: the GPU's e4m3 conversions from sm89 on only
    assert {(x["selector_fp8_hw"], x["launcher_fp8_hw"]) for x in recs} == {(hw, hw)}, arch
    want = {(op, LAYOUTS[lay][op][1], case, fp8_hw) for op, cases in CASES.items() for case in cases
            for fp8_hw in ((False, True) if hw else (False,))}
    assert sorted((x["op"], x["kernel"], x["case"], x["fp8_hw"]) for x in recs) == sorted(want)
    assert_compiled(recs)
    for x in recs:
        if x["fp8_hw"]:
            assert x["e4m3_cvt"] > 0, f"FP8_HW=True emits no e4m3 conversion: {x}"
        else:
            assert x["e4m3_cvt"] == 0, f"the software e4m3 path emits a hardware conversion: {x}"


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    for rec in compile_v4_ops(int(sys.argv[1])):
        print(json.dumps(rec))
