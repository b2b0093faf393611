"""CPU tests of the fp8_ds_mla read path of the Triton sparse-MLA kernel
(TRITON_INTERPRET=1; see tests/test_kernel_interpret.py for why the variable
is set here, before torch/triton are imported, and why GPU tests need their
own process).

- Dequantisation (the kernel's own `_ds_mla_codes` / `_ds_mla_scale`, driven by a tiny test
  kernel that multiplies its codes by its scale): every one of the 256 e4m3
  codes against torch's float8_e4m3fn -> float32 conversion, times the
  per-128-value float32 scale read from the slot's bytes 512..527.  Exact
  equality (one float32 rounding on both sides); the codes come out of the
  helper as exact 16-bit numbers.
  The software decode (sm80/86) is checked for all 256 codes, NaN codes
  included; the hardware-conversion variant (sm89+) for the 254 finite codes
  (the interpreter emulates fp8 without e4m3fn's NaN codes; NaN codes never
  occur in a cache the writer saturates; GPU test covers the real conversion).
- The reference writer (tests/fp8_ds_mla_reference.py) against the byte
  layout: field positions and values decoded by hand.
- The whole kernel on small fp8_ds_mla caches (flat and paged, a padded block
  stride, holes, empty rows, split-K) against a float64 reference computed on
  the dequantised values.  fp16 only: bf16 does not run in the interpreter.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

import lineproofs  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from fp8_ds_mla_reference import (  # noqa: E402
    FP8_MAX,
    TILE,
    dequant_ds_mla,
    latent_like_values,
    quantize_ds_mla,
    row_bytes,
    split_ds_mla,
    write_ds_mla,
)
from sparse_mla_reference import load_sparse_mla_module, reference_sparse_mla, rel_err  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

R, P = 512, 64
D = R + P
ROW = 656
SCALE = 192 ** -0.5
# fp16 (query, dequantised rows, output): measured ~3e-4 under the interpreter.
FP16_BOUND = 1e-3


@pytest.fixture(scope="module")
def smla(vllm_tree):
    mod = load_sparse_mla_module(vllm_tree, interpret=True)
    assert type(mod._sparse_mla_fwd_kernel).__name__ == "InterpretedFunction"
    if not hasattr(mod, "_ds_mla_codes"):
        pytest.fail(f"{vllm_tree}: the kernel has no fp8_ds_mla read path")
    return mod


# the kernel module's helpers, bound by the fixture below
_ds_mla_codes = _ds_mla_scale = _fp8_tile_order = _fp8_tile_unorder = _fp8_tile_columns = None


@triton.jit
def _dequant_rows(kv_ptr, out_ptr, n_rows, stride_row, BLOCK_N: tl.constexpr,
                  D_NOPE: tl.constexpr, FP8_HW: tl.constexpr):
    """Test driver: float32 [n_rows, D_NOPE] = codes * scale of the kernel's
    _ds_mla_codes / _ds_mla_scale for each 128-value tile of the fp8_ds_mla
    rows at kv_ptr (row stride in bytes); the codes float16, as the kernel
    feeds them to its dots (the software decode's element-wise form: the
    interpreter runs no PTX), put back in column order (_fp8_tile_unorder)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = rows < n_rows
    row = kv_ptr + rows.to(tl.int64) * stride_row
    offs = tl.arange(0, 128)
    for tile in tl.static_range(D_NOPE // 128):
        codes = _fp8_tile_unorder(_ds_mla_codes(row, tile * 128, valid, FP8_HW, False))
        scale = _ds_mla_scale(row, tile * 128, valid, D_NOPE, FP8_HW)
        x = codes.to(tl.float32) * scale[:, None]
        tl.store(out_ptr + rows[:, None] * D_NOPE + tile * 128 + offs[None, :], x,
                 mask=valid[:, None])


@pytest.fixture(scope="module")
def dequant_kernel(smla):
    global _ds_mla_codes, _ds_mla_scale, _fp8_tile_unorder
    # the interpreter resolves globals at run time
    _ds_mla_codes, _ds_mla_scale = smla._ds_mla_codes, smla._ds_mla_scale
    _fp8_tile_unorder = smla._fp8_tile_unorder

    def run(rows: torch.Tensor, hw: bool) -> torch.Tensor:
        out = torch.full((rows.shape[0], R), float("nan"))
        _dequant_rows[(triton.cdiv(rows.shape[0], 4),)](
            rows, out, rows.shape[0], rows.stride(0), BLOCK_N=4, D_NOPE=R, FP8_HW=hw)
        return out

    return run


def all_code_rows(scales: torch.Tensor) -> torch.Tensor:
    """8 rows = every code 16 times, each row with its own 4 scales."""
    codes = torch.arange(256, dtype=torch.int32).repeat(16).view(8, R).to(torch.uint8)
    rows = torch.zeros((8, ROW), dtype=torch.uint8)
    rows[:, :R] = codes
    rows[:, R:R + 16] = scales.view(torch.uint8).view(8, 16)
    return rows


SCALES = torch.tensor(
    [[1.0, 2.0 ** -7, 3.5, 1e-3], [448.0 ** -1, 1e-30, 2.0 ** 20, 0.37],
     [torch.finfo(torch.float32).tiny, 1.0, 1.0, 1.0], [0.125, 0.25, 0.5, 2.0]] * 2,
    dtype=torch.float32)


@pytest.mark.parametrize("hw", [False, True], ids=["software", "hardware"])
def test_dequant_all_codes_exact(dequant_kernel, hw):
    rows = all_code_rows(SCALES)
    out = dequant_kernel(rows, hw)
    codes = rows[:, :R]
    ref = codes.view(torch.float8_e4m3fn).float() * SCALES.repeat_interleave(TILE, dim=1)
    nan_code = (codes & 0x7F) == 0x7F
    if hw:
        keep = ~nan_code
        assert torch.equal(out[keep], ref[keep])
    else:
        assert torch.isnan(out[nan_code]).all()
        assert torch.equal(out[~nan_code], ref[~nan_code])
    # the scale of column c is scale[c // 128]: a wrong tile index changes the value
    one = rows.clone()
    one[:, :R] = 0x38  # e4m3 1.0
    got = dequant_kernel(one, hw)
    assert torch.equal(got, SCALES.repeat_interleave(TILE, dim=1))


def test_dequant_masks_rows(dequant_kernel):
    rows = all_code_rows(SCALES)[:5]  # last program: 1 valid row of 4
    out = dequant_kernel(rows, False)
    ref = rows[:, :R].view(torch.float8_e4m3fn).float() * SCALES[:5].repeat_interleave(TILE, 1)
    fin = torch.isfinite(ref)
    assert torch.equal(out[fin], ref[fin])


@triton.jit
def _tile_order_rows(x_ptr, y_ptr, z_ptr, c_ptr, R_: tl.constexpr, C: tl.constexpr):
    """Test driver: y = _fp8_tile_order(x), z = _fp8_tile_unorder(y), [R_, C] float32;
    c = _fp8_tile_columns(C)."""
    offs = tl.arange(0, R_)[:, None] * C + tl.arange(0, C)[None, :]
    y = _fp8_tile_order(tl.load(x_ptr + offs))
    tl.store(y_ptr + offs, y)
    tl.store(z_ptr + offs, _fp8_tile_unorder(y))
    tl.store(c_ptr + tl.arange(0, C), _fp8_tile_columns(C))


@pytest.mark.parametrize("C", [128, 512])
def test_fp8_tile_order(smla, C):
    """The fp8 paths' 16-bit tiles (the codes kernel's 128 columns, the dequantised rows' 512)
    hold column 16j + 8a + e at (C/2)a + 8j + e (each lane's two 16-byte chunks C/16 apart:
    conflict-free shared stores); _fp8_tile_unorder puts them back and _fp8_tile_columns names
    them (the dequantising path's query loads and output stores)."""
    global _fp8_tile_order, _fp8_tile_unorder, _fp8_tile_columns
    _fp8_tile_order, _fp8_tile_unorder = smla._fp8_tile_order, smla._fp8_tile_unorder
    _fp8_tile_columns = smla._fp8_tile_columns
    x = torch.arange(4 * C, dtype=torch.float32).view(4, C)
    y, z = torch.empty_like(x), torch.empty_like(x)
    cols = torch.empty(C, dtype=torch.int32)
    _tile_order_rows[(1,)](x, y, z, cols, R_=4, C=C)
    a, j, e = torch.meshgrid(torch.arange(2), torch.arange(C // 16), torch.arange(8),
                             indexing="ij")
    src = (16 * j + 8 * a + e).reshape(-1)  # new column (C/2)a + 8j + e, in order
    assert torch.equal(y, x[:, src])
    assert torch.equal(z, x)
    assert torch.equal(cols.long(), src)


def test_reference_writer_layout():
    g = torch.Generator().manual_seed(0)
    kv_c = latent_like_values(6, R, torch.float16, g)
    kv_c[3, 128:256] = 0  # an all-zero tile: scale FLT_MIN, codes 0
    k_pe = torch.randn(6, P, generator=g).to(torch.float16)
    rows = quantize_ds_mla(kv_c, k_pe)
    assert rows.shape == (6, ROW) and row_bytes() == ROW
    codes, scales, rope = split_ds_mla(rows, torch.float16)
    # scale = amax / 448 per tile; the largest magnitude maps to code +-448
    amax = kv_c.float().view(6, 4, TILE).abs().amax(-1)
    assert torch.equal(scales[amax > 0], (amax / FP8_MAX)[amax > 0])
    assert scales[3, 1] == torch.finfo(torch.float32).tiny
    assert (codes[3, 128:256] == 0).all()
    vals = codes.view(torch.float8_e4m3fn).float().view(6, 4, TILE)
    assert torch.equal(vals.abs().amax(-1)[amax > 0], torch.full_like(amax, FP8_MAX)[amax > 0])
    assert torch.equal(rope, k_pe)  # rope bits stored as they are
    # dequantised latent within e4m3's half-ulp (2**-4 relative) of the input
    deq = dequant_ds_mla(rows, torch.float16)
    x = kv_c.double()
    err = (deq[:, :R] - x).abs()
    tol = x.abs() * 2.0 ** -4 + scales.double().repeat_interleave(TILE, 1) * 2.0 ** -9
    assert (err <= tol).all()
    assert torch.equal(deq[:, R:], k_pe.double())


def make_cache(num_blocks, block_size, n_tokens, seed, block_pad=0):
    """Paged fp8_ds_mla cache (uint8 [nb, bs, 656], block stride padded by
    `block_pad` bytes) holding n_tokens rows at random slots, + the float64
    dequantised view of every slot [nb * bs, 576]."""
    g = torch.Generator().manual_seed(seed)
    backing = torch.zeros((num_blocks, block_size * ROW + block_pad), dtype=torch.uint8)
    cache = backing[:, :block_size * ROW].view(num_blocks, block_size, ROW)
    if block_pad:
        assert not cache.is_contiguous()
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n_tokens]
    kv_c = latent_like_values(n_tokens, R, torch.float16, g)
    k_pe = torch.randn(n_tokens, P, generator=g).to(torch.float16)
    write_ds_mla(kv_c, k_pe, cache, slots)
    deq = dequant_ds_mla(cache.reshape(-1, ROW), torch.float16)
    return cache, deq, slots.to(torch.int32)


def make_query(T, H, K, filled_slots, seed, hole_frac=0.3, empty_rows=()):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(T, H, D, generator=g) * 0.25).to(torch.float16)
    pick = torch.randint(0, filled_slots.numel(), (T, K), generator=g)
    sl = filled_slots[pick].clone()
    sl[torch.rand(T, K, generator=g) < hole_frac] = -1
    for r in empty_rows:
        sl[r] = -1
    return q, sl


