"""CPU tests of the Triton sparse-MLA kernel for NoPE models (GLM-5.3-Flash: kv_lora_rank 512,
qk_rope_head_dim 0, so the attention selector gets head size 512) under TRITON_INTERPRET=1 (set
before torch/triton are imported: see tests/test_kernel_interpret.py), against float64.

- 16-bit cache ([.., 512] rows), fp16: the query alone ([T, H, 512]) and the MLA layer's
  (ql_nope, q_pe) pair with q_pe [T, H, 0] split off the query as MLAAttention does; flat and
  paged caches (padded block stride); split-K.
- fp8_ds_mla cache: 656-byte rows as vLLM 0.33.0's writer lays out NoPE rows (512 e4m3 codes, four
  float32 scales, then the 128-byte rope space, which the writer zeroes; here it holds NaN bits, so
  a kernel that read it would fail); both fp8 kernels (codes into the dots; rows dequantised into
  the 16-bit kernel), the hardware and the software e4m3 decode, fp16 queries, and bf16 queries
  for the codes kernel (its dots are float16; see below).
- GLM-5.3-Flash's top-k buffer: round_up(index_topk + kpool - 1, 128) columns (2176 for top-k 2048,
  kpool 4): pool-expanded token slots with -1 for pools past the context, the kpool - 1 tail tokens
  of the unfinished pool, -1 padding, a token without any valid slot. The tail entries must count.

bfloat16 through the 16-bit kernel is not checked here: Triton's interpreter returns garbage for
its bf16 dots (measured on this machine: relative error ~6e9 under Triton 3.6 and 3.8 alike, for
the NoPE and the existing head-576 kernel; /work/shared/notes/triton-interpreter.md). The GPU test
(tests/gpu/test_nope_gpu.py) covers bf16.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from fp8_ds_mla_reference import dequant_ds_mla, latent_like_values, quantize_ds_mla  # noqa: E402
from sparse_mla_reference import load_sparse_mla_module, reference_sparse_mla, rel_err  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

R = 512  # kv_lora_rank = head size (NoPE)
QK_NOPE = 256  # GLM-5.3-Flash's qk_nope_head_dim: the softmax scale's head dim
SCALE = QK_NOPE ** -0.5
ROW = 656  # fp8_ds_mla bytes per slot, NoPE too
ROPE_SPACE = slice(R + 16, ROW)
KPOOL, ALIGN = 4, 128
# Measured under the interpreter: fp16 ~3e-4 (output rounding); bf16 output ~3e-3.
BOUNDS = {torch.float16: 1e-3, torch.bfloat16: 5e-3}


@pytest.fixture(scope="module")
def smla(vllm_tree):
    mod = load_sparse_mla_module(vllm_tree, interpret=True)
    assert type(mod._sparse_mla_fwd_kernel).__name__ == "InterpretedFunction"
    return mod


def topk_buffer(T: int, num_slots: int, topk: int, g: torch.Generator) -> torch.Tensor:
    """int32 [T, round_up(topk + KPOOL - 1, 128)] as GLM-5.3-Flash's pooled indexer leaves it;
    token 0 has no valid entry."""
    width = -(-(topk + KPOOL - 1) // ALIGN) * ALIGN
    slots = torch.full((T, width), -1, dtype=torch.int32)
    pools = torch.randint(0, num_slots // KPOOL, (T, topk // KPOOL), generator=g, dtype=torch.int32)
    pools[torch.rand(pools.shape, generator=g) < 0.3] = -1
    tokens = pools[..., None] * KPOOL + torch.arange(KPOOL, dtype=torch.int32)
    slots[:, :topk] = torch.where(pools[..., None] >= 0, tokens, -1).view(T, -1)
    slots[:, topk:topk + KPOOL - 1] = torch.randint(0, num_slots, (T, KPOOL - 1), generator=g,
                                                    dtype=torch.int32)
    slots[0] = -1
    return slots


def layer_query(T: int, H: int, dtype: torch.dtype, g: torch.Generator):
    """(ql_nope [T, H, 512] token-major from a head-major bmm, q_pe [T, H, 0] split off the
    query) as MLAAttention hands them to forward_mqa for a NoPE model."""
    ql = (torch.randn(H, T, R, generator=g) * 0.25).to(dtype).transpose(0, 1)
    q = torch.randn(T, H, QK_NOPE, generator=g).to(dtype)
    return ql, q.split([QK_NOPE, 0], dim=-1)[1]


def check(out, ref, slots, dtype):
    assert not torch.isnan(out).any()
    assert (out[(slots < 0).all(dim=1)] == 0).all()
    err = rel_err(out, ref)
    assert err < BOUNDS[dtype], err
    return err


def test_16bit_full_topk_buffer(smla):
    """GLM-5.3-Flash's 2176-wide buffer (top-k 2048) on a 16-bit [slots, 512] cache, the query
    alone; the tail columns change the result."""
    g = torch.Generator().manual_seed(1)
    T, H, n = 2, 16, 2048
    q = (torch.randn(T, H, R, generator=g) * 0.25).to(torch.float16)
    kv = torch.randn(n, R, generator=g).to(torch.float16)
    slots = topk_buffer(T, n, 2048, g)
    assert slots.shape[1] == 2176
    out = smla.sparse_mla_fwd(q, kv, slots, SCALE)
    check(out, reference_sparse_mla(q, kv, slots, SCALE), slots, torch.float16)
    cut = slots.clone()
    cut[:, 2048:] = -1
    assert rel_err(out, reference_sparse_mla(q, kv, cut, SCALE)) > 10 * BOUNDS[torch.float16]


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("H", [3, 20])
def test_16bit_layer_query_paged(smla, H, num_splits):
    """(ql_nope, q_pe [T, H, 0]) into a caller's output, a paged [blocks, 64, 512] cache at a
    padded block stride, split-K."""
    g = torch.Generator().manual_seed(H * 10 + num_splits)
    T, nb, bs = 3, 6, 64
    backing = torch.randn(nb, bs * R + 64, generator=g).to(torch.float16)
    cache = backing[:, :bs * R].view(nb, bs, R)
    slots = topk_buffer(T, nb * bs, 128, g)
    ql, q_pe = layer_query(T, H, torch.float16, g)
    out = torch.full((T, H, R), float("nan"), dtype=torch.float16)
    smla.sparse_mla_fwd(ql, cache, slots, SCALE, out=out, q_pe=q_pe, num_splits=num_splits)
    check(out, reference_sparse_mla(ql, cache, slots, SCALE), slots, torch.float16)


def nope_fp8_cache(n: int, dtype: torch.dtype, g: torch.Generator):
    """uint8 [n, 656] NoPE rows (rope space: NaN bits) and their float64 latent [n, 512]."""
    rows = quantize_ds_mla(latent_like_values(n, R, dtype, g), torch.zeros(n, 64, dtype=dtype))
    rows[:, ROPE_SPACE] = 0xFF
    codes = rows.clone()
    codes[:, ROPE_SPACE] = 0
    return rows, dequant_ds_mla(codes, dtype)[:, :R]


@pytest.mark.parametrize("dequant", [False, True], ids=["codes", "dequant"])
@pytest.mark.parametrize("hw", [False, True], ids=["software", "hardware"])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_fp8_ds_mla(smla, dequant, hw, num_splits):
    g = torch.Generator().manual_seed(2 * dequant + hw + 4 * num_splits)
    T, H, n = 2, 16, 400
    rows, latent = nope_fp8_cache(n, torch.float16, g)
    assert rows.shape[1] == smla.fp8_ds_mla_row_bytes(R, 0) == ROW
    slots = topk_buffer(T, n, 128, g)
    ql, q_pe = layer_query(T, H, torch.float16, g)
    out = torch.empty((T, H, R), dtype=torch.float16)
    smla.sparse_mla_fwd(ql, rows.view(n // 16, 16, ROW), slots, SCALE, out=out, q_pe=q_pe,
                        kv_cache_dtype="fp8_ds_mla", fp8_hw=hw, num_splits=num_splits,
                        config=dict(FP8_DEQUANT=dequant))
    check(out, reference_sparse_mla(ql, latent, slots, SCALE), slots, torch.float16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_ds_mla_codes_full_buffer(smla, dtype):
    """The codes kernel (float16 dots, so a bf16 query runs in the interpreter too) over the
    whole 2176-wide buffer, the query alone."""
    g = torch.Generator().manual_seed(5)
    n = 1024
    rows, latent = nope_fp8_cache(n, dtype, g)
    slots = topk_buffer(2, n, 2048, g)[1:]  # one token with valid slots
    q = (torch.randn(1, 16, R, generator=g) * 0.25).to(dtype)
    out = smla.sparse_mla_fwd(q, rows, slots, SCALE, kv_cache_dtype="fp8_ds_mla", fp8_hw=False,
                              config=dict(FP8_DEQUANT=False))
    check(out, reference_sparse_mla(q, latent, slots, SCALE), slots, dtype)


def test_rejects_mismatched_rows(smla):
    """NoPE queries need 512-wide 16-bit rows and 656-byte fp8_ds_mla rows."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 16, R, generator=g).to(torch.float16)
    slots = torch.zeros(1, 16, dtype=torch.int32)
    with pytest.raises(AssertionError):  # a 576-wide cache with a rope-less query
        smla.sparse_mla_fwd(q, torch.zeros(16, R + 64, dtype=torch.float16), slots, SCALE)
    with pytest.raises(AssertionError):  # rows without the rope space
        smla.sparse_mla_fwd(q, torch.zeros(16, R + 16, dtype=torch.uint8), slots, SCALE,
                            kv_cache_dtype="fp8_ds_mla")
