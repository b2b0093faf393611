"""CPU tests of the split-score tiles (SPLIT_SCORES) under TRITON_INTERPRET=1.

On sm90 Triton drives a 64-row tile on 8 warps with wgmma, and gives a dot
whose result reaches another dot [num_warps, 1] warps: both warpgroups would
compute the whole score tile.  The kernels' 64-row 8-warp tiles there run the
softmax behind a branch that is always taken (_softmax_step_split_scores), so
that each warpgroup computes half of the score columns.  Which tiles do
(_split_scores: sm90 and the interpreter, 64 rows, 8 warps) and that the
branch computes the attention: the DSA kernel's 16-bit and dequantised fp8
paths (rope and NoPE, split-K, a masked head block, holes, an empty row) and
DeepSeek-V4's prefill and fp8 decode, each against float64.  The branch's
other arm returns the raw scores: taking it fails every attention case here.
"""
from __future__ import annotations

import importlib.util
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from sparse_mla_reference import (  # noqa: E402
    load_sparse_mla_module,
    provide_ops_package,
    reference_sparse_mla,
    rel_err,
)
from test_fp8_kv_interpret import make_cache, make_query, run_and_check  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

SPLIT_TILE = dict(BLOCK_H=64, BLOCK_N=16, num_warps=8, num_stages=2)
D, DV, SCALE = 576, 512, 576 ** -0.5
DSV4_TEST = "tests/kernels/attention/test_triton_sparse_mla_dsv4.py"


@pytest.fixture(scope="module")
def smla(vllm_tree):
    return load_sparse_mla_module(vllm_tree, interpret=True)


@pytest.fixture(scope="module")
def dsv4_test(vllm_tree):
    """The series' V4 kernel test module (its reference and input builders), on the CPU."""
    provide_ops_package(vllm_tree)
    spec = importlib.util.spec_from_file_location("smla_split_dsv4", vllm_tree / DSV4_TEST)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.DEVICE = "cpu"
    return mod


def test_split_scores_rule(smla):
    """sm90 (and the interpreter, which counts as sm90) 64-row tiles on 8 warps only."""
    for cap in (None, (9, 0)):
        assert smla._split_scores(cap, 64, 8)
        for block_h, warps in ((64, 4), (32, 4), (32, 8), (16, 4), (16, 8)):
            assert not smla._split_scores(cap, block_h, warps), (cap, block_h, warps)
    for cap in ((8, 0), (8, 6), (8, 9), (10, 0), (10, 3), (12, 0), (12, 1)):
        assert not smla._split_scores(cap, 64, 8), cap
    # the launch table's 33+ head tile on sm90 is one
    cfg = smla._config_for(64, 4096, 2048, torch.bfloat16, 132, (9, 0))
    assert smla._split_scores((9, 0), cfg["BLOCK_H"], cfg["num_warps"])


@pytest.mark.parametrize("H,num_splits", [(64, 1), (128, 3), (40, 2)])
@pytest.mark.parametrize("nope", [False, True], ids=["rope", "nope"])
def test_dsa_16bit(smla, H, num_splits, nope):
    g = torch.Generator().manual_seed(H + num_splits)
    T, K, slots_n = 3, 40, 300
    d = DV if nope else D
    q = torch.randn(T, H, d, generator=g).half()
    kv = torch.randn(slots_n, d, generator=g).half()
    slots = torch.randint(0, slots_n, (T, K), generator=g, dtype=torch.int32)
    slots[torch.rand(T, K, generator=g) < 0.3] = -1
    slots[1] = -1
    out = torch.full((T, H, DV), float("nan"), dtype=torch.float16)
    smla.sparse_mla_fwd(q, kv, slots, SCALE, out=out, num_splits=num_splits,
                        config=SPLIT_TILE)
    assert (out[1] == 0).all()
    assert rel_err(out, reference_sparse_mla(q, kv, slots, SCALE)) < 1e-3


@pytest.mark.parametrize("hw", [False, True], ids=["software", "hardware"])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_dsa_fp8_dequantised(smla, hw, num_splits):
    cache, deq, filled = make_cache(4, 16, 50, seed=11, block_pad=48)
    q, slots = make_query(3, 40, 40, filled, seed=12, empty_rows=(1,))
    run_and_check(smla, q, cache, deq, slots, num_splits=num_splits, fp8_hw=hw,
                  config=dict(SPLIT_TILE, FP8_DEQUANT=True))


