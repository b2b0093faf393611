"""The fused deepseek_v32 kernels (fused_norm_rope, fused_q) on the software
e4m3 encode, under Triton's interpreter: their fp8 bytes equal torch's
float8_e4m3fn conversion of the kernels' own float32 intermediates, bit for
bit. Runs the checks of the clone's vLLM test
tests/kernels/test_fused_deepseek_v32_fp8_encode.py on the CPU (device "cpu":
fp8_e4m3_hw(cpu) is False, so the launchers pick the software encode)."""
import pytest

import kernels.test_fused_deepseek_v32_fp8_encode as t
from vllm.models.deepseek_v32.common import kernels as K
from vllm.v1.attention.ops.triton_fp8_e4m3 import fp8_e4m3_hw


def test_cpu_takes_the_software_encode():
    import torch

    assert fp8_e4m3_hw(torch.device("cpu")) is False
    assert K.fp8_e4m3_hw is fp8_e4m3_hw


@pytest.mark.parametrize("mla_dtype", ["fp8", "fp8_ds_mla"])
def test_fused_norm_rope_codes_bit_exact(mla_dtype):
    t.check_fused_norm_rope_codes("cpu", mla_dtype)


def test_fused_q_codes_bit_exact():
    t.check_fused_q_codes("cpu")


def test_glm52_index_cache_skip_layer():
    """GLM-5.2's IndexCache layers (indexer=None): no top-k clear, fp8 MLA
    cache and query bit-exact on the software encode."""
    t.check_index_cache_skip_layer("cpu")
