"""DeepSeek-V4's Triton ops that encode or decode fp8 e4m3, loaded from a line's tree and launched on
CPU with their kernels recorded, not run (tests/test_kernel_compile_v4_ops.py compiles the records).

Both layouts of the ops (vllm/models/deepseek_v4/common/ops/) are known, picked by what the tree has:
  "jit functions"  (0.26.0): every launcher calls a module-level @triton.jit kernel, `kernel[grid](...)`;
  "launch specs"   (0.33.0, the tree has vllm/model_executor/warmup/jit_warmup_triton_helper.py): the
                   gather, the indexer query and the inverse RoPE are VllmTritonJitKernel classes whose
                   `@kernel_launcher __call__` returns a LaunchSpec (grid, kwargs); the base class's
                   `launch` binds the call's inputs to the kernel's parameters and calls
                   `kernel[grid](**kwargs)` with `kernel` the launch spec's own `kernel=` (the indexer
                   compressor's) or the class's `kernel`.  The insert and the head-512 compressors
                   still launch module-level kernels.
The recorder replaces the kernel where the launcher looks it up (the module attribute, or the class's
`kernel`), so what it records is what Triton's JIT would get: the launcher's and the base class's own
code run unchanged.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

OPS_PKG = "vllm.models.deepseek_v4.common.ops"
OPS_DIR = "vllm/models/deepseek_v4/common/ops"
OP_MODULES = ("cache_utils", "fused_compress_quant_cache", "fused_indexer_q", "fused_inv_rope_fp8_quant")
LAUNCH_SPEC_HELPER = "vllm/model_executor/warmup/jit_warmup_triton_helper.py"

# op -> (module, where its launcher finds the kernel it launches) per layout; the attribute path is
# also the record's kernel name.
LAYOUTS = {
    "jit functions": {
        "insert": ("cache_utils", "quantize_and_insert_k_kernel"),
        "gather": ("cache_utils", "_dequantize_and_gather_k_kernel"),
        "compress 512": ("fused_compress_quant_cache", "_fused_kv_compress_norm_rope_insert_sparse_attn"),
        "compress indexer": ("fused_compress_quant_cache",
                             "_fused_kv_compress_norm_rope_insert_indexer_attn"),
        "compress two-stage": ("fused_compress_quant_cache",
                               "_finalize_norm_rope_quant_store_sparse_attn"),
        "indexer q": ("fused_indexer_q", "_fused_indexer_q_rope_quant_kernel"),
        "inv rope": ("fused_inv_rope_fp8_quant", "_fused_inv_rope_fp8_quant_per_head"),
    },
    "launch specs": {
        "insert": ("cache_utils", "quantize_and_insert_k_kernel"),
        "gather": ("cache_utils", "DequantizeAndGatherKCacheKernel.kernel"),
        "compress 512": ("fused_compress_quant_cache", "_fused_kv_compress_norm_rope_insert_sparse_attn"),
        # FusedKVCompressNormRopeInsertIndexerTritonKernel's launch spec names the kernel (fp8 or
        # MXFP4 variant) as a module global
        "compress indexer": ("fused_compress_quant_cache",
                             "_fused_kv_compress_norm_rope_insert_indexer_attn"),
        "compress two-stage": ("fused_compress_quant_cache",
                               "_finalize_norm_rope_quant_store_sparse_attn"),
        "indexer q": ("fused_indexer_q", "FusedIndexerQRopeQuantTritonKernel.kernel"),
        "inv rope": ("fused_inv_rope_fp8_quant", "FusedInvRopeFP8QuantKernel.kernel"),
    },
}
# Kernels a launcher runs besides the one compiled (recorded too, so that nothing launches on CPU):
# the two-stage compressor's split gather (no fp8) before its finalize kernel.
ALSO_LAUNCHED = {"compress two-stage": ["_compress_gather_split_sparse_attn"]}

# Modules of vLLM loaded from the tree where it has them (pure Python, light, CPU-safe): the launch-spec
# machinery the 0.33.0 ops derive from and run (vllm.model_executor.warmup, a package of its own; its
# helper reads vllm.envs), and small helpers the ops import.
TREE_MODULES = ("vllm.envs", "vllm.utils.math_utils", "vllm.transformers_utils.deepseek_v4_utils")


def layout(tree: Path) -> str:
    return "launch specs" if (tree / LAUNCH_SPEC_HELPER).is_file() else "jit functions"


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _install_vllm(tree: Path, arch: int) -> dict:
    """Make the op modules importable from `tree` without importing vLLM (whose Triton shim hands out
    placeholders where no GPU driver is active): `vllm` and its packages on the way are empty
    packages; the ops package, vllm/v1/attention/ops and vllm/model_executor/warmup load from the
    tree, and so do TREE_MODULES where the tree has them; the few other modules the ops import are
    stand-ins; any other import fails by name.  The platform is CUDA at `arch`;
    `cutedsl_supported()` is False, the case in which the Triton kernels run (below sm89, no cutlass,
    or VLLM_DSV4_PORTABLE=1).  Returns the custom ops registered through the stand-in."""
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
                 "vllm.transformers_utils", "vllm.model_executor", "vllm.model_executor.layers",
                 "vllm.model_executor.layers.quantization",
                 "vllm.model_executor.layers.quantization.utils"):
        package(name)
    package(OPS_PKG, OPS_DIR)
    package("vllm.v1.attention.ops", "vllm/v1/attention/ops")
    package("vllm.model_executor.warmup", "vllm/model_executor/warmup")
    module("vllm.triton_utils", triton=triton, tl=tl, HAS_TRITON=True)
    # platforms/cuda.py and interface.py at `arch`
    platform = SimpleNamespace(
        device_type="cuda", is_cuda=lambda: True, is_rocm=lambda: False, is_xpu=lambda: False,
        is_cpu=lambda: False, is_fp8_fnuz=lambda: False, fp8_dtype=lambda: torch.float8_e4m3fn,
        get_device_capability=lambda device_id=0: SimpleNamespace(major=arch // 10, minor=arch % 10),
        is_device_capability_family=lambda capability, device_id=0: arch // 10 == capability // 10,
        is_arch_support_pdl=lambda: arch >= 90)  # major >= 9
    module("vllm.platforms", current_platform=platform)
    module("vllm.models.deepseek_v4.nvidia.ops", cutedsl_supported=lambda: False)

    def get_fp8_min_max():
        raise AssertionError("FNUZ fp8 is not a CUDA format")

    module("vllm.model_executor.layers.quantization.utils.quant_utils", get_fp8_min_max=get_fp8_min_max)
    custom_ops = {}

    def direct_register_custom_op(op_name, op_func, *args, **kwargs):
        custom_ops[op_name] = op_func

    module("vllm.utils.torch_utils", direct_register_custom_op=direct_register_custom_op)
    # vllm/utils/deep_gemm.py: get_tma_aligned_size rounds x up to 16 bytes of element_size;
    # mqa_logits_use_mx_scales is True on the sm10x family (CUDA)
    module("vllm.utils.deep_gemm",
           get_tma_aligned_size=lambda x, element_size: _round_up(x, 16 // element_size),
           mqa_logits_use_mx_scales=lambda: platform.is_device_capability_family(100))
    for name in TREE_MODULES:
        path = tree / (name.replace(".", "/") + ".py")
        if path.is_file():
            spec = importlib.util.spec_from_file_location(name, path)
            m = importlib.util.module_from_spec(spec)
            sys.modules[name] = m
            spec.loader.exec_module(m)
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, m)
    return custom_ops


def load_ops(tree: Path, arch: int) -> tuple[dict, dict, bool]:
    """({module key: op module}, custom ops, the selector's FP8_HW at `arch`) from `tree`, in a process
    of its own (it stubs `vllm`).  The launchers' `fp8_e4m3_hw` is the tree's, with the GPU's
    capability replaced by the arch's."""
    import torch

    custom_ops = _install_vllm(tree, arch)
    e4m3 = importlib.import_module("vllm.v1.attention.ops.triton_fp8_e4m3")
    mods = {k: importlib.import_module(f"{OPS_PKG}.{k}") for k in OP_MODULES}
    e4m3._cuda_capability = lambda index: (arch // 10, arch % 10)
    hw = e4m3.fp8_e4m3_hw(torch.device("cuda", 0))
    for m in mods.values():
        m.fp8_e4m3_hw = lambda device: e4m3.fp8_e4m3_hw(torch.device("cuda", 0))
    return mods, custom_ops, hw


class _TorchWithOps:
    """torch, but `torch.ops.vllm.<op>` calls the Python implementation registered through the stub
    (fused_inv_rope_fp8_quant launches its kernel through a custom op)."""

    def __init__(self, custom_ops: dict):
        self.ops = SimpleNamespace(vllm=SimpleNamespace(**custom_ops))

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)


class _Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` records the call; its
    parameter names are the kernel's (VllmTritonJitKernel binds the launch inputs by them)."""

    def __init__(self, fn):
        self.fn, self.calls, self.arg_names = fn, [], fn.arg_names

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def _owner(mod, path: str):
    """(object holding the attribute, attribute name) of `path` ("name" or "Class.kernel") in `mod`."""
    *outer, attr = path.split(".")
    owner = mod
    for part in outer:
        owner = getattr(owner, part)
    return owner, attr


def kernel_fn(mod, path: str):
    """The @triton.jit function at `path` in `mod`."""
    owner, attr = _owner(mod, path)
    return getattr(owner, attr)


def capture(mod, paths: list[str], launch) -> dict:
    """Run `launch()` with `mod`'s kernels at `paths` recorded instead of launched: {path: calls}.
    Each attribute is restored as it was in its owner's namespace (a class keeps its staticmethod)."""
    missing = object()
    saved, recs = {}, {}
    for path in paths:
        owner, attr = _owner(mod, path)
        saved[path] = (owner, attr, vars(owner).get(attr, missing))
        recs[path] = _Recorder(getattr(owner, attr))
    try:
        for path, rec in recs.items():
            owner, attr, _ = saved[path]
            setattr(owner, attr, rec)
        launch()
    finally:
        for owner, attr, value in saved.values():
            if value is missing:
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)
    return {path: rec.calls for path, rec in recs.items()}


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


def launches(mods, arch: int, custom_ops: dict):
    """[(op, case, launch)]: V4's calls of each op's public launcher (the same calls on both lines)."""
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
    out.append(("insert", "swa block64", lambda: cu.quantize_and_insert_k_cache(
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
    out.append(("gather", "c4 block64", gather(ATTN_BLOCK // 4, attn_width, False, 0)))
    out.append(("gather", "c128 block2", gather(ATTN_BLOCK // 128, attn_width, False, 0)))
    out.append(("gather", "swa block64 gather_lens",
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
        out.append(("compress 512", f"c{ratio}", lambda r=ratio: fc.compress_norm_rope_store_triton(
            **compressor_args(HEAD, r))))
    out.append(("compress indexer", "c4",
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

    out.append(("compress two-stage", "c128 two-stage", two_stage))

    # -- the indexer query: RoPE + fp8 quant of [T, 64, 128] (attention.py's DeepseekV4Indexer) ------
    out.append(("indexer q", "64x128", lambda: fq.fused_indexer_q_rope_quant(
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

    out.append(("inv rope", "8 heads/group", inv_rope))
    return out