def run_and_check(smla, q, cache, deq, slots, **kw):
    T, H, _ = q.shape
    out = torch.full((T, H, R), float("nan"), dtype=torch.float16)
    res = smla.sparse_mla_fwd(q, cache, slots, SCALE, out=out, kv_cache_dtype="fp8_ds_mla", **kw)
    assert res.data_ptr() == out.data_ptr()
    assert not torch.isnan(out).any()
    empty = (slots < 0).all(dim=1)
    assert (out[empty] == 0).all()
    ref = reference_sparse_mla(q, deq, slots, SCALE)
    err = rel_err(out, ref)
    assert err < FP16_BOUND, err
    return err


@pytest.mark.parametrize("H", [3, 16, 20])
@pytest.mark.parametrize("K", [16, 40])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("hw", [False, True], ids=["software", "hardware"])
def test_kernel_fp8_paged(smla, H, K, num_splits, hw):
    cache, deq, filled = make_cache(4, 16, 50, seed=H * 100 + K, block_pad=48)
    q, slots = make_query(3, H, K, filled, seed=K, empty_rows=(1,))
    run_and_check(smla, q, cache, deq, slots, num_splits=num_splits, fp8_hw=hw)


@pytest.mark.parametrize("dequant", [False, True], ids=["codes", "dequant"])
@pytest.mark.parametrize("H", [20, 40])
def test_kernel_fp8_both_kernels(smla, H, dequant):
    """Both fp8 kernels (codes into the dots; rows dequantised into the
    16-bit kernel) on the same
    cache, forced either way, with and without split-K."""
    cache, deq, filled = make_cache(4, 16, 50, seed=H + 1, block_pad=48)
    q, slots = make_query(3, H, 40, filled, seed=H, empty_rows=(1,))
    for ns in (1, 2):
        run_and_check(smla, q, cache, deq, slots, num_splits=ns, fp8_hw=False,
                      config=dict(FP8_DEQUANT=dequant))
    # the launch table's pick for this tile on the software path (the
    # interpreter: no SM count, so the long-grid tiles; sm90's shared memory)
    tile = "h32" if H <= 32 else "h64"
    want = smla._FP8_KERNELS[smla._FP8_TILES.get(tile, tile)][1] == "fp8-dequant"
    assert smla.sparse_mla_config(H, 3, 40, torch.float16, torch.device("cpu"),
                                  "fp8_ds_mla")["FP8_DEQUANT"] == want


