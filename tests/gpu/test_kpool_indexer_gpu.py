"""GPU test (one short call on the H200) of GLM-5.3-Flash's pooled indexer
without DeepGEMM, the 0.33.0 line's patches 0014-0015: the kpool kernels'
software e4m3 encode against the GPU's conversion, and the Triton logits over
the 132-byte pooled cache against float64 (and DeepGEMM where given), with
the sm80/86 code paths forced on the H200 beside the sm89+ ones.

- pooled cache: written by vLLM's kpool writer (kpool_compress.py), one
  entry per 4 tokens, a page's fp8 values then its fp32 scales; pages of 32
  and 64 pools (the kpool kernel block sizes at kpool 4);
- queries: fwht128_quant_fp8 of bf16 rows, weights folded as the model does;
  16 heads (the Triton path does not pad them);
- "software": the writers' FP8_HW False (what sm80/86 run) and the logits'
  software fp8 decode (fp8_mma=False); "hardware": the GPU's conversion and
  fp8 tensor-core dots (sm89+).

No vLLM is installed on the GPU machine: the four kernel files are loaded
from SMLA_TREE (a 0.33.0 tree with the series, or the bundle
tests/gpu/kpool-bundle.sh writes), with stand-ins for the three vLLM helpers
kpool_compress.py imports (vllm.triton_utils: Triton itself;
vllm.utils.deep_gemm.mqa_logits_use_mx_scales: False, the H200 is no sm100;
vllm.v1.attention.ops.common.pack_ue8m0_x4: only used for MX scales).
SMLA_DEEPGEMM_DIR (optional): a folder holding `deep_gemm/` (vLLM's wheel's
vllm/third_party/deep_gemm); its paged logits are compared where it loads.
SMLA_KPOOL_RESULTS (optional): JSONL file, one line of figures per case.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sparse_mla_reference import provide_ops_package  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

H, D, KPOOL = 16, 128, 4
MAX_POOLS = 8192  # max_model_len 32k tokens
SOFTWARE_TOL = 2e-6  # exact fp8 products, fp32 sums vs float64
MMA_TOL = 5e-4  # fp8 tensor-core accumulation (DeepGEMM's own error is ~2e-4)


def record(**fig):
    print(json.dumps(fig))
    path = os.environ.get("SMLA_KPOOL_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fig) + "\n")


def load_kpool_modules(tree):
    """(kpool_compress, triton_dsa_indexer) loaded from `tree` (a 0.33.0 tree with the series, or
    the kpool bundle) with stand-ins for the vLLM helpers kpool_compress.py imports; also used by
    bench/bench_glm53.py (and its CPU smoke, under the interpreter)."""
    # imported here, not at module level: collecting this module must not import Triton before
    # the interpreter tests set TRITON_INTERPRET (Triton decorates its own library at import)
    import triton
    import triton.language as tl

    provide_ops_package(tree)
    # provide_ops_package may already have put a vllm.triton_utils stand-in there: each stand-in
    # below is installed where its module is missing, independently of the others
    if "vllm.triton_utils" not in sys.modules:
        sys.modules["vllm.triton_utils"] = types.SimpleNamespace(tl=tl, triton=triton)
    if "vllm.utils" not in sys.modules:
        utils = types.ModuleType("vllm.utils")
        utils.__path__ = []
        sys.modules["vllm.utils"] = utils
    if "vllm.utils.deep_gemm" not in sys.modules:
        dg = types.ModuleType("vllm.utils.deep_gemm")
        dg.mqa_logits_use_mx_scales = lambda: False
        sys.modules[dg.__name__] = dg
    if "vllm.v1.attention.ops.common" not in sys.modules:
        common = types.ModuleType("vllm.v1.attention.ops.common")

        @triton.jit
        def pack_ue8m0_x4(x):  # MX scales only (sm100), never compiled here
            return x.to(tl.int32, bitcast=True)

        common.pack_ue8m0_x4 = pack_ue8m0_x4
        sys.modules[common.__name__] = common
    path = Path(tree) / "vllm/models/glm5next/nvidia/ops/kpool_compress.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: SMLA_TREE must be a 0.33.0 tree (or kpool bundle)")
    spec = importlib.util.spec_from_file_location("smla_kpool_compress", path)
    kc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kc)
    assert "FP8_HW" in kc._kpool_softmax_rotate_write_cache_kernel.arg_names, "patch 0014"
    from vllm.v1.attention.ops import triton_dsa_indexer as idx

    return kc, idx


@pytest.fixture(scope="module")
def mods(vllm_tree):
    """(kpool_compress, triton_dsa_indexer) loaded from the tree."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set in this process: run tests/gpu separately")
    try:
        return load_kpool_modules(vllm_tree)
    except FileNotFoundError as e:
        pytest.fail(str(e))


