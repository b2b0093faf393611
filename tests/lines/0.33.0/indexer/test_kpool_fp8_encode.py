"""GLM-5.3-Flash's kpool Triton kernels (fwht128_quant_fp8 for the index
query, the pooled-key cache writers of prefill and decode) on the software
e4m3 encode, under Triton's interpreter: their fp8 bytes equal torch's
float8_e4m3fn conversion of the kernels' own float32 intermediates, bit for
bit, with ue8m0 scales. Runs the checks of the clone's vLLM test
tests/kernels/test_glm5next_kpool_fp8_encode.py on the CPU (device "cpu":
fp8_e4m3_hw(cpu) is False, so the launchers pick the software encode).

One difference from a GPU, given to the checks: Triton's interpreter casts
float32 to bfloat16 by truncating the mantissa (triton/runtime/interpreter.py,
cast_impl without a rounding mode), a GPU rounds to nearest even; the
kernels round their rotated keys to bfloat16 before quantising."""
import torch

import kernels.test_glm5next_kpool_fp8_encode as t
from vllm.models.glm5next.nvidia.ops import kpool_compress as K
from vllm.v1.attention.ops.triton_fp8_e4m3 import fp8_e4m3_hw


def bf16_truncate(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 -> float32 as the interpreter casts (toward zero)."""
    return (x.float().view(torch.int32) & -65536).view(torch.float32)


def test_cpu_takes_the_software_encode():
    assert fp8_e4m3_hw(torch.device("cpu")) is False
    assert K.fp8_e4m3_hw is fp8_e4m3_hw


def test_fwht128_quant_codes_bit_exact():
    t.check_fwht_codes("cpu", bf16_truncate)


def test_kpool_compress_codes_bit_exact():
    """Prefill writer: masked pools untouched, pools across pages, and the
    compressed-output variant."""
    t.check_compress_codes("cpu", bf16_truncate)


def test_kpool_decode_codes_bit_exact():
    """Decode writer: a pool completed from seeded tail-ring tokens and one
    completed within the step."""
    t.check_decode_codes("cpu", bf16_truncate)


def test_a_wrong_code_is_caught():
    """The check fails when one code is off by one (it compares bytes)."""
    q, q_fp8, q_scale = t.run_fwht("cpu")
    bad = q_fp8.view(torch.uint8).clone()
    bad[3, 17] ^= 1
    try:
        t.check_codes(bad, q_scale, t.rotate(q, bf16_truncate))
    except AssertionError:
        return
    raise AssertionError("a flipped code passed")
