"""Commit "[Kernel] Portable Triton sparse attention for DeepSeek-V4": the clone's
tests/kernels/attention/test_triton_sparse_mla_dsv4.py (byte-identical to the 0.26.0 line's) on
the CPU under the Triton interpreter, float16, the cases the 0.26.0 line's CPU proof runs
(tests/test_series_kernel_tests.py there), and a check that the test fails on a kernel that
drops the attention sink."""
import pytest
import torch

from conftest import load_tree_test

F16 = torch.float16


@pytest.fixture(scope="module")
def dsv4():
    return load_tree_test("tests/kernels/attention/test_triton_sparse_mla_dsv4.py", "dsv4")


@pytest.mark.parametrize("layer,heads,kw", [
    ("c4", 16, dict(num_tokens=2, window=64, topk=128)),
    ("c128", 64, dict(num_tokens=1, window=64, c128_len=256)),
], ids=["c4-16h", "c128-64h"])
def test_dsv4_decode(dsv4, layer, heads, kw):
    dsv4.test_decode(heads, layer, F16, **kw)


@pytest.mark.parametrize("sink", ["mixed", "-inf"])
def test_dsv4_empty_lists(dsv4, sink):
    dsv4.test_decode_empty_lists(sink)


def test_dsv4_block_edges_and_splits(dsv4):
    dsv4.test_decode_block_boundaries(2)
    dsv4.test_decode_splits_agree(num_heads=16, max_splits=3)


def test_dsv4_prefill(dsv4):
    dsv4.test_prefill(16, F16, num_tokens=3, topk=64, window=64, num_splits=2)


def test_dsv4_tests_can_fail(dsv4):
    """The V4 attention test rejects a kernel that drops the attention sink."""
    real = dsv4.sparse_mla_dsv4_decode

    def no_sink(*a, **kw):
        kw["attn_sink"] = None
        return real(*a, **kw)

    dsv4.sparse_mla_dsv4_decode = no_sink
    try:
        with pytest.raises(AssertionError):
            dsv4.test_decode(16, "c4", F16, num_tokens=2, window=64, topk=128)
    finally:
        dsv4.sparse_mla_dsv4_decode = real


@pytest.mark.parametrize("sms", [16, 132])
def test_dsv4_plan(dsv4, sms):
    dsv4.test_plan_head_blocks_and_scratch_bound(sms)