def test_fp8_codes_tile_register_cap(smla):
    """The codes kernel's register cap (maxnreg 168) comes with the <= 16-head tile on ~227 KB
    parts (sm90), for long and short grids alike (both measured on the H200); no other part,
    kernel or cache gets one (a cap spills registers: it is measured per part)."""
    cfg, bf16 = smla._config_for, torch.bfloat16
    for T in (1, 256, 4096):
        got = cfg(16, T, 2048, bf16, 132, (9, 0), kv_fp8=True)
        assert not got["FP8_DEQUANT"], T
        assert (got["BLOCK_N"], got["num_warps"], got["maxnreg"]) == (32, 4, 168), T
    for cap in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0)):
        assert cfg(16, 4096, 2048, bf16, 132, cap, kv_fp8=True)["maxnreg"] is None, cap
    assert cfg(64, 4096, 2048, bf16, 132, (9, 0), kv_fp8=True)["maxnreg"] is None  # dequantised
    assert cfg(16, 4096, 2048, bf16, 132, (9, 0))["maxnreg"] is None  # 16-bit cache


def test_fp8_32_head_tiles(smla):
    """17-32 heads on an fp8_ds_mla cache: the codes kernel in 32-head x 32-row tiles on 4 warps
    (no register cap) once the grid holds more than one wave of programs, the dequantised 64-head
    tile up to one wave (H200, 32 heads: 160 tokens 327 vs 400 us; 132 tokens 241 vs 211 us), the
    16-head split tiles for a few tokens; the 16-bit cache keeps its 32-head tile throughout."""
    cfg, bf16 = smla._config_for, torch.bfloat16
    for H in (20, 32):
        for T in (133, 160, 4096):
            got = cfg(H, T, 2048, bf16, 132, (9, 0), kv_fp8=True)
            assert not got["FP8_DEQUANT"], (H, T)
            assert (got["BLOCK_H"], got["BLOCK_N"], got["num_warps"], got["num_stages"],
                    got["maxnreg"], got["num_splits"]) == (32, 32, 4, 2, None, 1), (H, T)
        for T in (64, 132):
            got = cfg(H, T, 2048, bf16, 132, (9, 0), kv_fp8=True)
            assert got["FP8_DEQUANT"] and got["BLOCK_H"] == 64, (H, T)
        assert cfg(H, 4, 2048, bf16, 132, (9, 0), kv_fp8=True)["BLOCK_H"] == 16
        for T in (64, 4096):
            assert cfg(H, T, 2048, bf16, 132, (9, 0))["BLOCK_H"] == 32, (H, T)
    # the ~99 KB parts: the same tile (compiled for sm89: 93 KB of shared memory)
    got = cfg(32, 4096, 2048, bf16, 128, (8, 9), kv_fp8=True)
    assert not got["FP8_DEQUANT"] and (got["BLOCK_H"], got["BLOCK_N"], got["num_stages"]) == (
        32, 32, 2)


