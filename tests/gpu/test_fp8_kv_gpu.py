"""GPU tests of the fp8_ds_mla read path of the Triton sparse-MLA kernel.

The cache is written by vLLM 0.26.0's own op (`concat_and_cache_mla` with
kv_cache_dtype "fp8_ds_mla", from `_C_stable_libtorch.abi3.so`, loaded with
torch.ops.load_library, no `import vllm`); our kernel's output is compared with
a float64 reference computed from the dequantised bytes vLLM wrote
(tests/fp8_ds_mla_reference.py::dequant_ds_mla: code * scale, rope as stored).

- vLLM's writer vs our reference writer (byte layout, scales, rope, codes);
- real sizes: heads 8/16/64/128, top-k 512/2048, decode (split-K) and
  prefill-sized token counts, bf16 and fp16 models;
- the hardware e4m3 conversion (default on sm89+) and the software decode
  (forced, fp8_hw=False; the sm80/86 path) give identical outputs;
- a cache larger than 2**31 bytes, rows gathered from its end.

Environment (what is missing is skipped with the reason):
  SMLA_TREE        tree with vllm/v1/attention/ops/triton_sparse_mla.py (+ its
                   sibling triton_dsa_indexer.py)
  SMLA_VLLM_C_SO   vLLM 0.26.0's vllm/_C_stable_libtorch.abi3.so
  SMLA_FP8_RESULTS JSONL file: one line of figures per case
Run in a pytest process of its own (the CPU tests set TRITON_INTERPRET=1).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fp8_ds_mla_reference import (  # noqa: E402
    TILE,
    dequant_ds_mla,
    latent_like_values,
    quantize_ds_mla,
    split_ds_mla,
)
from sparse_mla_reference import load_sparse_mla_module, reference_sparse_mla, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu

R, P, ROW, BS = 512, 64, 656, 64
SCALE = 192 ** -0.5
# Same bounds as the 16-bit kernel's GPU tests (tests/gpu/test_kernel_gpu.py):
# the dequantised rows enter the dots in the model dtype.
BOUNDS = {torch.float16: 1e-3, torch.bfloat16: 5e-3}
NUM_BLOCKS = 2048  # 131072 slots, 86 MB


def record(**fig):
    path = os.environ.get("SMLA_FP8_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fig) + "\n")


@pytest.fixture(scope="module")
def smla(vllm_tree):
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set in this process: run tests/gpu separately")
    mod = load_sparse_mla_module(vllm_tree, interpret=False)
    if not hasattr(mod, "fp8_ds_mla_row_bytes"):
        pytest.fail(f"{vllm_tree}: kernel without the fp8_ds_mla read path")
    return mod


@pytest.fixture(scope="module")
def vllm_write():
    so = os.environ.get("SMLA_VLLM_C_SO")
    if not so or not Path(so).is_file():
        pytest.skip("SMLA_VLLM_C_SO is not vLLM 0.26.0's _C_stable_libtorch.abi3.so")
    torch.ops.load_library(so)
    op = torch.ops._C_cache_ops.concat_and_cache_mla
    one = torch.ones(1, dtype=torch.float32, device="cuda")

    def write(kv_c, k_pe, cache, slot_mapping):
        # as TRITON_MLA_SPARSE.do_kv_cache_update (the fp16 writers fix): bfloat16 rows
        # (the op mishandles float16 input: test_upstream_fp16_writer_scales)
        op(kv_c.to(torch.bfloat16), k_pe.to(torch.bfloat16), cache,
           slot_mapping.to(torch.int64), "fp8_ds_mla", one)

    return write


def filled_cache(vllm_write, dtype, num_blocks, n_tokens, seed, slot_lo=0):
    """uint8 [num_blocks, 64, 656] cache; n_tokens rows written by vLLM's op at
    distinct random slots >= slot_lo; returns (cache, written slots, kv_c, k_pe)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    cache = torch.zeros((num_blocks, BS, ROW), dtype=torch.uint8, device="cuda")
    n_slots = num_blocks * BS - slot_lo
    slots = slot_lo + torch.randperm(n_slots, device="cuda", generator=g)[:n_tokens]
    kv_c = latent_like_values(n_tokens, R, dtype, g, device="cuda")
    k_pe = torch.randn(n_tokens, P, device="cuda", generator=g).to(dtype)
    vllm_write(kv_c, k_pe, cache, slots)
    # what the cache holds: bfloat16 rows (the rope is read back as bfloat16)
    return cache, slots.to(torch.int32), kv_c.to(torch.bfloat16), k_pe.to(torch.bfloat16)


