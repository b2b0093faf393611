"""Element-wise fp8 e4m3fn decode through the series' Triton helpers
(vllm/v1/attention/ops/triton_fp8_e4m3.py of a tree), for the tests:
``decoder(tree)`` returns ``decode(codes, packed=False)`` -> float32 values
(``packed``: the four-codes-per-PTX-sequence variant, GPU only)."""
from __future__ import annotations

import importlib
from pathlib import Path

import torch
import triton
import triton.language as tl

from sparse_mla_reference import provide_ops_package

_e4m3 = None  # the tree's triton_fp8_e4m3 module, set by decoder()


@triton.jit
def _decode_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, PACKED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    bits = tl.load(src_ptr + offs, mask=m, other=0)
    if PACKED:
        h = _e4m3.e4m3_to_f16_div256_packed(bits)
    else:
        h = _e4m3.e4m3_to_f16_div256(bits)
    tl.store(dst_ptr + offs, h.to(tl.float32) * 256.0, mask=m)


def load(tree: Path):
    """The tree's helper module, imported as vllm.v1.attention.ops.triton_fp8_e4m3."""
    provide_ops_package(Path(tree))
    return importlib.import_module("vllm.v1.attention.ops.triton_fp8_e4m3")


def decoder(tree: Path):
    global _e4m3
    _e4m3 = load(tree)

    def decode(codes: torch.Tensor, packed: bool = False) -> torch.Tensor:
        bits = codes.view(torch.uint8).contiguous().reshape(-1)
        out = torch.empty(bits.shape, dtype=torch.float32, device=bits.device)
        if bits.numel():
            _decode_kernel[(triton.cdiv(bits.numel(), 1024),)](bits, out, bits.numel(),
                                                              BLOCK=1024, PACKED=packed)
        return out.reshape(codes.shape)

    return decode