def test_tiles_without_wgmma(smla):
    """GPUs without wgmma (sm80-89, sm120/121: Triton's dots are mma.sync there) run 33+ heads in
    32-head tiles and the fp8 cache's 17+ head tiles through the codes kernel: on the H200 with
    the dots compiled as mma.sync and the table as sm80 picks it, 64 heads x 4096 tokens bf16 6200
    vs 11118 us for the 64-head tile, fp8 9273 vs 237329 us for the pinned dequantising 64-head
    tile (ptxas gives pinned tiles of more than 16 heads 32 registers and a KB-sized stack there,
    so none is pinned).  The ~99 KB parts keep two or more stages (pipelined tiles need less shared
    memory than one-stage ones): emulated sm89, 32 x 4096 bf16 3905 vs 8098 us.  sm90 keeps its
    64-head tiles, pinned; sm100/103 pin nothing."""
    cfg, bf16 = smla._config_for, torch.bfloat16
    for cap, sms in (((8, 0), 108), ((8, 6), 82), ((8, 9), 128), ((12, 0), 188), ((12, 1), 48)):
        assert smla._mma_sync(cap), cap
        for H in (17, 32, 33, 64, 128):
            for T in (1, 4, 64, 132, 1024, 4096):
                for fp8 in (False, True):
                    got = cfg(H, T, 2048, bf16, sms, cap, kv_fp8=fp8)
                    key = (cap, H, T, fp8)
                    assert got["BLOCK_H"] <= 32 and got["num_stages"] >= 2, key
                    if fp8 and got["BLOCK_H"] > 16:
                        assert not got["FP8_DEQUANT"], key
                    pinned = fp8 and got["FP8_DEQUANT"] and smla._pin_dequant(
                        cap, got["num_stages"], got["BLOCK_H"])
                    assert not pinned or got["BLOCK_H"] == 16, key
        assert cfg(64, 4096, 2048, bf16, sms, cap)["BLOCK_H"] == 32
        for block_h in (32, 64):
            assert not smla._pin_dequant(cap, 2, block_h), (cap, block_h)
        assert smla._pin_dequant(cap, 2, 16) and not smla._pin_dequant(cap, 1, 16)
    for cap in ((9, 0), None):
        assert not smla._mma_sync(cap)
        assert cfg(64, 4096, 2048, bf16, 132, cap)["BLOCK_H"] == 64
        assert smla._pin_dequant(cap, 2, 64)
    for cap in ((10, 0), (10, 3)):
        assert cfg(64, 4096, 2048, bf16, 148, cap)["BLOCK_H"] == 64
        assert not smla._pin_dequant(cap, 2, 16)


