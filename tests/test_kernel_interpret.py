"""CPU tests of the Triton sparse-MLA kernels under TRITON_INTERPRET=1.

Verified for Triton 3.6: TRITON_INTERPRET is read when `@triton.jit`
decorates (including triton's own `triton.language.standard` helpers, i.e. at
the first `import triton`) and again at the first interpreted launch.  It is
therefore set here, at the top of the module, before torch/triton are
imported, and it stays set for the process.  Consequence: run the GPU tests
(tests/gpu) in a separate pytest process; they skip when they see
TRITON_INTERPRET=1.
Only fp32/fp16 numerics: bf16 does not work in the interpreter (GPU tests
cover it).  Needs numpy<2.3 (see /work/shared/notes/triton-interpreter.md).
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from sparse_mla_reference import (  # noqa: E402
    load_sparse_mla_module,
    reference_convert,
    reference_sparse_mla,
    rel_err,
)

# The interpreter turns scalar kernel args into 1-element arrays; using one as
# a loop bound warns under numpy 2.2 (and fails with numpy >= 2.3).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

D, DV, NUM_SLOTS = 576, 512, 300
SCALE = D ** -0.5
# Measured under the interpreter: fp16 ~3e-4 (the output's rounding). The kernel takes
# the 16-bit dtypes MLA backends run (float32 queries are refused); bfloat16 is checked on
# the GPU (tests/gpu/): Triton's interpreter returns garbage for it (test_nope_interpret.py).
BOUNDS = {torch.float16: 1e-3}


@pytest.fixture(scope="module")
def smla(vllm_tree):
    mod = load_sparse_mla_module(vllm_tree, interpret=True)
    assert type(mod._sparse_mla_fwd_kernel).__name__ == "InterpretedFunction"
    return mod


def make_case(T, H, K, dtype, seed, hole_frac=0.3, empty_rows=(), num_slots=NUM_SLOTS):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, D, generator=g).to(dtype)
    kv = torch.randn(num_slots, D, generator=g).to(dtype)
    slots = torch.randint(0, num_slots, (T, K), generator=g, dtype=torch.int32)
    slots[torch.rand(T, K, generator=g) < hole_frac] = -1
    for r in empty_rows:
        if r < T:
            slots[r] = -1
    return q, kv, slots


def check(out, ref, slots, dtype):
    assert not torch.isnan(out).any()
    empty = (slots < 0).all(dim=1)
    assert (out[empty] == 0).all()
    err = rel_err(out, ref)
    assert err < BOUNDS[dtype], err
    return err


@pytest.mark.parametrize("dtype", [torch.float16])
@pytest.mark.parametrize("H", [1, 3, 16, 20])
@pytest.mark.parametrize("K", [16, 40, 64])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_sparse_mla_fwd(smla, dtype, H, K, num_splits):
    T = 3
    q, kv, slots = make_case(T, H, K, dtype, seed=H * 1000 + K, empty_rows=(1,))
    out = torch.full((T, H, DV), float("nan"), dtype=dtype)
    res = smla.sparse_mla_fwd(q, kv, slots, SCALE, out=out, num_splits=num_splits)
    assert res.data_ptr() == out.data_ptr()
    check(out, reference_sparse_mla(q, kv, slots, SCALE), slots, dtype)


@pytest.mark.parametrize("T", [1, 2, 5])
def test_default_heuristic(smla, T):
    # num_splits=None: the heuristic (splits on CPU because of the small grid).
    q, kv, slots = make_case(T, 16, 64, torch.float16, seed=T, empty_rows=(0,))
    out = smla.sparse_mla_fwd(q, kv, slots, SCALE)
    assert out.shape == (T, 16, DV) and out.dtype == torch.float16
    check(out, reference_sparse_mla(q, kv, slots, SCALE), slots, torch.float16)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_block_h64_dv256(smla, num_splits):
    # The H >= 64 configuration (BLOCK_H=64, BLOCK_DV=256 column split) with a
    # masked head block and a 3-head tensor.
    q, kv, slots = make_case(2, 3, 40, torch.float16, seed=7, empty_rows=(1,))
    out = torch.full((2, 3, DV), float("nan"), dtype=torch.float16)
    smla.sparse_mla_fwd(q, kv, slots, SCALE, out=out, num_splits=num_splits,
                        config=dict(BLOCK_H=64, BLOCK_DV=256, BLOCK_N=16))
    check(out, reference_sparse_mla(q, kv, slots, SCALE), slots, torch.float16)


def test_paged_cache_and_strides(smla):
    # 3-D cache [num_blocks, block_size, 576] with padded strides, a strided q
    # (non-contiguous token/head strides) and a strided out.
    T, H, K, bs, nb = 2, 5, 40, 16, 20
    g = torch.Generator().manual_seed(3)
    kv_big = torch.randn(nb, bs + 3, D + 64, generator=g).half()
    kv = kv_big[:, :bs, :D]
    q = torch.randn(H, T, D + 8, generator=g).half().transpose(0, 1)[:, :, :D]
    slots = torch.randint(0, nb * bs, (T, K), generator=g, dtype=torch.int32)
    slots[:, ::3] = -1
    out_big = torch.full((T, H + 1, DV + 16), float("nan"), dtype=torch.float16)
    out = out_big[:, :H, :DV]
    smla.sparse_mla_fwd(q, kv, slots, SCALE, out=out, num_splits=2)
    ref = reference_sparse_mla(q, kv.contiguous(), slots, SCALE)
    check(out, ref, slots, torch.float16)
    assert torch.isnan(out_big[:, H:]).all() and torch.isnan(out_big[:, :, DV:]).all()


def test_all_rows_empty_and_k_zero(smla):
    q, kv, slots = make_case(2, 4, 16, torch.float16, seed=5)
    slots.fill_(-1)
    for ns in (1, 2):
        out = torch.full((2, 4, DV), float("nan"), dtype=torch.float16)
        smla.sparse_mla_fwd(q, kv, slots, SCALE, out=out, num_splits=ns)
        assert (out == 0).all()
    out = torch.full((2, 4, DV), float("nan"), dtype=torch.float16)
    smla.sparse_mla_fwd(q, kv, slots[:, :0].contiguous(), SCALE, out=out)
    assert (out == 0).all()


def test_single_valid_entry(smla):
    # One valid slot: softmax weight 1, output = that latent row exactly.
    q, kv, slots = make_case(1, 2, 40, torch.float16, seed=9)
    slots.fill_(-1)
    slots[0, 37] = 123
    out = smla.sparse_mla_fwd(q, kv, slots, SCALE, num_splits=3)
    torch.testing.assert_close(out[0], kv[123, :DV].expand(2, DV), rtol=0, atol=0)


def test_float32_query_refused(smla):
    q, kv, slots = make_case(1, 2, 16, torch.float32, seed=4)
    with pytest.raises(AssertionError, match="float32"):
        smla.sparse_mla_fwd(q, kv, slots, SCALE)


@pytest.mark.parametrize("K", [1, 40, 128, 300])
def test_convert_req_local_to_slots(smla, K):
    g = torch.Generator().manual_seed(K)
    T, R, max_blocks, bs = 4, 3, 5, 16
    block_table = torch.randint(0, 1000, (R, max_blocks), generator=g, dtype=torch.int32)
    req_id = torch.tensor([2, 0, 1, 2], dtype=torch.int32)
    # positions up to 2x the table's reach: some blocks are out of range
    topk = torch.randint(0, 2 * max_blocks * bs, (T, K), generator=g, dtype=torch.int32)
    topk[torch.rand(T, K, generator=g) < 0.2] = -1
    topk[0, 0] = -1
    topk[1, -1] = max_blocks * bs  # first out-of-range position
    topk[2, -1] = max_blocks * bs - 1  # last in-range position
    out = smla.convert_req_local_to_slots(req_id, block_table, topk, bs)
    ref = reference_convert(req_id, block_table, topk, bs)
    assert out.dtype == torch.int32
    assert torch.equal(out, ref)
    assert out[0, 0] == -1 and out[1, -1] == -1 and out[2, -1] >= 0


def test_convert_then_attend(smla):
    # End to end: request-local top-k -> slots (paged cache) -> attention.
    g = torch.Generator().manual_seed(11)
    T, H, K, bs, nb = 3, 16, 32, 16, 12
    kv = torch.randn(nb, bs, D, generator=g).half()
    block_table = torch.randperm(nb, generator=g)[:8].view(2, 4).to(torch.int32)
    req_id = torch.tensor([0, 1, 1], dtype=torch.int32)
    topk = torch.randint(0, 4 * bs, (T, K), generator=g, dtype=torch.int32)
    topk[:, 5:9] = -1
    slots = smla.convert_req_local_to_slots(req_id, block_table, topk, bs)
    q = torch.randn(T, H, D, generator=g).half()
    out = smla.sparse_mla_fwd(q, kv, slots, SCALE)
    check(out, reference_sparse_mla(q, kv, slots, SCALE), slots, torch.float16)


def test_heuristic_bounds(smla):
    cfg = smla.sparse_mla_config
    cpu = torch.device("cpu")
    # big prefill: no split workspace
    assert cfg(64, 8192, 2048, torch.bfloat16, cpu)["num_splits"] == 1
    c = cfg(128, 1, 2048, torch.bfloat16, cpu)
    assert c["BLOCK_H"] == 64 and c["num_splits"] >= 1
    assert cfg(8, 1, 2048, torch.float16, cpu)["BLOCK_H"] == 16
    # Off CUDA there is no SM count: no made-up GPU, the grid counts as full
    # (one token would otherwise be split to fill the SMs).
    assert cfg(16, 1, 2048, torch.float16, cpu)["num_splits"] == 1
    assert smla._device_info(cpu) == (None, None)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_split_query_in_place(smla, num_splits):
    # vLLM 0.26.0's MLA layer hands forward_mqa (ql_nope, q_pe): ql_nope is a
    # transposed bmm output [T, H, 512] with head stride T*512, q_pe a slice of
    # the projected query.  The kernel must read both in place and give the
    # same result as on the concatenated query.
    T, H, K = 3, 16, 40
    q, kv, slots = make_case(T, H, K, torch.float16, seed=21, empty_rows=(2,))
    ql_nope = q[..., :DV].transpose(0, 1).contiguous().transpose(0, 1)
    g = torch.Generator().manual_seed(22)
    q_wide = torch.randn(T, H, 192 + 64, generator=g).half()
    q_wide[..., 192:] = q[..., DV:]
    q_pe = q_wide[..., 192:]
    assert not ql_nope.is_contiguous() and not q_pe.is_contiguous()
    out = torch.full((T, H, DV), float("nan"), dtype=torch.float16)
    res = smla.sparse_mla_fwd(ql_nope, kv, slots, SCALE, out=out, q_pe=q_pe,
                              num_splits=num_splits)
    assert res.data_ptr() == out.data_ptr()
    check(out, reference_sparse_mla(q, kv, slots, SCALE), slots, torch.float16)
    whole = smla.sparse_mla_fwd(q, kv, slots, SCALE, num_splits=num_splits)
    assert torch.equal(out, whole)


def test_scratch_buffer_is_used(smla):
    # With a caller-owned scratch buffer the split-K partials go there (its
    # contents change) and the result matches the allocating path.
    T, H, K = 2, 16, 256  # >= 4 tiles of any BLOCK_N the heuristic picks
    q, kv, slots = make_case(T, H, K, torch.float16, seed=31)
    need = smla.sparse_mla_scratch_numel(T, H, K, torch.float16, torch.device("cpu"),
                                         num_splits=4)
    assert need == T * H * 4 * (DV + 1)
    scratch = torch.full((need + 7,), float("nan"))
    out = smla.sparse_mla_fwd(q, kv, slots, SCALE, num_splits=4, scratch=scratch)
    assert not torch.isnan(scratch[:need]).all()
    assert torch.isnan(scratch[need:]).all()
    ref = smla.sparse_mla_fwd(q, kv, slots, SCALE, num_splits=4)
    assert torch.equal(out, ref)
    with pytest.raises(AssertionError):
        smla.sparse_mla_fwd(q, kv, slots, SCALE, num_splits=4, scratch=scratch[: need - 1])
    # No split: no scratch needed.
    assert smla.sparse_mla_scratch_numel(T, H, K, torch.float16, torch.device("cpu"),
                                         num_splits=1) == 0


def test_convert_into_given_buffer(smla):
    g = torch.Generator().manual_seed(41)
    block_table = torch.randint(0, 100, (2, 4), generator=g, dtype=torch.int32)
    req_id = torch.tensor([1, 0, 1], dtype=torch.int32)
    topk = torch.randint(-1, 64, (3, 50), generator=g, dtype=torch.int32)
    out = torch.full((3, 50), 12345, dtype=torch.int32)
    res = smla.convert_req_local_to_slots(req_id, block_table, topk, 16, out=out)
    assert res.data_ptr() == out.data_ptr()
    assert torch.equal(out, reference_convert(req_id, block_table, topk, 16))
