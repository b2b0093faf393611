"""The series' own vLLM-style kernel tests (each in its kernel's patch:
tests/kernels/attention/test_triton_{sparse_mla,dsa_indexer}.py and the
DeepSeek-V4 attention's test_triton_sparse_mla_dsv4.py, in the
patched tree), run on the CPU under the Triton interpreter: each module is
loaded from the tree with its DEVICE set to "cpu" and its test functions are
called directly (their CUDA skip marks only apply under pytest collection).
bfloat16 is left out: the interpreter has no bfloat16 arithmetic."""
from __future__ import annotations

import importlib.util
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from sparse_mla_reference import provide_ops_package  # noqa: E402

REL = "tests/kernels/attention/{}.py"


def _load(tree, name):
    path = tree / REL.format(name)
    if not path.is_file():
        pytest.fail(f"{REL.format(name)} is missing in the vLLM tree {tree} (the series adds it with its kernel)")
    provide_ops_package(tree)
    spec = importlib.util.spec_from_file_location(f"smla_series_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.DEVICE = "cpu"
    return mod


@pytest.fixture(scope="module")
def attn(vllm_tree):
    return _load(vllm_tree, "test_triton_sparse_mla")


@pytest.fixture(scope="module")
def dsv4(vllm_tree):
    return _load(vllm_tree, "test_triton_sparse_mla_dsv4")


@pytest.fixture(scope="module")
def indexer(vllm_tree):
    return _load(vllm_tree, "test_triton_dsa_indexer")


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_ds_mla"])
@pytest.mark.parametrize("num_heads,num_tokens", [(8, 1), (64, 5)])
def test_series_sparse_mla_fwd(attn, kv_cache_dtype, num_heads, num_tokens):
    # fp8_hw=False: the software e4m3 decode, what the CPU (and sm80/86) run
    attn.test_sparse_mla_fwd(kv_cache_dtype, num_heads, num_tokens, torch.float16, False, topk=64)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_ds_mla"])
@pytest.mark.parametrize("num_heads,num_tokens", [(8, 1), (64, 3)])
def test_series_sparse_mla_fwd_nope(attn, kv_cache_dtype, num_heads, num_tokens):
    """NoPE (GLM-5.3-Flash, head 512): the pooled top-k buffer at top-k 128 (256 wide)."""
    attn.test_sparse_mla_fwd_nope(kv_cache_dtype, num_heads, num_tokens, torch.float16, topk=128)


def test_series_convert(attn):
    attn.test_convert_req_local_to_slots()


def test_series_tests_can_fail(attn):
    """The series' sparse-MLA test rejects a kernel that ignores the holes."""
    real = attn.sparse_mla_fwd

    def no_holes(q, kv, slots, *a, **kw):
        return real(q, kv, slots.clamp(min=0), *a, **kw)

    attn.sparse_mla_fwd = no_holes
    try:
        with pytest.raises(AssertionError):
            attn.test_sparse_mla_fwd("auto", 8, 3, torch.float16, False, topk=64)
    finally:
        attn.sparse_mla_fwd = real


@pytest.mark.parametrize("fp8_mma", [False, True], ids=["software", "fp8-mma"])
def test_series_mqa_logits(indexer, fp8_mma):
    indexer.test_mqa_logits(fp8_mma)


def _params(fn, name):
    """The values a series test parametrizes `name` with."""
    return next(m.args[1] for m in fn.pytestmark if m.name == "parametrize" and m.args[0] == name)


@pytest.mark.parametrize("fp8_mma", [False, True], ids=["software", "fp8-mma"])
@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("grid", [0, 1], ids=["plan", "uneven"])
def test_series_paged_mqa_logits(indexer, fp8_mma, next_n, grid):
    """With each launch config the series test has: the plan, and programs sharing a
    context unevenly."""
    config = _params(indexer.test_paged_mqa_logits, "config")[grid]
    indexer.test_paged_mqa_logits(fp8_mma, next_n, config)


F16 = torch.float16


@pytest.mark.parametrize("layer,heads,kw", [
    ("c4", 16, dict(num_tokens=2, window=64, topk=128)),
    ("c128", 64, dict(num_tokens=1, window=64, c128_len=256)),
], ids=["c4-16h", "c128-64h"])
def test_series_dsv4_decode(dsv4, layer, heads, kw):
    dsv4.test_decode(heads, layer, F16, **kw)


@pytest.mark.parametrize("sink", ["mixed", "-inf"])
def test_series_dsv4_empty_lists(dsv4, sink):
    dsv4.test_decode_empty_lists(sink)


def test_series_dsv4_block_edges_and_splits(dsv4):
    dsv4.test_decode_block_boundaries(2)
    dsv4.test_decode_splits_agree(num_heads=16, max_splits=3)


def test_series_dsv4_unaligned_cache(dsv4):
    dsv4.test_unaligned_cache_rejected()


def test_series_dsv4_prefill(dsv4):
    dsv4.test_prefill(16, F16, num_tokens=3, topk=64, window=64, num_splits=2)


def test_series_dsv4_tests_can_fail(dsv4):
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
def test_series_dsv4_plan(dsv4, sms):
    dsv4.test_plan_head_blocks_and_scratch_bound(sms)
    dsv4.test_fp8_plan(sms)
    for capability in (None, (8, 0), (8, 6), (8, 9), (9, 0), (12, 0)):
        dsv4.test_prefill_row_tiles(capability)


def test_series_unknown_config_keys(attn, dsv4):
    """Each kernel wrapper rejects a launch-config key it does not read (the indexer's
    test checks it after its own call, in test_series_mqa_logits)."""
    attn.test_unknown_config_key_rejected()
    dsv4.test_unknown_config_key_rejected()