def test_16bit_tiles_per_triton(smla, monkeypatch):
    """Triton >= 3.7 takes the 16-bit kernel's own rows (<= 16 heads: 64-row tiles on 4 warps, long
    and short grids; 32 heads: 3 stages; both measured on the H200 under 3.8), Triton 3.6 the
    table's; the fp8 cache's tiles and 33+ heads are the same under both."""
    cfg, bf16 = smla._config_for, torch.bfloat16
    pick = lambda c: (c["BLOCK_H"], c["BLOCK_N"], c["num_warps"], c["num_stages"])  # noqa: E731
    cells = [(16, 4096), (8, 256), (32, 1024), (64, 1024)]
    got = {}
    for new in (False, True):
        monkeypatch.setattr(smla, "_triton_3_7", lambda new=new: new)
        got[new] = {(H, T, fp8): pick(cfg(H, T, 2048, bf16, 132, (9, 0), kv_fp8=fp8))
                    for H, T in cells for fp8 in (False, True)}
    assert got[False][(16, 4096, False)] == (16, 32, 4, 2)
    assert got[False][(8, 256, False)] == (16, 64, 8, 2)
    assert got[False][(32, 1024, False)] == (32, 64, 4, 2)
    assert got[True][(16, 4096, False)] == got[True][(8, 256, False)] == (16, 64, 4, 2)
    assert got[True][(32, 1024, False)] == (32, 64, 4, 3)
    for key in got[False]:
        if key[2] or key[0] > 32:
            assert got[True][key] == got[False][key], key