@pytest.fixture
def software(mods, monkeypatch):
    """The sm80/86 encode: the kpool launchers see no fp8 conversion."""
    monkeypatch.setattr(mods[0], "fp8_e4m3_hw", lambda device: False)


def fp8_values(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.float8_e4m3fn).to(torch.float64)


def cache_views(kv: torch.Tensor):
    page = kv.shape[1]
    flat = kv.view(kv.shape[0], -1)
    return flat[:, : page * D].view(-1, page, D), flat[:, page * D:].view(torch.float32)


def pooled_cache(kc, n_pools: list[int], page: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    max_blocks = max(-(-n // page) for n in n_pools) + 1
    nblocks = len(n_pools) * max_blocks + 2
    kv = torch.randint(0, 256, (nblocks, page, D + 4), dtype=torch.uint8, device="cuda",
                       generator=gen)
    cache_views(kv)[1].copy_(torch.rand(nblocks, page, device="cuda", generator=gen))
    perm = torch.randperm(nblocks, device="cuda", generator=gen)[: len(n_pools) * max_blocks]
    bt = perm.view(len(n_pools), max_blocks).to(torch.int32)
    for b, n in enumerate(n_pools):
        keys = torch.randn(n, KPOOL, D, device="cuda", generator=gen) * 2
        gate = torch.randn(n, KPOOL, D, device="cuda", generator=gen)
        j = torch.arange(n, device="cuda")
        kc.kpool_compress_and_write_cache(
            kv, keys.to(torch.bfloat16), gate.to(torch.bfloat16),
            torch.randn(KPOOL, D, device="cuda", generator=gen),
            bt[b, j // page].long() * page + j % page, KPOOL)
    return kv, bt


def rotated_queries(kc, rows: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(rows * H, D, device="cuda", generator=gen).to(torch.bfloat16)
    q_fp8, q_scale = kc.fwht128_quant_fp8(q)
    w = torch.randn(rows, H, device="cuda", generator=gen)
    return q_fp8.view(rows, H, D), w * q_scale.view(rows, H) * (D ** -0.5 * H ** -0.5)


def ref_paged(q_fp8, kv, w, lens, bt):
    """float64 [rows, max(lens)] over each row's pools, -inf past them."""
    codes, scales = cache_views(kv)
    page, per_req = kv.shape[1], q_fp8.shape[1]
    rows = q_fp8.shape[0] * per_req
    q = fp8_values(q_fp8.reshape(rows, H, D))
    lens = lens.reshape(-1).long().tolist()
    out = torch.full((rows, max(lens)), float("-inf"), dtype=torch.float64, device="cuda")
    for r, n in enumerate(lens):
        j = torch.arange(n, device="cuda")
        phys = bt[r // per_req, j // page].long()
        s = (q[r] @ fp8_values(codes[phys, j % page]).T).clamp(min=0)
        out[r, :n] = (w[r].double()[:, None] * s).sum(0) * scales[phys, j % page]
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    m = torch.isfinite(ref)
    return float((out.double()[: ref.shape[0], : ref.shape[1]][m] - ref[m]).abs().max()
                 / ref[m].abs().max())


def pool_overlap(ours: torch.Tensor, ref: torch.Tensor, lens, k: int) -> float:
    """Mean |top-k(ours) & top-k(ref)| / k over rows (torch.topk stands in for
    vLLM's compiled pool top-k, which is not on this machine)."""
    hits = tot = 0
    for r, n in enumerate(lens.reshape(-1).tolist()):
        kk = min(k, n)
        a = set(torch.topk(ours[r, :n], kk).indices.tolist())
        b = set(torch.topk(ref[r, :n], kk).indices.tolist())
        hits, tot = hits + len(a & b), tot + kk
    return hits / max(tot, 1)


PATHS = [pytest.param(False, id="software"), pytest.param(True, id="hardware")]


@pytest.mark.parametrize("round_scale", [True, False])
def test_kpool_writers_software_equals_gpu_conversion(mods, monkeypatch, round_scale):
    """Random inputs: the sm80/86 encode writes the H200's bytes (prefill and
    decode writers, the query's fwht128_quant_fp8)."""
    kc, _ = mods
    gen = torch.Generator(device="cuda").manual_seed(0)
    keys = (torch.randn(300, KPOOL, D, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    gate = torch.randn(300, KPOOL, D, device="cuda", generator=gen).to(torch.bfloat16)
    ape = torch.randn(KPOOL, D, device="cuda", generator=gen)
    loc = torch.randperm(640, device="cuda", generator=gen)[:300]
    q = torch.randn(1000, D, device="cuda", generator=gen).to(torch.bfloat16)
    B, ring = 64, 8
    pos = (torch.arange(4, device="cuda")[None] + 4 * torch.arange(B, device="cuda")[:, None]
           + 1).to(torch.int32)  # each request completes one pool at pos % 4 == 3
    slots = torch.where(pos % KPOOL == KPOOL - 1, torch.arange(B, device="cuda")[:, None] + 7,
                        -1).to(torch.int32)
    tail_slot = (torch.arange(B, device="cuda")[:, None] * ring + pos % ring).to(torch.int32)
    dk = torch.randn(B, 4, D, device="cuda", generator=gen).to(torch.bfloat16)
    ds = torch.randn(B, 4, D, device="cuda", generator=gen).to(torch.bfloat16)
    tail0 = torch.randn(B, 2, ring, D, device="cuda", generator=gen).to(torch.bfloat16)

    def run():
        kv = torch.zeros(20, 32, D + 4, dtype=torch.uint8, device="cuda")
        kc.kpool_compress_and_write_cache(kv, keys, gate, ape, loc, KPOOL, round_scale=round_scale)
        kv2 = torch.zeros(4, 64, D + 4, dtype=torch.uint8, device="cuda")
        kc.kpool_decode_update_and_maybe_write_cache_batched(
            kv2, tail0.clone(), tail_slot, dk, ds, ape, slots, pos, KPOOL,
            round_scale=round_scale)
        q_fp8, q_scale = kc.fwht128_quant_fp8(q)
        return kv, kv2, q_fp8.view(torch.uint8), q_scale

    hw = run()
    monkeypatch.setattr(kc, "fp8_e4m3_hw", lambda device: False)
    sw = run()
    same = [torch.equal(a, b) for a, b in zip(sw, hw)]
    record(case="writers sw == hw", round_scale=round_scale, pools=300, decode_requests=B,
           query_rows=1000, identical=same)
    assert all(same)
    assert (hw[0] != 0).any() and (hw[1] != 0).any()


@pytest.mark.parametrize("fp8_mma", PATHS)
@pytest.mark.parametrize("page", [32, 64])
@pytest.mark.parametrize("next_n", [1, 2])
def test_paged_pooled_logits_vs_float64(mods, software, fp8_mma, page, next_n):
    kc, idx = mods
    pools = [8000, 4097, 31, 700, 1500]  # up to 32k tokens
    B = len(pools)
    kv, bt = pooled_cache(kc, pools, page, seed=page + next_n)
    q, w = rotated_queries(kc, B * next_n, seed=1)
    lens = torch.tensor([[n - next_n + 1 + i for i in range(next_n)] for n in pools],
                        dtype=torch.int32, device="cuda")
    logits = idx.paged_mqa_logits(q.view(B, next_n, H, D).view(torch.uint8), kv.unsqueeze(-2),
                                  w, lens, bt, MAX_POOLS, clean_logits=False, fp8_mma=fp8_mma)
    ref = ref_paged(q.view(B, next_n, H, D), kv, w, lens, bt)
    err = rel_err(logits, ref)
    ov = pool_overlap(logits, ref, lens, 512)
    record(case="paged", path="hardware" if fp8_mma else "software", page=page, next_n=next_n,
           pools=pools, heads=H, rel_vs_f64=err, top512_pool_overlap=ov)
    assert err < (MMA_TOL if fp8_mma else SOFTWARE_TOL)
    assert ov >= 0.99


@pytest.mark.parametrize("fp8_mma", PATHS)
def test_prefill_pooled_logits_vs_float64(mods, software, fp8_mma):
    """Two requests' gathered pools; causal rows over complete pools."""
    kc, idx = mods
    page, pools = 64, [3000, 900]
    kv, bt = pooled_cache(kc, pools, page, seed=5)
    codes, scales = cache_views(kv)
    k_fp8, k_scale, ks, ke, off = [], [], [], [], 0
    for b, n in enumerate(pools):
        j = torch.arange(n, device="cuda")
        phys = bt[b, j // page].long()
        k_fp8.append(codes[phys, j % page])
        k_scale.append(scales[phys, j % page])
        for p in range(n * KPOOL - 200, n * KPOOL + 3):
            ks.append(off)
            ke.append(off + (p + 1) // KPOOL)
        off += n
    k_fp8, k_scale = torch.cat(k_fp8), torch.cat(k_scale)
    ks = torch.tensor(ks, dtype=torch.int32, device="cuda")
    ke = torch.tensor(ke, dtype=torch.int32, device="cuda")
    q, w = rotated_queries(kc, ks.numel(), seed=6)
    logits = idx.mqa_logits(q, k_fp8, k_scale, w, ks, ke, clean_logits=False, fp8_mma=fp8_mma)
    s = torch.einsum("mhd,nd->mhn", fp8_values(q.view(torch.uint8)), fp8_values(k_fp8))
    ref = torch.einsum("mhn,mh->mn", s.clamp(min=0), w.double()) * k_scale.double()[None]
    n = torch.arange(off, device="cuda")
    ref = ref.masked_fill(~((n[None] >= ks[:, None]) & (n[None] < ke[:, None])), float("-inf"))
    err = rel_err(logits, ref)
    record(case="prefill", path="hardware" if fp8_mma else "software", pools=pools,
           rows=ks.numel(), heads=H, rel_vs_f64=err)
    assert err < (MMA_TOL if fp8_mma else SOFTWARE_TOL)


def test_expand_pools_and_append_tail(mods):
    """Pool ids -> their tokens, then the request's unfinished pool (the
    2176-wide rows of top-k 2048 at kpool 4), -1 for unselected pools."""
    kc, _ = mods
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows, select = 6, 512
    seq = torch.tensor([2049, 5000, 8003, 2050, 4096, 3001], dtype=torch.int32, device="cuda")
    ids = torch.stack([torch.randperm(int(s) // KPOOL, device="cuda", generator=gen)[:select]
                       for s in seq]).to(torch.int64)
    ids[0, 500:] = -1
    out = kc.expand_pools_and_append_tail(ids, seq, KPOOL)
    assert out.shape == (rows, select * KPOOL + KPOOL - 1)
    tok = (ids[:, :, None] * KPOOL + torch.arange(KPOOL, device="cuda")).reshape(rows, -1)
    tok = torch.where(ids.repeat_interleave(KPOOL, 1) >= 0, tok, -1).to(torch.int32)
    assert torch.equal(out[:, : select * KPOOL], tok)
    for r, s in enumerate(seq.tolist()):
        start = s // KPOOL * KPOOL
        want = list(range(start, s)) + [-1] * (KPOOL - 1 - (s - start))
        assert out[r, select * KPOOL:].tolist() == want


def load_deepgemm():
    d = os.environ.get("SMLA_DEEPGEMM_DIR")
    if not d or not (Path(d) / "deep_gemm" / "__init__.py").is_file():
        return None
    sys.path.insert(0, d)
    import deep_gemm

    return deep_gemm


def test_paged_pooled_logits_vs_deepgemm(mods):
    """Ours (16 heads) beside DeepGEMM (zero-padded to 32 heads, as the model
    pads for it) on the same pooled cache, both against float64."""
    dg = load_deepgemm()
    if dg is None:
        pytest.skip("SMLA_DEEPGEMM_DIR does not hold deep_gemm/ (from vLLM's wheel)")
    kc, idx = mods
    page, pools = 64, [8000, 4097, 31, 700, 1500]
    B = len(pools)
    kv, bt = pooled_cache(kc, pools, page, seed=9)
    q, w = rotated_queries(kc, B, seed=10)
    lens = torch.tensor(pools, dtype=torch.int32, device="cuda")[:, None]
    ref = ref_paged(q.view(B, 1, H, D), kv, w, lens, bt)
    # padded as bytes (torch.cat of float8 tensors is not implemented everywhere), then viewed
    codes = q.view(torch.uint8)
    q32 = torch.cat([codes, torch.zeros_like(codes)], dim=1).view(torch.float8_e4m3fn)
    q32 = q32.view(B, 1, 2 * H, D)
    w32 = torch.cat([w, torch.zeros_like(w)], dim=1)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sched = dg.get_paged_mqa_logits_metadata(lens, page, sms)
    try:  # vLLM 0.26.0's DeepGEMM takes clean_logits, 0.33.0's does not
        theirs = dg.fp8_fp4_paged_mqa_logits((q32, None), kv.unsqueeze(-2), w32, lens, bt,
                                             sched, MAX_POOLS, clean_logits=False)
    except TypeError:
        theirs = dg.fp8_fp4_paged_mqa_logits((q32, None), kv.unsqueeze(-2), w32, lens, bt,
                                             sched, MAX_POOLS)
    fig = dict(case="paged vs DeepGEMM", page=page, pools=pools,
               deepgemm_rel_vs_f64=rel_err(theirs.float(), ref))
    for mma in (False, True):
        ours = idx.paged_mqa_logits(q.view(B, 1, H, D), kv.unsqueeze(-2), w, lens, bt,
                                    MAX_POOLS, clean_logits=False, fp8_mma=mma)
        fig["hardware" if mma else "software"] = rel_err(ours, ref)
    record(**fig)
    assert fig["software"] <= max(2 * fig["deepgemm_rel_vs_f64"], SOFTWARE_TOL)
    assert fig["hardware"] <= max(2 * fig["deepgemm_rel_vs_f64"], MMA_TOL)
