"""Compile-only check of DeepSeek-V4's Triton ops that encode or decode fp8 e4m3
(CPU, no GPU; patch 0014 switched them from `tl.float8e4nv` to the portable
`e4m3_encode` / `e4m3_decode` of vllm/v1/attention/ops/triton_fp8_e4m3.py).

Kernels (vllm/models/deepseek_v4/common/ops/):
  cache_utils.py                 quantize_and_insert_k_kernel (encode; SWA cache, block 64)
                                 _dequantize_and_gather_k_kernel (decode; compressed C4 block 64,
                                 compressed C128 block 2, SWA block 64 with gather lengths)
  fused_compress_quant_cache.py  _fused_kv_compress_norm_rope_insert_sparse_attn (encode; head 512 =
                                 448 + 64, compress ratios 4 and 128)
                                 _fused_kv_compress_norm_rope_insert_indexer_attn (encode; head 128, C4)
                                 _finalize_norm_rope_quant_store_sparse_attn (encode; head 512 C128,
                                 the two-stage compressor, ROCm's path today)
  fused_indexer_q.py             _fused_indexer_q_rope_quant_kernel (encode; 64 heads x 128)
  fused_inv_rope_fp8_quant.py    _fused_inv_rope_fp8_quant_per_head (encode; 8 heads per group x 512)
(Not here: the MXFP4 indexer compressor, whose FP8_HW is unused, and the V4 attention kernel of patch
0016, vllm/v1/attention/ops/triton_sparse_mla_dsv4.py.)

Each op's own Python launcher is run, on small CPU tensors with V4's shapes, strides and cache pages,
with its kernel swapped for a recorder: the constexprs, scalar types and launch options compiled are the
ones the launcher passes (the op files are loaded from the tree with stubs for the few vLLM modules they
import, see `_install_vllm_stubs`).  FP8_HW is what the launcher takes from `fp8_e4m3_hw` with the
device capability replaced by the arch's: False below sm89 (asserted), True from sm89.  Every kernel
is compiled with FP8_HW=False on every arch, and with FP8_HW=True on sm89+ as well.

Checks per compiled kernel: a cubin and PTX, static shared memory within the arch's per-block limit,
and the PTX's e4m3 conversions (`cvt.rn.satfinite.e4m3x2.*`, `cvt.rn.f16x2.e4m3x2`): none with
FP8_HW=False (the software path must not emit them, and below sm89 they do not exist), some with
FP8_HW=True (so the switch is live).  Registers and stack / local memory (spills) are reported, not
asserted.

One child process per arch without TRITON_INTERPRET (the interpreter tests set it process-wide), as
many at once as there are CPUs.  `python tests/test_kernel_compile_v4_ops.py 86` prints the records of
one arch as JSON lines.  About 80 s for the 7 arches on 2 cores with an empty Triton cache, 15 s warm.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_kernel_compile import (  # noqa: E402
    ARCHES, _signature, arch_children, arch_records, assert_compiled, finish_record)

OPS_PKG = "vllm.models.deepseek_v4.common.ops"
OPS_DIR = "vllm/models/deepseek_v4/common/ops"

# A PTX instruction converting to or from e4m3: cvt.rn.satfinite.e4m3x2.f32 (sm90+) or .f16x2
# (sm89) encoding, cvt.rn.f16x2.e4m3x2 decoding (instruction lines only: the PTX's debug info
# names triton_fp8_e4m3.py).

# V4's shapes (DeepSeek-V4 Flash / Pro): attention head 512 = 448 nope (fp8) + 64 rope (bf16);
# fp8_ds_mla cache rows of 576 data + 8 scale bytes; indexer head 128 with 132-byte cache rows;
# 64 indexer heads; 8 heads per o-projection group; the attention block of 256 tokens (so cache
# blocks of 256 / ratio tokens), SWA blocks of 64; compressor state blocks of 4 (C4) and 8 (C128).
HEAD, NOPE, ROPE = 512, 448, 64
FP8_DS_MLA_ROW, INDEXER_HEAD, INDEXER_ROW, INDEXER_HEADS = 584, 128, 132, 64
HEADS_PER_GROUP, ATTN_BLOCK, SWA_BLOCK = 8, 256, 64
PAGE_ALIGN = 576  # kv_cache_interface: fp8_ds_mla pages are padded to 576-byte multiples
MAX_MODEL_LEN = 65536
T, R, NB = 8, 2, 2  # tokens, requests, cache blocks of the toy tensors (shapes only matter)

# Arguments marked 16-byte divisible (`tt.divisibility` 16), as Triton's JIT marks them at run time,
# where vLLM's tensors guarantee it and no more (an argument left out only loses a specialization):
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
    "quantize_and_insert_k_kernel": {"k_ptr", "k_cache_ptr"},
    "_dequantize_and_gather_k_kernel": {"out_ptr", "out_stride0", "out_stride1", "k_cache_ptr"},
    "_fused_kv_compress_norm_rope_insert_sparse_attn": {
        "state_cache_ptr", "state_cache_stride0", "state_cache_stride1", "rms_norm_weight_ptr",
        "cos_sin_cache_ptr", "cos_sin_stride", "k_cache_ptr"},
    "_fused_kv_compress_norm_rope_insert_indexer_attn": {
        "state_cache_ptr", "state_cache_stride0", "state_cache_stride1", "rms_norm_weight_ptr",
        "cos_sin_cache_ptr", "cos_sin_stride", "k_cache_ptr"},
    "_finalize_norm_rope_quant_store_sparse_attn": {
        "scratch_ptr", "scratch_stride", "rms_norm_weight_ptr", "cos_sin_cache_ptr", "cos_sin_stride",
        "k_cache_ptr"},
    "_fused_indexer_q_rope_quant_kernel": {
        "index_q_ptr", "index_q_stride0", "index_q_stride1", "index_q_cos_sin_ptr",
        "index_q_cos_sin_stride", "index_q_fp8_ptr", "index_q_fp8_stride0", "index_q_fp8_stride1",
        "index_weights_ptr", "index_weights_stride", "index_weights_out_ptr",
        "index_weights_out_stride"},
    "_fused_inv_rope_fp8_quant_per_head": {
        "o_ptr", "cos_sin_cache_ptr", "fp8_ptr", "scale_ptr", "o_stride_token", "o_stride_head",
        "cache_stride_pos", "fp8_stride_group", "fp8_stride_token", "scale_stride_group"},
}
# (module, kernel) -> the cases compiled per FP8_HW value (the test checks they all come back)
CASES = {
    ("cache_utils", "quantize_and_insert_k_kernel"): ["swa block64"],
    ("cache_utils", "_dequantize_and_gather_k_kernel"): ["c4 block64", "c128 block2",
                                                         "swa block64 gather_lens"],
    ("fused_compress_quant_cache", "_fused_kv_compress_norm_rope_insert_sparse_attn"): ["c4", "c128"],
    ("fused_compress_quant_cache", "_fused_kv_compress_norm_rope_insert_indexer_attn"): ["c4"],
    ("fused_compress_quant_cache", "_finalize_norm_rope_quant_store_sparse_attn"): ["c128 two-stage"],
    ("fused_indexer_q", "_fused_indexer_q_rope_quant_kernel"): ["64x128"],
    ("fused_inv_rope_fp8_quant", "_fused_inv_rope_fp8_quant_per_head"): ["8 heads/group"],
}

# Kernels a launcher runs besides the one compiled (recorded too, so that nothing launches on CPU):
# the two-stage compressor's split gather (no fp8) before its finalize kernel.
ALSO_LAUNCHED = {"_finalize_norm_rope_quant_store_sparse_attn": ["_compress_gather_split_sparse_attn"]}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _install_vllm_stubs(tree: Path, arch: int) -> dict:
    """Make the op modules importable from `tree` without importing vLLM (whose Triton shim hands out
    placeholders where no GPU driver is active): `vllm`, its packages on the way and the few modules
    the ops import become stand-ins; only the ops package and vllm/v1/attention/ops load from the
    tree, so any other import fails by name.  The platform is CUDA at `arch`; `cutedsl_supported()`
    is False, the case in which the Triton kernels run (below sm89, no cutlass, or
    VLLM_DSV4_PORTABLE=1).  Returns the custom ops registered through the stub."""
    import torch
    import triton
    import triton.language as tl

    def package(name, path=None):
        m = ModuleType(name)
        m.__path__ = [str(tree / path)] if path else []
        sys.modules[name] = m

    def module(name, **attrs):
        m = ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m

    for name in ("vllm", "vllm.models", "vllm.models.deepseek_v4", "vllm.models.deepseek_v4.common",
                 "vllm.models.deepseek_v4.nvidia", "vllm.v1", "vllm.v1.attention", "vllm.utils",
                 "vllm.model_executor", "vllm.model_executor.layers",
                 "vllm.model_executor.layers.quantization",
                 "vllm.model_executor.layers.quantization.utils"):
        package(name)
    package(OPS_PKG, OPS_DIR)
    package("vllm.v1.attention.ops", "vllm/v1/attention/ops")
    module("vllm.triton_utils", triton=triton, tl=tl)
    platform = SimpleNamespace(
        is_cuda=lambda: True, is_rocm=lambda: False, is_xpu=lambda: False,
        is_fp8_fnuz=lambda: False, fp8_dtype=lambda: torch.float8_e4m3fn,
        get_device_capability=lambda: SimpleNamespace(major=arch // 10, minor=arch % 10),
        is_arch_support_pdl=lambda: arch >= 90)  # platforms/cuda.py: major >= 9
    module("vllm.platforms", current_platform=platform)
    module("vllm.models.deepseek_v4.nvidia.ops", cutedsl_supported=lambda: False)

    def get_fp8_min_max():
        raise AssertionError("FNUZ fp8 is not a CUDA format")

    module("vllm.model_executor.layers.quantization.utils.quant_utils", get_fp8_min_max=get_fp8_min_max)
    custom_ops = {}

    def direct_register_custom_op(op_name, op_func, *args, **kwargs):
        custom_ops[op_name] = op_func

    module("vllm.utils.torch_utils", direct_register_custom_op=direct_register_custom_op)
    # vllm/utils/deep_gemm.py's get_tma_aligned_size: x rounded up to 16 bytes of element_size
    module("vllm.utils.deep_gemm",
           get_tma_aligned_size=lambda x, element_size: _round_up(x, 16 // element_size))
    return custom_ops


class _TorchWithOps:
    """torch, but `torch.ops.vllm.<op>` calls the Python implementation registered through the stub
    (fused_inv_rope_fp8_quant launches its kernel through a custom op)."""

    def __init__(self, custom_ops: dict):
        self.ops = SimpleNamespace(vllm=SimpleNamespace(**custom_ops))

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)


class _Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` records the call."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def _capture(mod, names: list[str], launch) -> dict:
    """Run `launch()` with `mod`'s kernels `names` recorded instead of launched: {name: calls}."""
    saved = {n: getattr(mod, n) for n in names}
    recs = {n: _Recorder(fn) for n, fn in saved.items()}
    try:
        for n, r in recs.items():
            setattr(mod, n, r)
        launch()
    finally:
        for n, fn in saved.items():
            setattr(mod, n, fn)
    return {n: r.calls for n, r in recs.items()}