def test_kernel_fp8_flat_and_split_q(smla):
    """[num_slots, 656] cache, query given as (q_nope, q_pe) strided views,
    split-K; a BLOCK_DV other than the whole latent width is refused (the fp8
    kernel always covers the four 128-value tiles)."""
    cache, deq, filled = make_cache(1, 64, 40, seed=7)
    flat = cache.view(64, ROW)
    q, slots = make_query(2, 16, 32, filled, seed=8)
    T, H = 2, 16
    out = torch.empty((T, H, R), dtype=torch.float16)
    smla.sparse_mla_fwd(q[..., :R], flat, slots, SCALE, out=out, q_pe=q[..., R:],
                        kv_cache_dtype="fp8_ds_mla", fp8_hw=False, num_splits=2)
    err = rel_err(out, reference_sparse_mla(q, deq, slots, SCALE))
    assert err < FP16_BOUND, err
    with pytest.raises(AssertionError):
        smla.sparse_mla_fwd(q, flat, slots, SCALE, kv_cache_dtype="fp8_ds_mla",
                            config=dict(BLOCK_DV=256))


def test_kernel_fp8_uses_scales_and_rope(smla):
    """The kernel must read the scales and the 16-bit rope: corrupting either
    field of the gathered slots changes the output."""
    cache, deq, filled = make_cache(2, 16, 20, seed=3)
    q, slots = make_query(2, 16, 16, filled, seed=4, hole_frac=0.0)
    base = smla.sparse_mla_fwd(q, cache, slots, SCALE, kv_cache_dtype="fp8_ds_mla")
    for lo, hi in ((R, R + 16), (R + 16, ROW)):
        bad = cache.clone()
        flat = bad.view(-1, ROW)
        used = slots[slots >= 0].long().unique()
        field = flat[used, lo:hi]
        if lo == R:  # scales x 2
            flat[used, lo:hi] = (field.contiguous().view(torch.float32) * 2).view(torch.uint8)
        else:  # rope x 4
            flat[used, lo:hi] = (field.contiguous().view(torch.float16) * 4).view(torch.uint8)
        other = smla.sparse_mla_fwd(q, bad, slots, SCALE, kv_cache_dtype="fp8_ds_mla")
        assert rel_err(other, base.double()) > 1e-2


def test_kernel_fp8_rejects_bad_layouts(smla):
    cache, _, filled = make_cache(1, 16, 8, seed=1)
    q, slots = make_query(1, 16, 16, filled, seed=2)
    with pytest.raises(AssertionError):  # 576-wide rows are not fp8_ds_mla
        smla.sparse_mla_fwd(q, torch.zeros(16, D, dtype=torch.uint8), slots, SCALE,
                            kv_cache_dtype="fp8_ds_mla")
    with pytest.raises(AssertionError):  # fp32 queries: the rope is 16-bit
        smla.sparse_mla_fwd(q.float(), cache, slots, SCALE, kv_cache_dtype="fp8_ds_mla")
    with pytest.raises(AssertionError):  # a byte cache without the fp8 dtype string
        smla.sparse_mla_fwd(q, cache, slots, SCALE)


@lineproofs.replaced_on(v0_33_0=(
    "0.33.0's backend is a SparseMLACommonImpl hook with a new metadata builder; tests/test_backend_interpret.py"
    "::test_line_layer_proof runs its fp8_ds_mla cache through vLLM's MLA layer and cache writer"))
def test_backend_fp8_smoke(vllm_tree):
    """TRITON_MLA_SPARSE with fp8_ds_mla through vLLM's own classes (stand-ins
    for compiled modules): cache shape and page size, dtype canonicalisation,
    supports_combination, the fp16 force-MQA rule, and builder.build +
    forward_mqa vs float64, decodes alone and with long prefills read through
    a 16-bit copy of their context (tests/backend_fp8_interpret_smoke.py, own
    process)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent / "backend_fp8_interpret_smoke.py"
    env = dict(os.environ, TRITON_INTERPRET="1", VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([sys.executable, str(script), str(vllm_tree)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in ("spec", "canon", "combo", "force_mqa", "forward", "prefill"):
        assert f"ok {name}" in proc.stdout, proc.stdout[-2000:]
    for key in ("rel_err", "prefill_rel_err"):
        m = re.search(rf"^{key} (\S+)", proc.stdout, re.M)
        assert m and float(m.group(1)) < FP16_BOUND, proc.stdout[-2000:]
