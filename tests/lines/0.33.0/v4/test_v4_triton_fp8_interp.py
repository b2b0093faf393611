"""Commit "[Kernel] DeepSeek-V4 Triton ops: software fp8 e4m3 below sm89": the clone's
tests/kernels/test_deepseek_v4_triton_fp8.py on the CPU under the Triton interpreter, with the
software e4m3 path forced (the interpreter is a "GPU" without fp8 conversions: fp8_e4m3_hw is
False for CPU tensors), and a check that the test fails when the encoder is broken."""
import pytest
import triton
import triton.language as tl

from conftest import load_tree_test
from vllm.v1.attention.ops.triton_fp8_e4m3 import f32_to_e4m3


@pytest.fixture(scope="module")
def fp8():
    return load_tree_test("tests/kernels/test_deepseek_v4_triton_fp8.py", "v4_fp8")


@pytest.mark.parametrize("block_size", [16, 64])
def test_quantize_and_insert_k_cache(fp8, monkeypatch, block_size):
    fp8.test_quantize_and_insert_k_cache(monkeypatch, block_size)


@pytest.mark.parametrize(
    "seq_lens,gather_lens,offset", [([9, 23], None, 0), ([19, 70], [6, 40], 5)]
)
def test_dequantize_and_gather_k_cache(fp8, monkeypatch, seq_lens, gather_lens, offset):
    fp8.test_dequantize_and_gather_k_cache(monkeypatch, seq_lens, gather_lens, offset)


def test_fused_indexer_q_rope_quant(fp8, monkeypatch):
    fp8.test_fused_indexer_q_rope_quant(monkeypatch)


@pytest.mark.parametrize("tma_aligned_scales", [False, True])
def test_fused_inv_rope_fp8_quant(fp8, monkeypatch, tma_aligned_scales):
    fp8.test_fused_inv_rope_fp8_quant(monkeypatch, tma_aligned_scales)


@pytest.mark.parametrize(
    "head,ratio,two_stage", [(512, 4, False), (512, 128, False), (512, 128, True), (128, 4, False)]
)
def test_compress_norm_rope_store(fp8, monkeypatch, head, ratio, two_stage):
    fp8.test_compress_norm_rope_store(monkeypatch, head, ratio, two_stage)


@triton.jit
def _truncating_encode(x, FP8_HW: tl.constexpr):
    """e4m3 codes of x rounded toward zero (the low mantissa bits dropped)."""
    bits = x.to(tl.int32, bitcast=True) & ~0xFFFFF
    return f32_to_e4m3(bits.to(tl.float32, bitcast=True))


def test_the_insert_test_fails_on_a_wrong_encoder(fp8, monkeypatch):
    """The cache writer with its codes rounded toward zero (not to nearest even) fails."""
    from vllm.models.deepseek_v4.common.ops import cache_utils

    monkeypatch.setattr(cache_utils, "e4m3_encode", _truncating_encode)
    with pytest.raises(AssertionError):
        fp8.test_quantize_and_insert_k_cache(monkeypatch, 16)


@pytest.fixture(scope="module")
def fallback():
    return load_tree_test("tests/kernels/test_deepseek_v4_cutedsl_fallback.py", "fallback")


@pytest.mark.parametrize("ratio", [4, 128])
def test_compressor_forward_without_cutedsl(fallback, monkeypatch, ratio):
    """Commit "[Model] DeepSeek-V4: compressor and gathers without CuTe DSL": the head-512
    DeepseekCompressor.forward on the Triton path against the float64 reference."""
    fallback.DEVICE = "cpu"
    fallback.test_compressor_forward_without_cutedsl(monkeypatch, ratio)