def pick(written, T, K, seed, hole_frac=0.05, empty_rows=()):
    g = torch.Generator(device="cuda").manual_seed(seed)
    idx = torch.randint(0, written.numel(), (T, K), device="cuda", generator=g)
    sl = written[idx]
    sl[torch.rand(T, K, device="cuda", generator=g) < hole_frac] = -1
    for r in empty_rows:
        sl[r] = -1
    return sl


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_vllm_writer_matches_reference(vllm_write, dtype):
    cache, slots, kv_c, k_pe = filled_cache(vllm_write, dtype, 64, 3000, seed=1)
    got = cache.view(-1, ROW)[slots.long()]
    want = quantize_ds_mla(kv_c, k_pe)
    gc, gs, gr = split_ds_mla(got, torch.bfloat16)
    wc, ws, wr = split_ds_mla(want, torch.bfloat16)
    # scale = max(amax / 448, FLT_MIN) in float32; vLLM's build divides with
    # fast math (H200 run 2026-11-30: not bit-identical), so within 2 ulp
    assert ((gs - ws).abs() <= ws.abs() * 2.0 ** -22).all()
    scales_identical = (gs == ws).float().mean().item()
    assert torch.equal(gr, wr)  # rope stored as is
    same = (gc == wc).float().mean().item()
    # codes: the same value, or (if vLLM's division rounds differently) the
    # neighbouring code of the same sign
    step = (gc.view(torch.float8_e4m3fn).float() - wc.view(torch.float8_e4m3fn).float()).abs()
    ulp = torch.maximum(wc.view(torch.float8_e4m3fn).float().abs(), torch.tensor(2.0 ** -6,
                        device="cuda")) * 2.0 ** -3
    assert (step <= ulp + 1e-12).all()
    record(case="writer", dtype=str(dtype), codes_identical=same,
           scales_identical=scales_identical, rows=int(slots.numel()))
    # a 1-ulp scale difference moves a code at a rounding boundary (H200: 0.9989)
    assert same > 0.99, same


CASES = [  # (heads, top-k, tokens)
    (8, 2048, 1), (16, 2048, 4), (64, 2048, 2), (128, 2048, 1),  # decode: split-K + merge
    (16, 512, 64), (128, 512, 16),
    (8, 2048, 512), (32, 2048, 128), (64, 2048, 256), (128, 2048, 128),  # prefill-sized grids
]


# bf16 (the models' dtype) on every case, fp16 on a decode and a prefill one
# (each dtype is a separate JIT compile per launch configuration).
KERNEL_CASES = ([(torch.bfloat16, *c) for c in CASES]
                + [(torch.float16, *c) for c in CASES if c in ((16, 2048, 4), (64, 2048, 256))])


@pytest.mark.parametrize("dtype,H,K,T", KERNEL_CASES,
                         ids=[f"{str(d)[6:]}-h{h}-k{k}-t{t}" for d, h, k, t in KERNEL_CASES])