@pytest.mark.parametrize("H,num_splits", [(64, None), (128, 3)])
def test_dsv4_prefill(dsv4_test, H, num_splits):
    dsv4_test.test_prefill(H, torch.float16, num_splits=num_splits, config=SPLIT_TILE)


@pytest.mark.parametrize("layer,num_splits", [("c4", None), ("swa", 3)])
def test_dsv4_fp8_decode(dsv4_test, layer, num_splits):
    dsv4_test.test_decode(64, layer, torch.float16, num_splits=num_splits,
                          config=dict(BLOCK_H=64, BLOCK_N=32, num_warps=8))


class _Spy:
    """A @triton.jit function whose launches record their SPLIT_SCORES and PREFETCH_LINES (then
    launched without the prefetch, PTX that the interpreter cannot run)."""

    def __init__(self, fn):
        self.fn, self.seen, self.lines = fn, [], []

    def __getitem__(self, grid):
        launch = self.fn[grid]

        def run(*args, **kwargs):
            self.seen.append(kwargs.get("SPLIT_SCORES"))
            if "PREFETCH_LINES" in kwargs:
                self.lines.append(kwargs["PREFETCH_LINES"])
                kwargs["PREFETCH_LINES"] = 0
            return launch(*args, **kwargs)

        return run

    def __getattr__(self, name):
        return getattr(self.fn, name)


def test_prefetch_rule(smla):
    """The L2 prefetch of the next tile's rows goes with the split-score tiles, on NVIDIA GPUs
    (PTX; not the interpreter): one prefetch per 128-byte line of a cache row."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert smla._prefetch_lines(True, 2 * 576, cuda) == 9
    assert smla._prefetch_lines(True, 2 * 512, cuda) == 8  # NoPE 16-bit rows
    assert smla._prefetch_lines(True, smla.fp8_ds_mla_row_bytes(), cuda) == 6  # 656 bytes
    assert smla._prefetch_lines(False, 2 * 576, cuda) == 0
    assert smla._prefetch_lines(True, 2 * 576, cpu) == 0


def test_launchers_pass_the_rule(smla, dsv4_test, monkeypatch):
    """Each launcher gives its kernel _split_scores of the tile it launches: the 64-row 8-warp
    tile splits, the plans' other tiles do not; the DSA launcher also its _prefetch_lines (as on
    an NVIDIA GPU: 9 lines of the 1152-byte fp16 rows for the split tile, none elsewhere)."""
    spy = _Spy(smla._sparse_mla_fwd_kernel)
    monkeypatch.setattr(smla, "_sparse_mla_fwd_kernel", spy)
    rule = smla._prefetch_lines
    monkeypatch.setattr(smla, "_prefetch_lines",
                        lambda split, row_bytes, device: rule(split, row_bytes, torch.device("cuda")))
    g = torch.Generator().manual_seed(0)
    q, kv = torch.randn(2, 64, D, generator=g).half(), torch.randn(64, D, generator=g).half()
    slots = torch.randint(0, 64, (2, 16), generator=g, dtype=torch.int32)
    smla.sparse_mla_fwd(q, kv, slots, SCALE, config=SPLIT_TILE)
    smla.sparse_mla_fwd(q[:, :32], kv, slots, SCALE, config=dict(SPLIT_TILE, BLOCK_H=32))
    smla.sparse_mla_fwd(q, kv, slots, SCALE, config=dict(SPLIT_TILE, num_warps=4))
    assert spy.seen == [True, False, False]
    assert spy.lines == [9, 0, 0]
    ops = dsv4_test.sparse_mla_dsv4_prefill.__globals__  # the V4 kernel module's namespace
    for name in ("_sparse_mla_dsv4_kernel", "_sparse_mla_dsv4_fp8_kernel"):
        monkeypatch.setitem(ops, name, _Spy(ops[name]))
    dsv4_test.test_prefill(32, torch.float16)  # the plan: a 32-head tile on 4 warps
    dsv4_test.test_prefill(64, torch.float16)  # the plan: one 64-head tile on 8 warps
    dsv4_test.test_prefill(64, torch.float16, config=dict(SPLIT_TILE, num_warps=4))
    dsv4_test.test_prefill(64, torch.float16, config=SPLIT_TILE)
    assert ops["_sparse_mla_dsv4_kernel"].seen == [False, True, False, True]
    dsv4_test.test_decode(64, "swa", torch.float16, config=dict(BLOCK_H=64, BLOCK_N=32, num_warps=8))
    assert set(ops["_sparse_mla_dsv4_fp8_kernel"].seen) == {True}
