"""Commit "[Attention] DeepSeek-V4: sparse MLA attention class on the Triton kernels": the
clone's tests/kernels/attention/test_deepseek_v4_triton_attention.py::test_forward_mqa (a mixed
decode + chunked-prefill batch through DeepseekV4TritonAttention.forward_mqa: 0.33.0's own
prefill gather, top-k combine and workspace reservation, the Triton kernels, the fp8 caches)
on the CPU under the interpreter, float16 (the test's GPU dtype is bfloat16), and a check that
it fails when the layer drops the attention sinks."""
import pytest
import torch

from conftest import load_tree_test


@pytest.fixture(scope="module")
def attn():
    kernel_tests = load_tree_test(
        "tests/kernels/attention/test_triton_sparse_mla_dsv4.py", "dsv4")
    kernel_tests.DEVICE = "cpu"
    mod = load_tree_test(
        "tests/kernels/attention/test_deepseek_v4_triton_attention.py", "attn")
    return mod


@pytest.mark.parametrize("layer_kind", ["swa", "c4", "c128"])
@pytest.mark.parametrize("num_heads", [8, 6])
@pytest.mark.parametrize("num_sms", [None, 8], ids=["no-split", "split-k"])
def test_forward_mqa(attn, monkeypatch, layer_kind, num_heads, num_sms):
    attn.test_forward_mqa(monkeypatch, layer_kind, num_heads, num_sms, dtype=torch.float16)


def test_forward_mqa_fails_without_sinks(attn, monkeypatch):
    from vllm.models.deepseek_v4.nvidia import triton_sparse

    real = triton_sparse.sparse_mla_dsv4_decode

    def no_sink(*args, **kwargs):
        kwargs["attn_sink"] = None
        return real(*args, **kwargs)

    monkeypatch.setattr(triton_sparse, "sparse_mla_dsv4_decode", no_sink)
    with pytest.raises(AssertionError):
        attn.test_forward_mqa(monkeypatch, "c4", 8, None, dtype=torch.float16)
