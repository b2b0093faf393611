"""Reference writer and dequantiser for vLLM's packed `fp8_ds_mla` KV cache.

Layout of one cache slot (656 bytes for DeepSeek-V3.2 / GLM-5), as vLLM
0.26.0's `concat_and_cache_mla(..., kv_cache_dtype="fp8_ds_mla")` writes it
(csrc/libtorch_stable/cache_kernels.cu, concat_and_cache_ds_mla_kernel):

  bytes [0, 512)    512 float8 e4m3fn codes of the latent vector kv_c
  bytes [512, 528)  4 float32 scales, scale i for latent values [128 i, 128 i + 128)
  bytes [528, 656)  the 64 rope values k_pe, stored in the input's 16-bit dtype

Per 128-value tile: scale = max(max|x| / 448, FLT_MIN) in float32, code =
e4m3fn(x / scale) rounded to nearest even and saturated to +-448
(`__NV_SATFINITE`); dequantised value = float(code) * scale.

Pure torch (CPU or GPU); shared by tests/test_fp8_kv_interpret.py,
tests/gpu/test_fp8_kv_gpu.py and bench/bench_fp8_kv.py.
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0
TILE = 128
FLT_MIN = torch.finfo(torch.float32).tiny  # 2**-126, the kernel's floor


def row_bytes(kv_lora_rank: int = 512, rope_dim: int = 64) -> int:
    return kv_lora_rank + 4 * (kv_lora_rank // TILE) + 2 * rope_dim


def quantize_ds_mla(kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 656] rows for kv_c [N, 512] and k_pe [N, 64] (16-bit)."""
    assert kv_c.dtype in (torch.float16, torch.bfloat16) and k_pe.dtype == kv_c.dtype
    N, R = kv_c.shape
    assert R % TILE == 0 and k_pe.shape[0] == N
    x = kv_c.float().view(N, R // TILE, TILE)
    amax = x.abs().amax(dim=-1)
    scale = torch.clamp(amax / FP8_MAX, min=FLT_MIN)  # float32, as the kernel
    codes = (x / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    out = torch.empty((N, row_bytes(R, k_pe.shape[1])), dtype=torch.uint8, device=kv_c.device)
    out[:, :R] = codes.view(N, R).view(torch.uint8)
    out[:, R:R + 4 * (R // TILE)] = scale.contiguous().view(torch.uint8).view(N, -1)
    out[:, R + 4 * (R // TILE):] = k_pe.contiguous().view(torch.uint8).view(N, -1)
    return out


def write_ds_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Reference of concat_and_cache_mla for "fp8_ds_mla": row t goes to slot
    slot_mapping[t] (block = slot // block_size); slots < 0 are skipped.
    kv_cache: uint8 [num_blocks, block_size, 656] (any block stride)."""
    assert kv_cache.dtype == torch.uint8 and kv_cache.dim() == 3
    bs = kv_cache.shape[1]
    keep = slot_mapping >= 0
    rows = quantize_ds_mla(kv_c[keep], k_pe[keep])
    s = slot_mapping[keep].long()
    kv_cache[s // bs, s % bs] = rows


def split_ds_mla(rows: torch.Tensor, rope_dtype: torch.dtype, kv_lora_rank: int = 512):
    """(codes uint8 [.., R], scales float32 [.., R/128], rope [.., P]) of rows [.., 656]."""
    lead = rows.shape[:-1]
    flat = rows.reshape(-1, rows.shape[-1])
    R, S = kv_lora_rank, kv_lora_rank // TILE
    codes = flat[:, :R]
    scales = flat[:, R:R + 4 * S].contiguous().view(torch.float32)
    rope = flat[:, R + 4 * S:].contiguous().view(rope_dtype)
    return (codes.reshape(*lead, R), scales.reshape(*lead, S), rope.reshape(*lead, -1))


def dequant_ds_mla(rows: torch.Tensor, rope_dtype: torch.dtype, kv_lora_rank: int = 512,
                   dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Dequantised [.., R + P] rows: code * scale (exact in float64) ++ rope."""
    codes, scales, rope = split_ds_mla(rows, rope_dtype, kv_lora_rank)
    vals = codes.view(torch.float8_e4m3fn).to(dtype)
    vals = vals * scales.to(dtype).repeat_interleave(TILE, dim=-1)
    return torch.cat([vals, rope.to(dtype)], dim=-1)


def latent_like_values(n: int, kv_lora_rank: int, dtype: torch.dtype, generator=None,
                       device="cpu", spread: int = 3) -> torch.Tensor:
    """Latent rows whose 128-value tiles differ in magnitude by up to
    2**+-spread (so that every tile gets its own scale)."""
    x = torch.randn(n, kv_lora_rank, generator=generator, device=device)
    e = torch.randint(-spread, spread + 1, (n, kv_lora_rank // TILE), generator=generator,
                      device=device)
    x = x * torch.exp2(e.float()).repeat_interleave(TILE, dim=1)
    return x.to(dtype)