def _compile_inputs(fn, args, kwargs) -> tuple[dict, dict, dict, dict]:
    """(signature, constexprs, attrs, options) for `fn` launched with (args, kwargs) the way Triton's
    JIT binds them: parameters by position or name (defaults for the rest), other keywords are launch
    options; tensors become pointers, None and ints equal to 1 constexprs (as the JIT specializes
    them), floats fp32; the attrs mark ALIGNED[fn] (checked against the recorded values)."""
    import torch

    dtypes = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
              torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}
    names = fn.arg_names
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    options = {k: v for k, v in kwargs.items() if k not in names}
    constexprs, ptrs, floats = {}, {}, []
    for p in fn.params:
        v = bound[p.name] if p.name in bound else p.default
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
    aligned = ALIGNED[fn.__name__]
    for a in aligned:
        assert a in ptrs or sig.get(a) == "i32", f"{fn.__name__}: {a} is not a pointer or int argument"
        if a not in ptrs:
            assert bound[a] % 16 == 0, f"{fn.__name__}: {a}={bound[a]} marked 16-divisible"
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if a in aligned}
    return sig, constexprs, attrs, options


def launches(mods, arch: int, custom_ops: dict):
    """[(module key, kernel name, case, launch)]: V4's calls of each op's launcher."""
    import torch

    bf16, f32, u8, i32, i64 = torch.bfloat16, torch.float32, torch.uint8, torch.int32, torch.int64
    cu, fc = mods["cache_utils"], mods["fused_compress_quant_cache"]
    fq, fi = mods["fused_indexer_q"], mods["fused_inv_rope_fp8_quant"]

    def zeros(*shape, dtype):
        return torch.zeros(shape, dtype=dtype)

    def paged(block_tokens, row, dtype=u8, elem=1):
        """[NB, block_tokens, row] with vLLM's padded page stride (576-byte multiples)."""
        page = _round_up(block_tokens * row * elem, PAGE_ALIGN) // elem
        return torch.zeros(NB * page, dtype=dtype).as_strided((NB, block_tokens, row), (page, row, 1))

    cos_sin = zeros(4 * ATTN_BLOCK, ROPE, dtype=f32)  # rotary_emb.cos_sin_cache: [max_pos, 64] fp32
    out = []

    # -- cache_utils: the K-cache insert (the SWA cache's block of 64; XPU and tests call it) --------
    out.append(("cache_utils", "quantize_and_insert_k_kernel", "swa block64",
                lambda: cu.quantize_and_insert_k_cache(
                    zeros(T, HEAD, dtype=bf16), paged(SWA_BLOCK, FP8_DS_MLA_ROW).view(NB, -1),
                    zeros(T, dtype=i64), block_size=SWA_BLOCK)))

    # -- the gathers of sparse prefill (flashmla.py): compressed cache (blocks of 256 / ratio, all
    # tokens) and SWA cache (blocks of 64, gather lengths, after the compressed tokens) -------------
    def gather(block, width, gather_lens, offset):
        return lambda: cu.dequantize_and_gather_k_cache(
            zeros(R, 4 * ATTN_BLOCK, HEAD, dtype=bf16), paged(block, FP8_DS_MLA_ROW),
            zeros(R, dtype=i32), zeros(R, dtype=i32) if gather_lens else None,
            zeros(R, width, dtype=i32), block, offset)

    attn_width = -(-MAX_MODEL_LEN // ATTN_BLOCK)
    out.append(("cache_utils", "_dequantize_and_gather_k_kernel", "c4 block64",
                gather(ATTN_BLOCK // 4, attn_width, False, 0)))
    out.append(("cache_utils", "_dequantize_and_gather_k_kernel", "c128 block2",
                gather(ATTN_BLOCK // 128, attn_width, False, 0)))
    out.append(("cache_utils", "_dequantize_and_gather_k_kernel", "swa block64 gather_lens",
                gather(SWA_BLOCK, -(-MAX_MODEL_LEN // SWA_BLOCK), True, 4 * ATTN_BLOCK)))

    # -- the compressors (compressor.py's DeepseekCompressor: state blocks, state_width, quant_block,
    # token_stride, scale_dim as its __init__ / forward set them) --------------------------------------
    def compressor_args(head, ratio):
        overlap = ratio == 4
        state_block = 4 if ratio == 4 else 8
        state_dim = 2 * (1 + overlap) * head
        if head == HEAD:
            quant_block, token_stride, scale_dim, row = 64, NOPE + 2 * ROPE, NOPE // 64 + 1, FP8_DS_MLA_ROW
        else:
            quant_block, token_stride, scale_dim, row = 128, head, 4, INDEXER_ROW
        kv_slots = zeros(T, dtype=i64)
        return dict(
            state_cache=paged(state_block, state_dim, f32, 4), num_actual=T,
            token_to_req_indices=zeros(T, dtype=i32), positions=zeros(T, dtype=i64),
            slot_mapping=zeros(T, dtype=i64), block_table=zeros(R, attn_width, dtype=i32),
            block_size=state_block, state_width=state_dim // 2, cos_sin_cache=cos_sin,
            kv_cache=paged(ATTN_BLOCK // ratio, row), k_cache_metadata=SimpleNamespace(slot_mapping=kv_slots),
            pdl_kwargs={"launch_pdl": False},  # CUDA (compressor.py)
            head_dim=head, rope_head_dim=ROPE, compress_ratio=ratio, overlap=overlap,
            use_fp4_cache=False, rms_norm_weight=zeros(head, dtype=bf16), rms_norm_eps=1e-6,
            quant_block=quant_block, token_stride=token_stride, scale_dim=scale_dim)

    for ratio in (4, 128):
        out.append(("fused_compress_quant_cache", "_fused_kv_compress_norm_rope_insert_sparse_attn",
                    f"c{ratio}", lambda r=ratio: fc.compress_norm_rope_store_triton(
                        **compressor_args(HEAD, r))))
    out.append(("fused_compress_quant_cache", "_fused_kv_compress_norm_rope_insert_indexer_attn", "c4",
                lambda: fc.compress_norm_rope_store_triton(**compressor_args(INDEXER_HEAD, 4))))

    def two_stage():  # all tokens prefill: the split gather, then the finalize kernel
        saved = fc._n_cu
        fc._n_cu = lambda: 132  # the SM count only sets the gather's split, not compiled here
        try:
            fc.compress_norm_rope_store_two_stage_triton(
                **compressor_args(HEAD, 128), num_decode_tokens=0,
                compress_scratch=zeros(4 * ATTN_BLOCK, HEAD, dtype=f32))
        finally:
            fc._n_cu = saved

    out.append(("fused_compress_quant_cache", "_finalize_norm_rope_quant_store_sparse_attn",
                "c128 two-stage", two_stage))

    # -- the indexer query: RoPE + fp8 quant of [T, 64, 128] (attention.py's DeepseekV4Indexer) ------
    out.append(("fused_indexer_q", "_fused_indexer_q_rope_quant_kernel", "64x128",
                lambda: fq.fused_indexer_q_rope_quant(
                    zeros(T, dtype=i64), zeros(T, INDEXER_HEADS, INDEXER_HEAD, dtype=bf16), cos_sin,
                    zeros(T, INDEXER_HEADS, dtype=bf16), INDEXER_HEAD ** -0.5, INDEXER_HEADS ** -0.5,
                    use_fp4=False)))

    # -- the o projection's inverse RoPE + fp8 quant (nvidia/ops/o_proj.py; TMA-aligned int32 scales
    # from sm100 on, compute_fp8_einsum_recipe) --------------------------------------------------------
    def inv_rope():
        groups = 8
        saved = fi.torch
        fi.torch = _TorchWithOps(custom_ops)
        try:
            fi.fused_inv_rope_fp8_quant(
                zeros(T, groups * HEADS_PER_GROUP, HEAD, dtype=bf16), zeros(T, dtype=i64), cos_sin,
                n_groups=groups, heads_per_group=HEADS_PER_GROUP, nope_dim=NOPE, rope_dim=ROPE,
                tma_aligned_scales=arch >= 100)
        finally:
            fi.torch = saved

    out.append(("fused_inv_rope_fp8_quant", "_fused_inv_rope_fp8_quant_per_head", "8 heads/group",
                inv_rope))
    return out


def compile_v4_ops(arch: int) -> list[dict]:
    """Compile every (kernel, case, FP8_HW) of `arch`; one record each.  Must run without
    TRITON_INTERPRET (see the module docstring), in a process of its own (it stubs `vllm`)."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from conftest import default_tree

    tree = default_tree()
    custom_ops = _install_vllm_stubs(tree, arch)
    e4m3 = importlib.import_module("vllm.v1.attention.ops.triton_fp8_e4m3")
    mods = {k: importlib.import_module(f"{OPS_PKG}.{k}") for k in
            ("cache_utils", "fused_compress_quant_cache", "fused_indexer_q", "fused_inv_rope_fp8_quant")}
    # The launchers' selector, with the GPU's capability replaced by the arch's.
    e4m3._cuda_capability = lambda index: (arch // 10, arch % 10)
    hw = e4m3.fp8_e4m3_hw(torch.device("cuda", 0))
    for m in mods.values():
        m.fp8_e4m3_hw = lambda device: e4m3.fp8_e4m3_hw(torch.device("cuda", 0))

    target = GPUTarget("cuda", arch, 32)
    out = []
    for key, kname, case, launch in launches(mods, arch, custom_ops):
        mod = mods[key]
        fn = getattr(mod, kname)
        calls = _capture(mod, [kname, *ALSO_LAUNCHED.get(kname, [])], launch)[kname]
        assert len(calls) == 1, (kname, case, len(calls))
        sig, cst, attrs, opts = _compile_inputs(fn, *calls[0])
        hw_name = "fp8_hw" if "fp8_hw" in cst else "FP8_HW"
        launcher_hw = cst[hw_name]
        assert set(opts) <= {"num_warps", "num_stages", "launch_pdl"}, (kname, opts)
        opts = dict({"num_warps": 4, "num_stages": 3}, **opts)  # Triton's launch defaults if unset
        for fp8_hw in ([False, True] if hw else [False]):
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=dict(cst, **{hw_name: fp8_hw}),
                                         attrs=attrs), target=target, options=opts)
            rec = dict(arch=arch, kernel=kname, file=f"{OPS_DIR}/{key}.py", case=case, fp8_hw=fp8_hw,
                       selector_fp8_hw=hw, launcher_fp8_hw=launcher_hw, **opts,
                       shared=int(k.metadata.shared), aligned=sorted(ALIGNED[kname]))
            out.append(finish_record(rec, k))
    return out


@pytest.fixture(scope="module")
def children():
    """One child per arch ptxas knows, run concurrently (os.cpu_count() at a time):
    {arch: CompletedProcess}."""
    pytest.importorskip("triton")
    from conftest import default_tree

    tree = default_tree()
    if not (tree / OPS_DIR / "cache_utils.py").is_file():
        pytest.fail(f"no vLLM work tree with DeepSeek-V4 at {tree}: run `make patch` "
                    "(SMLA_TREE overrides it)")
    return arch_children(__file__, env=dict(os.environ, SMLA_TREE=str(tree)), timeout=1800)


@pytest.mark.parametrize("arch", ARCHES)
def test_v4_e4m3_ops_compile(children, arch):
    recs = arch_records(children, arch)
    hw = arch >= 89
    # the launchers' selector: the GPU's e4m3 conversions from sm89 on only
    assert {(x["selector_fp8_hw"], x["launcher_fp8_hw"]) for x in recs} == {(hw, hw)}, arch
    want = {(k[1], case, fp8_hw) for k, cases in CASES.items() for case in cases
            for fp8_hw in ((False, True) if hw else (False,))}
    assert sorted((x["kernel"], x["case"], x["fp8_hw"]) for x in recs) == sorted(want)
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