def test_fp8_kernel_vs_float64(smla, vllm_write, dtype, H, K, T):
    cache, written, _, _ = filled_cache(vllm_write, dtype, NUM_BLOCKS, 40000, seed=H + K)
    slots = pick(written, T, K, seed=T, empty_rows=(0,) if T > 2 else ())
    g = torch.Generator(device="cuda").manual_seed(7)
    q = (torch.randn(T, H, R + P, device="cuda", generator=g) * 0.25).to(dtype)
    out_hw = smla.sparse_mla_fwd(q, cache, slots, SCALE, kv_cache_dtype="fp8_ds_mla",
                              rope_dtype=torch.bfloat16)
    out_sw = smla.sparse_mla_fwd(q, cache, slots, SCALE, kv_cache_dtype="fp8_ds_mla",
                                 fp8_hw=False, rope_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    deq = dequant_ds_mla(cache.view(-1, ROW), torch.bfloat16)  # float64 [slots, 576]
    ref = reference_sparse_mla(q, deq, slots, SCALE, token_chunk=8)
    err_hw, err_sw = rel_err(out_hw, ref), rel_err(out_sw, ref)
    identical = torch.equal(out_hw, out_sw)
    splits = smla._plan(dtype, q.device, T, H, K, R, None, None)[1]
    record(case="kernel", dtype=str(dtype), heads=H, topk=K, tokens=T, splits=splits,
           rel_err_hw=err_hw, rel_err_sw=err_sw, hw_sw_identical=identical)
    assert not torch.isnan(out_hw).any()
    if T > 2:
        assert (out_hw[0] == 0).all()  # a row without any valid slot
    assert err_hw < BOUNDS[dtype], err_hw
    assert err_sw < BOUNDS[dtype], err_sw
    assert identical  # both decodes are exact: same values, same dots


@pytest.mark.parametrize("dequant", [False, True], ids=["codes", "dequant"])
@pytest.mark.parametrize("H,T", [(16, 64), (32, 512), (64, 256), (128, 4)])
def test_fp8_both_kernels_vs_float64(smla, vllm_write, H, T, dequant):
    """Both fp8 kernels forced on the same vLLM-written cache: the codes
    kernel (exact codes, scales on the dot results) and the rows dequantised
    to bf16 into the 16-bit kernel (the launch table's pick for 32+ head tiles)."""
    cache, written, _, _ = filled_cache(vllm_write, torch.bfloat16, NUM_BLOCKS, 40000, seed=H)
    slots = pick(written, T, 2048, seed=T, empty_rows=(0,))
    g = torch.Generator(device="cuda").manual_seed(9)
    q = (torch.randn(T, H, R + P, device="cuda", generator=g) * 0.25).to(torch.bfloat16)
    cfg = dict(FP8_DEQUANT=dequant)
    if not dequant and H > 16:  # 17+ heads: 64-head tiles with the fp8 cache
        cfg["BLOCK_N"] = 32  # the codes kernel stages two code tiles: 64 rows do not fit
    out = smla.sparse_mla_fwd(q, cache, slots, SCALE, kv_cache_dtype="fp8_ds_mla",
                              rope_dtype=torch.bfloat16, config=cfg)
    deq = dequant_ds_mla(cache.view(-1, ROW), torch.bfloat16)
    err = rel_err(out, reference_sparse_mla(q, deq, slots, SCALE, token_chunk=8))
    record(case="fp8_kernel_choice", dequant=dequant, heads=H, tokens=T, rel_err=err)
    assert (out[0] == 0).all() and not torch.isnan(out).any()
    assert err < BOUNDS[torch.bfloat16], err


def test_fp8_cache_past_2_31_bytes(smla, vllm_write):
    """A 2.2 GB cache (53,000 blocks): every gathered row lies beyond byte 2**31."""
    num_blocks = 53000
    assert num_blocks * BS * ROW > 2 ** 31
    slot_lo = 2 ** 31 // ROW + 1
    cache, written, _, _ = filled_cache(vllm_write, torch.bfloat16, num_blocks, 20000,
                                        seed=5, slot_lo=slot_lo)
    assert int(written.min()) * ROW >= 2 ** 31
    slots = pick(written, 4, 2048, seed=6)
    g = torch.Generator(device="cuda").manual_seed(8)
    q = (torch.randn(4, 64, R + P, device="cuda", generator=g) * 0.25).to(torch.bfloat16)
    out = smla.sparse_mla_fwd(q, cache, slots, SCALE, kv_cache_dtype="fp8_ds_mla",
                              rope_dtype=torch.bfloat16)
    # reference on the used rows only (compact slot ids, -1 kept)
    used, inv = torch.unique(slots[slots >= 0].long(), return_inverse=True)
    compact = torch.full_like(slots, -1)
    compact[slots >= 0] = inv.to(torch.int32)
    deq = dequant_ds_mla(cache.view(-1, ROW)[used], torch.bfloat16)
    err = rel_err(out, reference_sparse_mla(q, deq, compact, SCALE, token_chunk=2))
    record(case="cache>2^31", bytes=num_blocks * BS * ROW, rel_err=err)
    del deq, cache
    torch.cuda.empty_cache()
    assert err < BOUNDS[torch.bfloat16], err


def test_fp8_vs_bf16_cache_same_data(smla, vllm_write):
    """Same latent rows in a bf16 cache and an fp8_ds_mla cache: the outputs
    differ by the quantisation only (recorded; loose bound)."""
    T, H, K = 16, 64, 2048
    cache, written, kv_c, k_pe = filled_cache(vllm_write, torch.bfloat16, 256, 16000, seed=9)
    bf = torch.zeros((256 * BS, R + P), dtype=torch.bfloat16, device="cuda")
    bf[written.long()] = torch.cat([kv_c, k_pe], dim=-1)
    slots = pick(written, T, K, seed=10)
    g = torch.Generator(device="cuda").manual_seed(11)
    q = (torch.randn(T, H, R + P, device="cuda", generator=g) * 0.25).to(torch.bfloat16)
    o8 = smla.sparse_mla_fwd(q, cache, slots, SCALE, kv_cache_dtype="fp8_ds_mla",
                              rope_dtype=torch.bfloat16)
    o16 = smla.sparse_mla_fwd(q, bf, slots, SCALE)
    d = rel_err(o8, o16.double())
    record(case="fp8_vs_bf16_cache", heads=H, topk=K, tokens=T, rel_diff=d)
    # e4m3 keeps 3 mantissa bits: up to 2**-4 relative per value (half an
    # ulp), ~2**-5.5 on average; the output difference is of that order
    # (H200: 0.052).  A kernel reading the wrong bytes gives ~1.
    assert d < 2.0 ** -3, d
    assert TILE == 128


def test_upstream_fp16_writer_scales():
    """Why the fp16 writers fix writes bfloat16: vLLM's concat_and_cache_mla with
    fp8_ds_mla takes float16 input's raw uint16 bits for the tile maximum, so
    the stored scale is far above amax / 448 (and the codes collapse).  When
    this test fails, upstream has fixed the op (the cast may then go)."""
    so = os.environ.get("SMLA_VLLM_C_SO")
    if not so or not Path(so).is_file():
        pytest.skip("SMLA_VLLM_C_SO is not vLLM 0.26.0's _C_stable_libtorch.abi3.so")
    torch.ops.load_library(so)
    op = torch.ops._C_cache_ops.concat_and_cache_mla
    g = torch.Generator(device="cuda").manual_seed(3)
    kv_c = latent_like_values(256, R, torch.float16, g, device="cuda")
    k_pe = torch.randn(256, P, device="cuda", generator=g).to(torch.float16)
    cache = torch.zeros((4, BS, ROW), dtype=torch.uint8, device="cuda")
    slots = torch.arange(256, device="cuda", dtype=torch.int64)
    one = torch.ones(1, dtype=torch.float32, device="cuda")
    op(kv_c, k_pe, cache, slots, "fp8_ds_mla", one)
    _, got, _ = split_ds_mla(cache.view(-1, ROW), torch.float16)
    want = (kv_c.float().view(256, 4, TILE).abs().amax(-1) / 448.0).clamp_min(
        torch.finfo(torch.float32).tiny)
    ratio = (got / want).median().item()
    record(case="upstream_fp16_writer", median_scale_ratio=ratio)
    assert ratio > 10, ratio
